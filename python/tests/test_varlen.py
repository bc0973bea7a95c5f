"""mha.varlen_attention against torch's SDPA (float64) on each sequence alone: a packed prefill
as FlashAttention's flash_attn_varlen_func takes it, its keys and values then written into a paged
cache from the same rows, which a decode step reads."""
import pytest
import torch
import torch.nn.functional as F

import mha


def tolerance(dtype):
    return {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}[dtype]


def relative_error(got, want):
    got, want = got.double(), want.double()
    return ((got - want).norm() / want.norm()).item()


def offsets(lengths):
    return torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0, dtype=torch.int32)


def reference(q, k, v, cu_q, cu_k, causal):
    """Each sequence through SDPA in float64, causal bottom-right (its last query sees all)."""
    out = []
    for b in range(len(cu_q) - 1):
        qs = q[cu_q[b]:cu_q[b + 1]].double().transpose(0, 1)
        ks = k[cu_k[b]:cu_k[b + 1]].double().transpose(0, 1)
        vs = v[cu_k[b]:cu_k[b + 1]].double().transpose(0, 1)
        mask = None
        if causal:
            Sq, Sk = qs.shape[1], ks.shape[1]
            mask = torch.ones(Sq, Sk, dtype=torch.bool).tril(Sk - Sq)
        out.append(F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, enable_gqa=True)
                   .transpose(0, 1))
    return torch.cat(out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal", [False, True])
def test_matches_torch_per_sequence(seed, dtype, causal):
    q_lens, k_lens = [7, 1, 33, 12], [7, 9, 33, 40]
    cu_q, cu_k = offsets(q_lens), offsets(k_lens)
    # q, k and v as views of one fused projection's output [T, H + 2 Hkv, d], read in place.
    q = torch.randn(sum(q_lens), 8, 64).to(dtype)
    kv = torch.randn(sum(k_lens), 4, 64).to(dtype)
    k, v = kv[:, :2], kv[:, 2:]
    got = mha.varlen_attention(q, k, v, cu_q, cu_k, max(q_lens), max(k_lens), causal=causal)
    assert got.dtype == dtype and got.shape == (sum(q_lens), 8, 64)
    assert relative_error(got, reference(q, k, v, cu_q, cu_k, causal)) < tolerance(dtype)


def test_prefill_then_decode_over_a_paged_cache(seed):
    """Two prompts prefilled packed, written into a paged cache, then one decode step each."""
    lengths, heads, kv_heads, d, block = [13, 36], 4, 2, 32, 16
    tables = mha.PagedBlockTables(num_blocks=8, block_size=block, max_sequences=2,
                                  max_blocks_per_sequence=4)
    key_cache = torch.zeros(8, block, kv_heads, d)
    value_cache = torch.zeros(8, block, kv_heads, d)
    q = torch.randn(sum(lengths), heads, d)
    k, v = torch.randn(sum(lengths), kv_heads, d), torch.randn(sum(lengths), kv_heads, d)
    cu = offsets(lengths)
    out, lse = mha.varlen_attention(q, k, v, cu, cu, causal=True, return_lse=True)
    assert lse.shape == (heads, sum(lengths))
    assert relative_error(out, reference(q, k, v, cu, cu, True)) < 1e-5
    slots = []
    for seq, n in enumerate(lengths):
        tables.resize(seq, n + 1)
        slots += [tables.slot(seq, j) for j in range(n)]
    mha.write_paged_cache(k, v, key_cache, value_cache, torch.tensor(slots))
    # The step: each sequence's new token, its key and value written first.
    new_q = torch.randn(2, 1, heads, d)
    new_k, new_v = torch.randn(2, kv_heads, d), torch.randn(2, kv_heads, d)
    mha.write_paged_cache(new_k, new_v, key_cache, value_cache,
                          torch.tensor([tables.slot(s, n) for s, n in enumerate(lengths)]))
    step = mha.paged_attention(new_q, key_cache, value_cache, torch.tensor(tables.block_table),
                               torch.tensor(tables.sequence_lengths))
    for seq in range(2):
        rows = slice(cu[seq], cu[seq + 1])
        keys = torch.cat([k[rows], new_k[seq:seq + 1]]).double().transpose(0, 1)
        values = torch.cat([v[rows], new_v[seq:seq + 1]]).double().transpose(0, 1)
        want = F.scaled_dot_product_attention(new_q[seq].double().transpose(0, 1), keys, values,
                                              enable_gqa=True).transpose(0, 1)
        assert relative_error(step[seq], want) < 1e-5


def test_errors_name_the_argument():
    q, k = torch.randn(5, 2, 8), torch.randn(7, 1, 8)
    with pytest.raises(mha.Error, match=r"cu_seqlens_q\[1\] is 4 but query has 5 rows"):
        mha.varlen_attention(q, k, k, offsets([4]), offsets([7]))
    with pytest.raises(TypeError, match="cu_seqlens_k is torch.int64: it must be torch.int32"):
        mha.varlen_attention(q, k, k, offsets([5]), offsets([7]).long())


def test_compile_fullgraph_and_export(seed):
    q, k, v = torch.randn(20, 4, 16), torch.randn(20, 2, 16), torch.randn(20, 2, 16)
    cu = offsets([5, 15])

    def prefill(q, k, v):
        return mha.varlen_attention(q, k, v, cu, cu, causal=True, softcap=20.0,
                                    rotary=mha.Rotary(interleaved=True, rotary_dim=8))

    torch.testing.assert_close(torch.compile(prefill, fullgraph=True)(q, k, v), prefill(q, k, v))

    class Prefill(torch.nn.Module):
        def forward(self, q, k, v):
            return prefill(q, k, v)

    exported = torch.export.export(Prefill(), (q, k, v))
    assert "mha.varlen_attention" in str(exported.graph)
    torch.testing.assert_close(exported.module()(q, k, v), prefill(q, k, v))
