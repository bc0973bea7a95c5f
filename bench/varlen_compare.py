"""Packed prefills (mha.varlen_attention) against PyTorch, from Python, in one run: interleaved
rounds, medians, both on the same threads, with the f32 GEMM rate as the ceiling.

    .venv-torch/bin/python bench/varlen_compare.py --out build/bench/varlen.md

LLM shapes: H = 32 query heads over Hkv = 8, d = 128, causal; B prompts of ragged lengths
(0.25x to 1.75x N) packed without padding. PyTorch: SDPA (enable_gqa, is_causal) on each
sequence in turn ("per sequence", what code without a varlen kernel does), and over the batch
padded to the longest with a boolean mask ("padded", whose padding rows are computed too).
GFLOP/s counts the work the causal order leaves: 4 · H · d · (the keys each query sees).
"""
import torch
import torch.nn.functional as F

import mha
from sdpa_compare import interleaved, run_tables

H, KV_HEADS, HEAD_DIM = 32, 8, 128
SHAPES = [(4, 256), (8, 512), (4, 1024), (16, 128)]


def rows(args, rates):
    out = []
    for dtype in (torch.float32, torch.bfloat16):
        for batch, length in SHAPES:
            lengths = [max(1, int(length * (0.25 + 1.5 * b / max(1, batch - 1))))
                       for b in range(batch)]
            cu = torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0, dtype=torch.int32)
            total, longest = sum(lengths), max(lengths)
            q = torch.randn(total, H, HEAD_DIM).to(dtype)
            k = torch.randn(total, KV_HEADS, HEAD_DIM).to(dtype)
            v = torch.randn(total, KV_HEADS, HEAD_DIM).to(dtype)
            pieces = [(q[s:e].transpose(0, 1), k[s:e].transpose(0, 1), v[s:e].transpose(0, 1))
                      for s, e in zip(cu[:-1].tolist(), cu[1:].tolist())]

            def padded_tensor(x):
                p = x.new_zeros(batch, longest, *x.shape[1:])
                for b, (s, e) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
                    p[b, :e - s] = x[s:e]
                return p.transpose(1, 2)

            qp, kp, vp = padded_tensor(q), padded_tensor(k), padded_tensor(v)
            keep = torch.arange(longest)[None, :] < torch.tensor(lengths)[:, None]
            mask = (keep[:, None, None, :] &
                    torch.ones(longest, longest, dtype=torch.bool).tril()[None, None])
            t = interleaved({
                "ours": lambda: mha.varlen_attention(q, k, v, cu, cu, causal=True),
                "per sequence": lambda: [F.scaled_dot_product_attention(
                    qs, ks, vs, is_causal=True, enable_gqa=True) for qs, ks, vs in pieces],
                "padded": lambda: F.scaled_dot_product_attention(qp, kp, vp, attn_mask=mask,
                                                                 enable_gqa=True),
            }, args.rounds, args.min_time)
            flops = 4 * H * HEAD_DIM * sum(n * (n + 1) // 2 for n in lengths)
            out.append((str(dtype).split(".")[1], batch, total, t["ours"] * 1e3,
                        flops / t["ours"] / 1e9, t["per sequence"] * 1e3,
                        t["per sequence"] / t["ours"], t["padded"] * 1e3,
                        t["padded"] / t["ours"]))
    return out


if __name__ == "__main__":
    run_tables(__doc__.split("\n\n")[0],
               lambda args: f"Packed causal prefills, H {H} over {KV_HEADS} KV heads, d {HEAD_DIM}",
               ["dtype", "B", "tokens", "ours ms", "ours GFLOP/s", "per sequence ms",
                "× per sequence", "padded ms", "× padded"], rows)
