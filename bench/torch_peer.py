"""PyTorch peers of the benchmark sweep: nn.MultiheadAttention, and F.linear with
F.scaled_dot_product_attention (or, when the weights are requested, which SDPA cannot return,
the explicit matmul/softmax a user writes instead), f32; the module in bf16 and f16 too. CPU,
inference mode."""

import copy
import math

import torch
import torch.nn.functional as F

from report import median_ms



def measure(dims, with_weights, threads, min_time_s=0.3):
    """Median milliseconds of both PyTorch paths for one (B, Sq, Sk, E, H) shape."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    B, Sq, Sk, E, H = dims
    d = E // H
    mha = torch.nn.MultiheadAttention(E, H, batch_first=True).eval()
    query = torch.rand(B, Sq, E) * 2 - 1
    key = query if Sq == Sk else torch.rand(B, Sk, E) * 2 - 1  # self-attention: one tensor
    value = key
    wq, wk, wv = mha.in_proj_weight.detach().chunk(3)
    bq, bk, bv = mha.in_proj_bias.detach().chunk(3)
    wo, bo = mha.out_proj.weight.detach(), mha.out_proj.bias.detach()

    def module():
        return mha(query, key, value, need_weights=with_weights, average_attn_weights=False)

    def heads(x, w, b, S):
        return F.linear(x, w, b).view(B, S, H, d).transpose(1, 2)

    def functional():
        q, k, v = heads(query, wq, bq, Sq), heads(key, wk, bk, Sk), heads(value, wv, bv, Sk)
        if with_weights:
            weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d), dim=-1)
            context = weights @ v
        else:
            weights, context = None, F.scaled_dot_product_attention(q, k, v)
        return F.linear(context.transpose(1, 2).reshape(B, Sq, E), wo, bo), weights

    with torch.inference_mode():
        out_module, _ = module()
        out_functional, _ = functional()
        if not torch.allclose(out_module, out_functional, rtol=1e-4, atol=1e-5):
            raise RuntimeError(f"PyTorch's two paths disagree on {dims}")
        return {
            "nn.MultiheadAttention": median_ms(module, min_time_s),
            "F.linear+sdpa": median_ms(functional, min_time_s),
        }


TORCH_DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def measure_dtype(dims, dtype, threads, min_time_s=0.3):
    """Median milliseconds of PyTorch's self-attention in `dtype` (f32, bf16, f16): an
    nn.MultiheadAttention of that dtype on a tensor of it, F.linear projections around
    F.scaled_dot_product_attention on the same weights and tensor, and for bf16 also the f32
    module under torch.autocast("cpu", bfloat16)."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    B, S, _, E, H = dims
    d = E // H
    mha = torch.nn.MultiheadAttention(E, H, batch_first=True).eval()
    x = torch.rand(B, S, E) * 2 - 1
    typed, typed_x = copy.deepcopy(mha).to(TORCH_DTYPES[dtype]), x.to(TORCH_DTYPES[dtype])
    w_in, b_in = typed.in_proj_weight.detach(), typed.in_proj_bias.detach()
    wo, bo = typed.out_proj.weight.detach(), typed.out_proj.bias.detach()

    def linear_sdpa():
        q, k, v = F.linear(typed_x, w_in, b_in).view(B, S, 3, H, d).permute(2, 0, 3, 1, 4)
        context = F.scaled_dot_product_attention(q, k, v)
        return F.linear(context.transpose(1, 2).reshape(B, S, E), wo, bo)

    def autocast():
        with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
            return mha(x, x, x, need_weights=False)

    with torch.inference_mode():
        times = {"module": median_ms(lambda: typed(typed_x, typed_x, typed_x, need_weights=False),
                                     min_time_s),
                 "linear+sdpa": median_ms(linear_sdpa, min_time_s)}
        if dtype == "bf16":
            times["autocast"] = median_ms(autocast, min_time_s)
        return times


def measure_causal(dims, threads, min_time_s=0.3):
    """Median milliseconds of PyTorch's causal self-attention: F.linear projections and
    F.scaled_dot_product_attention(is_causal=True), which skips the masked half itself."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    B, S, _, E, H = dims
    d = E // H
    mha = torch.nn.MultiheadAttention(E, H, batch_first=True).eval()
    w_in, b_in = mha.in_proj_weight.detach(), mha.in_proj_bias.detach()
    wo, bo = mha.out_proj.weight.detach(), mha.out_proj.bias.detach()
    x = torch.rand(B, S, E) * 2 - 1

    def causal():
        q, k, v = F.linear(x, w_in, b_in).view(B, S, 3, H, d).permute(2, 0, 3, 1, 4)
        context = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return F.linear(context.transpose(1, 2).reshape(B, S, E), wo, bo)

    with torch.inference_mode():
        return median_ms(causal, min_time_s)


def measure_gqa(dims, kv_heads, threads, min_time_s=0.3):
    """Median milliseconds of PyTorch's grouped-query self-attention: F.linear projections
    (K and V of kv_heads heads) and F.scaled_dot_product_attention(enable_gqa=True)."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    B, S, _, E, H = dims
    d = E // H
    w_q, w_kv = torch.rand(E, E) - 0.5, torch.rand(2 * kv_heads * d, E) - 0.5
    b_q, b_kv = torch.rand(E), torch.rand(2 * kv_heads * d)
    wo, bo = torch.rand(E, E) - 0.5, torch.rand(E)
    x = torch.rand(B, S, E) * 2 - 1

    def gqa():
        q = F.linear(x, w_q, b_q).view(B, S, H, d).transpose(1, 2)
        k, v = F.linear(x, w_kv, b_kv).view(B, S, 2, kv_heads, d).permute(2, 0, 3, 1, 4)
        context = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        return F.linear(context.transpose(1, 2).reshape(B, S, E), wo, bo)

    with torch.inference_mode():
        return median_ms(gqa, min_time_s)


def measure_decode(batch, cached, E, H, threads, min_time_s=0.3, dtype=torch.float32,
                   kv_heads=None):
    """Median milliseconds of one PyTorch decode step: the new token's fused QKV projection
    (F.linear), its key and value written in place into a preallocated cache, SDPA over the
    filled part (enable_gqa with fewer key/value heads), the output projection; weights, token
    and cache in `dtype`."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    d, kv_heads = E // H, kv_heads or H
    kv = kv_heads * d
    w_in = ((torch.rand(E + 2 * kv, E) * 2 - 1) / E**0.5).to(dtype)
    b_in = torch.zeros(E + 2 * kv, dtype=dtype)
    wo = ((torch.rand(E, E) * 2 - 1) / E**0.5).to(dtype)
    bo = torch.zeros(E, dtype=dtype)
    k_cache = torch.rand(batch, kv_heads, cached + 1, d, dtype=dtype)
    v_cache = torch.rand(batch, kv_heads, cached + 1, d, dtype=dtype)
    token = (torch.rand(batch, 1, E) * 2 - 1).to(dtype)

    def step():
        qkv = F.linear(token, w_in, b_in)
        q = qkv[..., :E].view(batch, 1, H, d).transpose(1, 2)
        k = qkv[..., E:E + kv].view(batch, 1, kv_heads, d).transpose(1, 2)
        v = qkv[..., E + kv:].view(batch, 1, kv_heads, d).transpose(1, 2)
        k_cache[:, :, cached:cached + 1] = k
        v_cache[:, :, cached:cached + 1] = v
        context = F.scaled_dot_product_attention(q, k_cache, v_cache,
                                                 enable_gqa=kv_heads != H)
        return F.linear(context.transpose(1, 2).reshape(batch, 1, E), wo, bo)

    with torch.inference_mode():
        return median_ms(step, min_time_s)


def call_overhead_ms(threads, min_time_s=0.2):
    """A Python call of the cheapest PyTorch op, for scale."""
    torch.set_num_threads(threads)
    x = torch.zeros(1)
    with torch.inference_mode():
        return median_ms(lambda: torch.add(x, 1), min_time_s)
