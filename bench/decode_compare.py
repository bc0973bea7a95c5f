"""Decode steps in f32 and bf16 against PyTorch's step with a preallocated cache, from Python, in
one run: interleaved rounds, medians, both on the same threads, with the bytes floor.

    .venv-torch/bin/python bench/decode_compare.py --out build/bench/decode.md

Ours: mha.MultiheadAttention.decode, the module and its cache in the dtype (bf16: the weights
and the cache read in 16 bits), and a bf16 module over an int8 cache (a scale per token and
head), one new token per row; again over a paged cache (blocks of 16 in a shuffled pool,
python_peer.measure_paged_decode; no int8 form). PyTorch: F.linear + SDPA + F.linear with the
weights, the token and a preallocated cache in the dtype (bench/torch_peer.py; its bf16 step for
the int8 row, as it has no int8 cache). The floor: the bytes a step must read (weights 4·E² in
the module's dtype, cache 2·N·E in the cache's, and an int8 cache's scales 2·N·H·4) at the
streaming read measured in the same run (sdpa_compare.ceilings); × floor is ours over it, as in
compare.py.
"""
import argparse
import statistics

import torch

import python_peer
import sdpa_compare
import torch_peer

SHAPES = [(1, 512, 512, 8), (1, 2048, 512, 8), (1, 4096, 512, 8), (1, 8192, 512, 8),
          (1, 4096, 1024, 16)]
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}
# Our rows: name -> (module dtype, cache dtype or None for the module's).
ROWS = {"f32": (torch.float32, None), "bf16": (torch.bfloat16, None),
        "bf16, int8 cache": (torch.bfloat16, torch.int8)}


def floor_bytes(B, N, E, H, dtype, cache_dtype):
    """What a step must read: the four projections' weights, the cached keys and values, and an
    int8 cache's two f32 scales per token and head."""
    cache_dtype = cache_dtype or dtype
    scales = 2 * B * N * H * 4 if cache_dtype == torch.int8 else 0
    cache_size = 1 if cache_dtype == torch.int8 else torch.finfo(cache_dtype).bits // 8
    return 4 * E * E * torch.finfo(dtype).bits // 8 + 2 * B * N * E * cache_size + scales


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--min-time", type=float, default=0.2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--shapes", type=lambda text: [tuple(map(int, shape.split(",")))
                                                       for shape in text.split(";")],
                        default=SHAPES, help='"B,N,E,H;..." (default: %(default)s)')
    parser.add_argument("--out", help="also write the table here")
    args = parser.parse_args()
    stream_gbs = dict(sdpa_compare.ceilings(args))["streaming read GB/s"]
    lines = [f"Streaming read: {stream_gbs:.1f} GB/s. {args.threads} threads, medians of "
             f"{args.rounds} interleaved rounds.", "",
             "| B, N, E, H | ours | ours ms | floor ms | × floor | PyTorch ms | × PyTorch |"
             " ours × our f32 | paged ms | paged × floor |", "|---" * 10 + "|"]
    for shape in args.shapes:
        B, N, E, H = shape
        calls = {}
        for name, (dtype, cache_dtype) in ROWS.items():
            calls[("ours", name)] = lambda s=shape, t=dtype, c=cache_dtype: (
                python_peer.measure_decode(*s, args.threads, args.min_time, t, c))
        for name, dtype in DTYPES.items():
            calls[("torch", name)] = lambda s=shape, t=dtype: torch_peer.measure_decode(
                *s, args.threads, args.min_time, t)
            calls[("paged", name)] = lambda s=shape, t=dtype: python_peer.measure_paged_decode(
                *s, args.threads, args.min_time, t)
        samples = {key: [] for key in calls}
        for _ in range(args.rounds):
            for key, call in calls.items():
                samples[key].append(call())
        ms = {key: statistics.median(s) for key, s in samples.items()}
        for name, (dtype, cache_dtype) in ROWS.items():
            floor_ms = floor_bytes(*shape, dtype, cache_dtype) / (stream_gbs * 1e9) * 1e3
            peer = "f32" if dtype == torch.float32 else "bf16"
            ours, theirs = ms[("ours", name)], ms[("torch", peer)]
            paged = ms.get(("paged", name))
            paged_cells = (f"{paged:.3f} | {paged / floor_ms:.2f}" if paged is not None
                           else "— | —")
            lines.append(f"| {B}, {N}, {E}, {H} | {name} | {ours:.3f} | {floor_ms:.3f} | "
                         f"{ours / floor_ms:.2f} | {theirs:.3f} | {theirs / ours:.2f} | "
                         f"{ms[('ours', 'f32')] / ours:.2f} | {paged_cells} |")
    print("\n".join(lines))
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
