"""What the comparison scripts share: the FLOP count and printing a table."""


def flops(B, Sq, Sk, E, H):
    # 2 per multiply-add: four projections, Q·Kᵀ and weights·V (as Dims::forward_flops in C++).
    return 2 * E * E * B * (2 * Sq + 2 * Sk) + 4 * B * Sq * Sk * E


def publish(lines, out_path=None):
    text = "\n".join(lines)
    print(text)
    if out_path:
        with open(out_path, "w") as f:
            f.write(text + "\n")
