"""mha.scaled_dot_product_attention against torch.nn.functional.scaled_dot_product_attention
(computed in float64), with torch's signature and semantics, and its extras against what they
mean written out in torch."""
import math

import pytest
import torch
import torch.nn.functional as F

import mha


def reference(query, key, value, attn_mask=None, is_causal=False, scale=None, enable_gqa=False):
    """torch's SDPA in float64 on the same (rounded) values."""
    def wide(t):
        return None if t is None else (t if t.dtype == torch.bool else t.double())
    if attn_mask is not None:  # torch's kernels take masks of two dimensions or more
        attn_mask = attn_mask.expand(*query.shape[:-1], key.shape[-2])
    return F.scaled_dot_product_attention(wide(query), wide(key), wide(value),
                                          attn_mask=wide(attn_mask), is_causal=is_causal,
                                          scale=scale, enable_gqa=enable_gqa)


def relative_error(got, want):
    got, want = got.double(), want.double()
    norm = want.norm()
    return ((got - want).norm() / (norm if norm > 0 else 1)).item()


def tolerance(dtype):
    return {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}[dtype]


@pytest.mark.parametrize("head_dim", [17, 64, 128])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_matches_torch(seed, head_dim, dtype):
    q = torch.randn(2, 4, 37, head_dim).to(dtype)
    k = torch.randn(2, 4, 53, head_dim).to(dtype)
    v = torch.randn(2, 4, 53, head_dim).to(dtype)
    got = mha.scaled_dot_product_attention(q, k, v)
    assert got.dtype == dtype and got.shape == (2, 4, 37, head_dim)
    assert relative_error(got, reference(q, k, v)) < tolerance(dtype)


@pytest.mark.parametrize("mask_shape", [(37, 53), (2, 1, 1, 53), (4, 37, 53), (53,), (1,),
                                        (2, 4, 37, 53)])
@pytest.mark.parametrize("is_bool", [True, False])
def test_masks_broadcast_as_in_torch(seed, mask_shape, is_bool):
    q, k, v = torch.randn(2, 4, 37, 32), torch.randn(2, 4, 53, 32), torch.randn(2, 4, 53, 32)
    mask = torch.rand(mask_shape) > 0.3 if is_bool else torch.randn(mask_shape)
    got = mha.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert relative_error(got, reference(q, k, v, attn_mask=mask)) < 1e-5


def test_expanded_mask_and_transposed_tensors_are_read_in_place(seed):
    # transformers' layout: [B, S, H, d] memory seen as [B, H, S, d], and a mask expanded over
    # heads (stride 0).
    q = torch.randn(2, 37, 4, 32).transpose(1, 2)
    k = torch.randn(2, 53, 2, 32).transpose(1, 2)
    v = torch.randn(2, 53, 2, 32).transpose(1, 2)
    mask = (torch.rand(2, 1, 37, 53) > 0.2).expand(2, 4, 37, 53)
    got = mha.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    want = reference(q, k, v, attn_mask=mask, enable_gqa=True)
    assert relative_error(got, want) < 1e-5


@pytest.mark.parametrize("query_len,key_len", [(41, 41), (1, 60), (29, 61)])
def test_causal_and_grouped_query_heads(seed, query_len, key_len):
    q = torch.randn(1, 8, query_len, 64)
    k, v = torch.randn(1, 2, key_len, 64), torch.randn(1, 2, key_len, 64)
    got = mha.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3, enable_gqa=True)
    want = reference(q, k, v, is_causal=True, scale=0.3, enable_gqa=True)
    assert relative_error(got, want) < 1e-5


def test_rows_no_key_weighs_are_zero_as_in_torch(seed):
    q, k, v = torch.randn(1, 2, 5, 16), torch.randn(1, 2, 7, 16), torch.randn(1, 2, 7, 16)
    mask = torch.rand(5, 7) > 0.3
    mask[2] = False
    got = mha.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.equal(got[:, :, 2], torch.zeros(1, 2, 16))
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


def test_unbatched_and_three_dimensional_inputs(seed):
    q, k, v = torch.randn(6, 16), torch.randn(9, 16), torch.randn(9, 24)
    assert relative_error(mha.scaled_dot_product_attention(q, k, v), reference(q, k, v)) < 1e-5
    q, k, v = torch.randn(3, 6, 16), torch.randn(3, 9, 16), torch.randn(3, 9, 16)
    assert relative_error(mha.scaled_dot_product_attention(q, k, v), reference(q, k, v)) < 1e-5


def explicit_mask(query_len, key_len, left, right, causal):
    """The window as a boolean mask, FlashAttention's alignment (bottom right; top left when
    causal)."""
    i = torch.arange(query_len)[:, None]
    j = torch.arange(key_len)[None, :]
    diagonal = i if causal else i + key_len - query_len
    keep = torch.ones(query_len, key_len, dtype=torch.bool)
    if causal:
        keep &= j <= diagonal
    if left >= 0:
        keep &= j >= diagonal - left
    if right >= 0:
        keep &= j <= diagonal + right
    return keep


@pytest.mark.parametrize("window,causal", [(7, True), ((5, 3), False), ((9, -1), False),
                                           ((64, 0), True)])
def test_sliding_windows_are_masks_the_kernels_skip(seed, window, causal):
    q, k, v = torch.randn(1, 4, 97, 32), torch.randn(1, 2, 97, 32), torch.randn(1, 2, 97, 32)
    got = mha.scaled_dot_product_attention(q, k, v, is_causal=causal, window=window,
                                           enable_gqa=True)
    left, right = (window, 0 if causal else window) if isinstance(window, int) else window
    mask = explicit_mask(97, 97, left, right, causal)
    assert relative_error(got, reference(q, k, v, attn_mask=mask, enable_gqa=True)) < 1e-5


def test_softcap_alibi_and_lse(seed):
    q, k, v = torch.randn(2, 4, 19, 32), torch.randn(2, 4, 23, 32), torch.randn(2, 4, 23, 32)
    slopes = torch.tensor([2.0 ** (-2 * (h + 1)) for h in range(4)])
    got, lse = mha.scaled_dot_product_attention(q, k, v, softcap=3.0, alibi_slopes=slopes,
                                                return_lse=True)
    # Written out: scores, capped, minus slope · |i + Sk - Sq - j|, softmax.
    scores = (q.double() @ k.double().transpose(-1, -2)) / math.sqrt(32)
    scores = 3.0 * torch.tanh(scores / 3.0)
    i = torch.arange(19)[:, None]
    j = torch.arange(23)[None, :]
    scores = scores - slopes.double()[:, None, None] * (i + 23 - 19 - j).abs()
    want = torch.softmax(scores, -1) @ v.double()
    assert relative_error(got, want) < 1e-5
    assert lse.shape == (2, 4, 19) and lse.dtype == torch.float32
    assert relative_error(lse, torch.logsumexp(scores, -1)) < 1e-6


def test_bad_arguments_are_clear_errors():
    q = torch.randn(1, 2, 3, 8)
    with pytest.raises(ValueError, match="dropout_p=0.1"):
        mha.scaled_dot_product_attention(q, q, q, dropout_p=0.1)
    with pytest.raises(ValueError, match="is_causal=True"):
        mha.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(3, 3, dtype=torch.bool),
                                         is_causal=True)
    with pytest.raises(ValueError, match="enable_gqa=True"):
        mha.scaled_dot_product_attention(q, torch.randn(1, 1, 3, 8), torch.randn(1, 1, 3, 8))
    with pytest.raises(TypeError, match="float64"):
        mha.scaled_dot_product_attention(q.double(), q.double(), q.double())
    with pytest.raises(mha.Error, match="key has 4 features but query has 8"):
        mha.scaled_dot_product_attention(q, torch.randn(1, 2, 3, 4), q)
    with pytest.raises(mha.Error, match="does not broadcast"):
        mha.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(2, 3, dtype=torch.bool))


def test_compile_fullgraph_and_export(seed):
    def attend(q, k, v, mask):
        return mha.scaled_dot_product_attention(q, k, v, attn_mask=mask, window=(4, 4))

    q, k, v = torch.randn(1, 2, 11, 16), torch.randn(1, 2, 11, 16), torch.randn(1, 2, 11, 16)
    mask = torch.rand(11, 11) > 0.2
    eager = attend(q, k, v, mask)
    compiled = torch.compile(attend, fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v, mask), eager)

    class Attend(torch.nn.Module):
        def forward(self, q, k, v, mask):
            return attend(q, k, v, mask)

    exported = torch.export.export(Attend(), (q, k, v, mask))
    assert "mha.scaled_dot_product_attention" in str(exported.graph)
    torch.testing.assert_close(exported.module()(q, k, v, mask), eager)
