"""What the comparison scripts share: the FLOP count, timing a Python call and printing a
table."""

import statistics
import time


def flops(B, Sq, Sk, E, H):
    # 2 per multiply-add: four projections, Q·Kᵀ and weights·V (as Dims::forward_flops in C++).
    return 2 * E * E * B * (2 * Sq + 2 * Sk) + 4 * B * Sq * Sk * E


def publish(lines, out_path=None):
    text = "\n".join(lines)
    print(text)
    if out_path:
        with open(out_path, "w") as f:
            f.write(text + "\n")


def median_ms(call, min_time_s):
    """Median milliseconds of `call` over at least min_time_s and 3 calls, after 2 warm-up calls
    (kernel selection, allocator, thread pool)."""
    for _ in range(2):
        call()
    times = []
    start = time.perf_counter()
    while time.perf_counter() - start < min_time_s or len(times) < 3:
        t = time.perf_counter()
        call()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)
