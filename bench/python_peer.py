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


def measure_decode(batch, cached, E, H, threads, min_time_s=0.3, dtype=torch.float32,
                   cache_dtype=None):
    """Median milliseconds of one decode step (one new token per row) over `cached` tokens, the
    module and its tokens in `dtype`, its cache in `cache_dtype` (None: `dtype`)."""
    mha.set_num_threads(threads)
    torch.manual_seed(0)
    module = mha.MultiheadAttention(E, H, batch_first=True).eval().to(dtype)
    cache = module.make_cache(batch, cached + 1, dtype=cache_dtype)
    with torch.inference_mode():
        module.decode((torch.rand(batch, cached, E) * 2 - 1).to(dtype), cache)
        token = (torch.rand(batch, 1, E) * 2 - 1).to(dtype)

        def step():
            cache.truncate(cached)
            return module.decode(token, cache)

        return median_ms(step, min_time_s)


def measure_paged_decode(batch, cached, E, H, threads, min_time_s=0.3, dtype=torch.float32,
                         block_size=16):
    """The same step as measure_decode's over a paged cache in `dtype` (mha.PagedDecodeCache):
    each row's `cached` keys and values in shuffled blocks of one pool, the new token's written
    into the slot after them."""
    mha.set_num_threads(threads)
    torch.manual_seed(0)
    module = mha.MultiheadAttention(E, H, batch_first=True).eval().to(dtype)
    blocks = -(-(cached + 1) // block_size)
    pool = (batch * blocks, block_size, H, E // H)
    key_cache, value_cache = torch.randn(pool).to(dtype), torch.randn(pool).to(dtype)
    table = torch.randperm(batch * blocks, dtype=torch.int32).reshape(batch, blocks)
    slots = (table[:, cached // block_size].long() * block_size + cached % block_size)
    cache = mha.PagedDecodeCache(key_cache, value_cache, table,
                                 torch.full((batch,), cached + 1, dtype=torch.int32), slots)
    with torch.inference_mode():
        token = (torch.rand(batch, 1, E) * 2 - 1).to(dtype)
        return median_ms(lambda: module.decode(token, cache), min_time_s)


def call_overhead_ms(threads, min_time_s=0.1):
    """What mha.MultiheadAttention adds to the C++ call it makes (checks, parameter
    fingerprints, output allocation, array conversion): one token at E = 384, the module's median
    time minus the bare extension call's, over 5 alternating pairs (median)."""
    mha.set_num_threads(threads)
    module = mha.MultiheadAttention(384, 12, batch_first=True).eval()
    native = mha._torch._native(module._module_id, module.num_heads, module._weights())
    x = torch.rand(1, 1, 384)
    x_array, out_array = x.numpy(), torch.empty(1, 1, 384).numpy()
    differences = []
    with torch.inference_mode():
        for _ in range(5):
            module_ms = median_ms(lambda: module(x, x, x, need_weights=False), min_time_s)
            native_ms = median_ms(lambda: native.forward(x_array, x_array, x_array, out_array),
                                  min_time_s)
            differences.append(module_ms - native_ms)
    return sorted(differences)[2]
