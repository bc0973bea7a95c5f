"""mha.rotary_embedding against transformers' apply_rotary_pos_emb (Llama's rotate-half, its cos
and sin computed as LlamaRotaryEmbedding computes them) and a float64 rotation (GPT-J's
interleaved pairs, partial rotary dims, tables)."""
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


def test_compile_fullgraph(seed):
    positions = torch.arange(5)

    def rotate(q, k):
        q, k = q.clone(), k.clone()
        mha.rotary_embedding(q, k, positions)
        return q + 0, k + 0

    q, k = torch.randn(5, 4, 16), torch.randn(5, 2, 16)
    torch.testing.assert_close(torch.compile(rotate, fullgraph=True)(q, k), rotate(q, k))
