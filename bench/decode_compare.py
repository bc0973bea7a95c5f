"""Decode steps in f32 and bf16 against PyTorch's step with a preallocated cache, from Python, in
one run: interleaved rounds, medians, both on the same threads, with the bytes floor.

    .venv-torch/bin/python bench/decode_compare.py --out build/bench/decode.md

Ours: mha.MultiheadAttention.decode, the module and its cache in the dtype (bf16: the weights
and the cache read in 16 bits), one new token per row; again over a paged cache (blocks of 16
in a shuffled pool, python_peer.measure_paged_decode). PyTorch: F.linear + SDPA + F.linear with
the weights, the token and a preallocated cache in the dtype (bench/torch_peer.py). The floor:
the bytes a step must read (weights 4·E², cache 2·N·E, in the dtype) at the streaming read
measured in the same run (sdpa_compare.ceilings); × floor is ours over it, as in compare.py.
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


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--min-time", type=float, default=0.2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", help="also write the table here")
    args = parser.parse_args()
    stream_gbs = dict(sdpa_compare.ceilings(args))["streaming read GB/s"]
    lines = [f"Streaming read: {stream_gbs:.1f} GB/s. {args.threads} threads, medians of "
             f"{args.rounds} interleaved rounds.", "",
             "| B, N, E, H | dtype | ours ms | floor ms | × floor | PyTorch ms | × PyTorch |"
             " ours × our f32 | paged ms | paged × floor |", "|---" * 10 + "|"]
    for shape in SHAPES:
        B, N, E, H = shape
        calls = {}
        for name, dtype in DTYPES.items():
            calls[("ours", name)] = lambda s=shape, t=dtype: python_peer.measure_decode(
                *s, args.threads, args.min_time, t)
            calls[("torch", name)] = lambda s=shape, t=dtype: torch_peer.measure_decode(
                *s, args.threads, args.min_time, t)
            calls[("paged", name)] = lambda s=shape, t=dtype: python_peer.measure_paged_decode(
                *s, args.threads, args.min_time, t)
        samples = {key: [] for key in calls}
        for _ in range(args.rounds):
            for key, call in calls.items():
                samples[key].append(call())
        ms = {key: statistics.median(s) for key, s in samples.items()}
        for name, dtype in DTYPES.items():
            size = torch.finfo(dtype).bits // 8
            floor_ms = (4 * E * E + 2 * B * N * E) * size / (stream_gbs * 1e9) * 1e3
            ours, theirs = ms[("ours", name)], ms[("torch", name)]
            lines.append(f"| {B}, {N}, {E}, {H} | {name} | {ours:.3f} | {floor_ms:.3f} | "
                         f"{ours / floor_ms:.2f} | {theirs:.3f} | {theirs / ours:.2f} | "
                         f"{ms[('ours', 'f32')] / ours:.2f} | {ms[('paged', name)]:.3f} | "
                         f"{ms[('paged', name)] / floor_ms:.2f} |")
    print("\n".join(lines))
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
