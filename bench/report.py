"""Printing a comparison table and keeping a copy of it."""


def publish(lines, out_path=None):
    text = "\n".join(lines)
    print(text)
    if out_path:
        with open(out_path, "w") as f:
            f.write(text + "\n")
