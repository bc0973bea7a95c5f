"""Split-K paged decode steps: one or few sequences over few key/value heads (multi-query and
grouped), whose batch rows x key/value heads give the threads too few tasks, with each
sequence's keys in one split (num_splits=1) and in the splits paged_attention chooses
(num_splits=0), on 1 and 2 threads, all interleaved.

    .venv-torch/bin/python bench/paged_splits.py --out build/bench/paged_splits.md
"""
import torch

import mha
from paged_compare import BLOCK, HEAD_DIM, paged_problem
from sdpa_compare import interleaved, run_tables

SHAPES = [(1, 4, 1, 2048), (1, 4, 1, 8192), (1, 8, 1, 8192), (1, 32, 8, 8192)]


def rows(args, rates):
    stream_gbs = rates["streaming read GB/s"]
    out = []
    for dtype in (torch.float32, torch.bfloat16):
        for batch, heads, kv_heads, keys in SHAPES:
            lengths, block_table, key_cache, value_cache = paged_problem(batch, keys, dtype,
                                                                         kv_heads)
            seqlens = torch.tensor(lengths, dtype=torch.int32)
            query = torch.randn(batch, 1, heads, HEAD_DIM).to(dtype)

            def step(threads, splits):
                def call():
                    mha.set_num_threads(threads)
                    mha.paged_attention(query, key_cache, value_cache, block_table, seqlens,
                                        num_splits=splits)
                return call

            t = interleaved({"one": step(1, 1), "two": step(2, 1), "split": step(2, 0)},
                            args.rounds, args.min_time)
            mha.set_num_threads(args.threads)
            cache_bytes = 2 * sum(lengths) * kv_heads * HEAD_DIM * query.element_size()
            floor = cache_bytes / (stream_gbs * 1e9) * 1e3
            out.append((str(dtype).split(".")[1], batch, heads, kv_heads, sum(lengths),
                        t["one"] * 1e3, t["two"] * 1e3, t["split"] * 1e3, t["one"] / t["split"],
                        floor))
    return out


if __name__ == "__main__":
    run_tables(__doc__.split("\n\n")[0],
               lambda args: f"Paged decode steps, d {HEAD_DIM}, blocks of {BLOCK}",
               ["dtype", "B", "H", "KV heads", "keys", "1 thread ms", "2 threads, 1 split ms",
                "2 threads, split ms", "× 1 thread", "floor ms (2 threads)"], rows)
