"""mha.rotary_embedding against transformers' apply_rotary_pos_emb (Llama's rotate-half, its cos
and sin computed as LlamaRotaryEmbedding computes them) and a float64 rotation (GPT-J's
interleaved pairs, partial rotary dims, tables); the attention calls' rotary option against it."""
import pytest
import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

import mha


def relative_error(got, want):
    got, want = got.double(), want.double()
    return ((got - want).norm() / want.norm()).item()


def llama_cos_sin(positions, dim, theta):
    """As LlamaRotaryEmbedding.forward: float32 frequencies, the halves concatenated."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def rotated_interleaved(x, positions, rotary_dim, theta):
    """GPT-J's rotation in float64: pairs (2i, 2i + 1) of the first rotary_dim features."""
    x = x.double().clone()
    inv = theta ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    angle = positions.double()[:, None, None] * inv
    a, b = x[..., 0:rotary_dim:2].clone(), x[..., 1:rotary_dim:2].clone()
    x[..., 0:rotary_dim:2] = a * angle.cos() - b * angle.sin()
    x[..., 1:rotary_dim:2] = b * angle.cos() + a * angle.sin()
    return x


def test_matches_transformers_llama(seed):
    T, H, Hkv, d, theta = 37, 8, 2, 64, 500000.0
    positions = torch.randint(0, 8192, (T,))
    q, k = torch.randn(T, H, d), torch.randn(T, Hkv, d)
    cos, sin = llama_cos_sin(positions, d, theta)
    # transformers' layout: [B, H, S, d] with cos, sin [B, S, d].
    want_q, want_k = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                          cos[None], sin[None])
    mha.rotary_embedding(q, k, positions, theta=theta)
    torch.testing.assert_close(q, want_q[0].transpose(0, 1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(k, want_k[0].transpose(0, 1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype,tolerance", [(torch.float32, 3e-4), (torch.bfloat16, 1e-2),
                                             (torch.float16, 2e-3)])
def test_interleaved_partial_on_a_fused_projection(seed, dtype, tolerance):
    T, H, Hkv, d, rotary_dim = 19, 4, 2, 80, 32
    qkv = torch.randn(T, H + 2 * Hkv, d).to(dtype)
    q, k, v = qkv[:, :H], qkv[:, H:H + Hkv], qkv[:, H + Hkv:]
    want_q = rotated_interleaved(q, positions := torch.arange(100, 100 + T), rotary_dim, 1e4)
    want_k = rotated_interleaved(k, positions, rotary_dim, 1e4)
    values = v.clone()
    mha.rotary_embedding(q, k, positions, interleaved=True, rotary_dim=rotary_dim)
    assert relative_error(q, want_q) < tolerance and relative_error(k, want_k) < tolerance
    assert torch.equal(v, values)  # in place, the values beside them untouched


def test_tables_give_the_angles(seed):
    T, d = 11, 16
    positions = torch.randint(0, 64, (T,))
    q, k = torch.randn(T, 2, d), torch.randn(T, 2, d)
    cos, sin = llama_cos_sin(torch.arange(64), d, 1e4)
    by_tables_q, by_tables_k = q.clone(), k.clone()
    mha.rotary_embedding(q, k, positions)
    mha.rotary_embedding(by_tables_q, by_tables_k, positions, cos=cos[:, :d // 2].contiguous(),
                         sin=sin[:, :d // 2].contiguous())
    torch.testing.assert_close(by_tables_q, q, rtol=1e-6, atol=1e-6)
    with pytest.raises(mha.Error, match=r"positions\[\d+\] is 64: the tables have positions 0 to"):
        mha.rotary_embedding(q, k, torch.full((T,), 64), cos=cos[:, :d // 2].contiguous(),
                             sin=sin[:, :d // 2].contiguous())
    with pytest.raises(TypeError, match=r"^cos is torch.float64: it must be torch.float32"):
        mha.rotary_embedding(q, k, positions, cos=cos[:, :d // 2].double(), sin=sin[:, :d // 2])
    with pytest.raises(ValueError, match=r"^sin is on meta: mha runs on the CPU"):
        mha.rotary_embedding(q, k, positions, cos=cos[:, :d // 2], sin=sin.to("meta"))


def test_compile_fullgraph(seed):
    positions = torch.arange(5)

    def rotate(q, k):
        q, k = q.clone(), k.clone()
        mha.rotary_embedding(q, k, positions)
        return q + 0, k + 0

    q, k = torch.randn(5, 4, 16), torch.randn(5, 2, 16)
    torch.testing.assert_close(torch.compile(rotate, fullgraph=True)(q, k), rotate(q, k))


@pytest.mark.parametrize("dtype,tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
def test_attention_reads_rotated_queries_and_keys(seed, dtype, tolerance):
    """scaled_dot_product_attention(rotary=...) as transformers rotates Llama's queries and keys
    (query row i at position S - L + i, key j at j) before torch's SDPA in float64, the tensors
    untouched; also under torch.compile(fullgraph=True)."""
    B, H, Hkv, L, S, d, theta = 2, 8, 2, 7, 23, 64, 500000.0
    q, k, v = (torch.randn(B, H, L, d).to(dtype), torch.randn(B, Hkv, S, d).to(dtype),
               torch.randn(B, Hkv, S, d).to(dtype))
    cos, sin = llama_cos_sin(torch.arange(S), d, theta)
    rotated_q, _ = apply_rotary_pos_emb(q.double(), q.double(), cos[S - L:][None].double(),
                                        sin[S - L:][None].double())
    _, rotated_k = apply_rotary_pos_emb(k.double(), k.double(), cos[None].double(),
                                        sin[None].double())
    want = torch.nn.functional.scaled_dot_product_attention(rotated_q, rotated_k, v.double(),
                                                            enable_gqa=True)
    inputs = (q.clone(), k.clone())
    rotary = mha.Rotary(theta=theta)
    got = mha.scaled_dot_product_attention(q, k, v, enable_gqa=True, rotary=rotary)
    assert got.dtype == dtype and relative_error(got, want) < tolerance
    assert torch.equal(q, inputs[0]) and torch.equal(k, inputs[1])
    compiled = torch.compile(lambda q, k, v: mha.scaled_dot_product_attention(
        q, k, v, enable_gqa=True, rotary=rotary), fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v), got)


def test_varlen_rotates_each_sequence_from_its_start(seed):
    """varlen_attention(rotary=...) equals rotary_embedding at each sequence's own positions
    (queries at the end of their keys), then the call without it."""
    H, Hkv, d, rotary_dim = 4, 2, 48, 16
    query_lens, key_lens = [5, 1, 9], [12, 1, 9]
    cu_q = torch.tensor([0, 5, 6, 15], dtype=torch.int32)
    cu_k = torch.tensor([0, 12, 13, 22], dtype=torch.int32)
    q, k, v = torch.randn(15, H, d), torch.randn(22, Hkv, d), torch.randn(22, Hkv, d)
    rotary = mha.Rotary(interleaved=True, rotary_dim=rotary_dim)
    got = mha.varlen_attention(q, k, v, cu_q, cu_k, causal=True, rotary=rotary)
    query_positions = torch.cat([torch.arange(sk - sq, sk) for sq, sk in zip(query_lens, key_lens)])
    key_positions = torch.cat([torch.arange(sk) for sk in key_lens])
    rotated_q, rotated_k = q.clone(), k.clone()
    mha.rotary_embedding(rotated_q, torch.zeros(15, 1, d), query_positions, interleaved=True,
                         rotary_dim=rotary_dim)
    mha.rotary_embedding(torch.zeros(22, 1, d), rotated_k, key_positions, interleaved=True,
                         rotary_dim=rotary_dim)
    want = mha.varlen_attention(rotated_q, rotated_k, v, cu_q, cu_k, causal=True)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_paged_attention_rotates_the_query_at_its_position(seed):
    """paged_attention(rotary=...) reads each query rotated at cache_seqlens[b] - 1 (the cache's
    keys as they lie), with caller-given tables."""
    B, H, Hkv, d, block_size, blocks = 3, 4, 2, 32, 16, 8
    key_cache = torch.randn(blocks, block_size, Hkv, d)
    value_cache = torch.randn(blocks, block_size, Hkv, d)
    block_table = torch.randperm(blocks, dtype=torch.int32)[:6].reshape(B, 2)
    cache_seqlens = torch.tensor([17, 1, 30], dtype=torch.int32)
    q = torch.randn(B, 1, H, d)
    angles = torch.rand(40, d // 2) * 6.28
    rotary = mha.Rotary(cos=angles.cos(), sin=angles.sin())
    got = mha.paged_attention(q, key_cache, value_cache, block_table, cache_seqlens,
                              rotary=rotary)
    rotated_q = q.clone()
    mha.rotary_embedding(rotated_q[:, 0], torch.zeros(B, 1, d), cache_seqlens.long() - 1,
                         cos=rotary.cos, sin=rotary.sin)
    want = mha.paged_attention(rotated_q, key_cache, value_cache, block_table, cache_seqlens)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_attention_rotary_errors(seed):
    q = torch.randn(1, 2, 3, 8)
    with pytest.raises(mha.Error, match=r"rotary.rotary_dim is -2"):
        mha.scaled_dot_product_attention(q, q, q, rotary=mha.Rotary(rotary_dim=-2))
    with pytest.raises(TypeError, match=r"rotary.cos is torch.float64"):
        mha.scaled_dot_product_attention(q, q, q, rotary=mha.Rotary(
            cos=torch.ones(3, 4, dtype=torch.float64), sin=torch.zeros(3, 4)))
    with pytest.raises(ValueError, match=r"rotary.sin is on meta"):
        mha.scaled_dot_product_attention(q, q, q, rotary=mha.Rotary(
            cos=torch.ones(3, 4), sin=torch.zeros(3, 4, device="meta")))
    with pytest.raises(mha.Error, match=r"rotary tables of positions 0 to 1"):
        mha.scaled_dot_product_attention(q, q, q, rotary=mha.Rotary(
            cos=torch.ones(2, 4), sin=torch.zeros(2, 4)))
    with pytest.raises(TypeError, match=r"give an mha.Rotary"):
        mha.scaled_dot_product_attention(q, q, q, rotary=(False, 0, 1e4, None, None))
    with pytest.raises(mha.Error, match=r"rotary_dim"):
        mha.scaled_dot_product_attention(q, q, q, rotary=mha.Rotary(rotary_dim=5))
