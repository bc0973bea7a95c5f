"""This project's kernels called from Python, as the other peers are: mha.MultiheadAttention (the
installed Python package, `pip install .`) on PyTorch tensors, f32, CPU, inference mode."""

import mha
import torch

from report import median_ms


def measure(dims, with_weights, threads, min_time_s=0.3):
    """Median milliseconds of mha.MultiheadAttention's forward on one (B, Sq, Sk, E, H) shape,
    returning the weights of each head when asked (as the C++ benchmark does)."""
    mha.set_num_threads(threads)
    torch.manual_seed(0)
    B, Sq, Sk, E, H = dims
    module = mha.MultiheadAttention(E, H, batch_first=True).eval()
    query = torch.rand(B, Sq, E) * 2 - 1
    key = query if Sq == Sk else torch.rand(B, Sk, E) * 2 - 1

    def forward():
        return module(query, key, key, need_weights=with_weights, average_attn_weights=False)

    with torch.inference_mode():
        return median_ms(forward, min_time_s)


def measure_decode(batch, cached, E, H, threads, min_time_s=0.3):
    """Median milliseconds of one decode step (one new token per row) over `cached` tokens."""
    mha.set_num_threads(threads)
    torch.manual_seed(0)
    module = mha.MultiheadAttention(E, H, batch_first=True).eval()
    cache = module.make_cache(batch, cached + 1)
    with torch.inference_mode():
        module.decode(torch.rand(batch, cached, E) * 2 - 1, cache)
        token = torch.rand(batch, 1, E) * 2 - 1

        def step():
            cache.truncate(cached)
            return module.decode(token, cache)

        return median_ms(step, min_time_s)
