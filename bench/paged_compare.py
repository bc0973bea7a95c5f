"""Decode steps over a paged KV cache (mha.paged_attention) against PyTorch, from Python, in one
run: interleaved rounds, medians, both on the same threads, with the bytes floor.

    .venv-torch/bin/python bench/paged_compare.py --out build/bench/paged.md

LLM shapes: H = 32 query heads over Hkv = 8, d = 128, blocks of 16; B sequences of ragged lengths
(0.5x to 1.5x N), their blocks shuffled in one pool. PyTorch: SDPA (enable_gqa) over a
preallocated [B, Hkv, longest, d] cache with a boolean padding mask ("padded"), and over the
blocks gathered per call from the pool ("gathered", what an engine without a paged kernel does).
The floor: the cache bytes the step must read at the streaming read measured in the same run.
"""
import torch
import torch.nn.functional as F

import mha
from sdpa_compare import interleaved, run_tables

H, KV_HEADS, HEAD_DIM, BLOCK = 32, 8, 128, 16
SHAPES = [(1, 512), (1, 2048), (1, 8192), (4, 2048), (8, 1024)]


def paged_problem(batch, keys, dtype, kv_heads=KV_HEADS):
    lengths = [max(1, int(keys * (0.5 + b / max(1, batch - 1)))) if batch > 1 else keys
               for b in range(batch)]
    blocks = [-(-n // BLOCK) for n in lengths]
    pool = torch.randperm(sum(blocks), dtype=torch.int32)
    table_ = torch.zeros(batch, max(blocks), dtype=torch.int32)
    start = 0
    for b, n in enumerate(blocks):
        table_[b, :n] = pool[start:start + n]
        start += n
    shape = (sum(blocks), BLOCK, kv_heads, HEAD_DIM)
    key_cache, value_cache = torch.randn(shape).to(dtype), torch.randn(shape).to(dtype)
    return lengths, table_, key_cache, value_cache


def rows(args, rates):
    stream_gbs = rates["streaming read GB/s"]
    out = []
    for dtype in (torch.float32, torch.bfloat16):
        for batch, keys in SHAPES:
            lengths, block_table, key_cache, value_cache = paged_problem(batch, keys, dtype)
            seqlens = torch.tensor(lengths, dtype=torch.int32)
            query = torch.randn(batch, 1, H, HEAD_DIM).to(dtype)
            longest = max(lengths)
            # The same keys and values, padded per sequence, for the contiguous peer.
            slots = torch.arange(block_table.shape[1] * BLOCK)
            gather_index = block_table[:, slots // BLOCK].long() * BLOCK + slots % BLOCK

            def gathered():
                k = key_cache.view(-1, KV_HEADS, HEAD_DIM)[gather_index[:, :longest]]
                v = value_cache.view(-1, KV_HEADS, HEAD_DIM)[gather_index[:, :longest]]
                return F.scaled_dot_product_attention(
                    query.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                    attn_mask=mask, enable_gqa=True)

            k_padded = key_cache.view(-1, KV_HEADS, HEAD_DIM)[gather_index[:, :longest]]
            v_padded = value_cache.view(-1, KV_HEADS, HEAD_DIM)[gather_index[:, :longest]]
            k_padded, v_padded = k_padded.transpose(1, 2).contiguous(), v_padded.transpose(
                1, 2).contiguous()
            mask = (torch.arange(longest)[None, :] < seqlens[:, None])[:, None, None, :]
            q_heads = query.transpose(1, 2)
            t = interleaved({
                "ours": lambda: mha.paged_attention(query, key_cache, value_cache, block_table,
                                                    seqlens),
                "padded": lambda: F.scaled_dot_product_attention(
                    q_heads, k_padded, v_padded, attn_mask=mask, enable_gqa=True),
                "gathered": gathered,
            }, args.rounds, args.min_time)
            cache_bytes = 2 * sum(lengths) * KV_HEADS * HEAD_DIM * query.element_size()
            floor = cache_bytes / (stream_gbs * 1e9)
            out.append((str(dtype).split(".")[1], batch, sum(lengths), t["ours"] * 1e3,
                        floor * 1e3, t["ours"] / floor, t["padded"] * 1e3,
                        t["padded"] / t["ours"], t["gathered"] * 1e3,
                        t["gathered"] / t["ours"]))
    return out


if __name__ == "__main__":
    run_tables(__doc__.split("\n\n")[0],
               lambda args: f"Paged decode steps, H {H} over {KV_HEADS} KV heads, d {HEAD_DIM}, "
                            f"blocks of {BLOCK}",
               ["dtype", "B", "keys", "ours ms", "floor ms", "× floor", "padded ms", "× padded",
                "gathered ms", "× gathered"], rows)
