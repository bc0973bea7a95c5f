"""mha.paged_attention and mha.write_paged_cache against torch's SDPA (float64) on each sequence's
keys and values gathered from the blocks, in FlashAttention's and vLLM's cache layout; blocks
handed out by mha.PagedBlockTables."""
import pytest
import torch
import torch.nn.functional as F

import mha


def tolerance(dtype):
    return {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}[dtype]


def relative_error(got, want):
    got, want = got.double(), want.double()
    return ((got - want).norm() / want.norm()).item()


def paged_problem(lengths, heads, kv_heads, head_dim, block_size, dtype):
    """Sequences of `lengths` written token by token, in turns, into a shuffled pool."""
    tables = mha.PagedBlockTables(num_blocks=sum(-(-n // block_size) for n in lengths) + 4,
                                  block_size=block_size, max_sequences=len(lengths),
                                  max_blocks_per_sequence=max(-(-n // block_size) for n in lengths))
    shape = (tables.num_blocks, block_size, kv_heads, head_dim)
    key_cache, value_cache = torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)
    keys = [torch.randn(n, kv_heads, head_dim).to(dtype) for n in lengths]
    values = [torch.randn(n, kv_heads, head_dim).to(dtype) for n in lengths]
    for j in range(max(lengths)):
        for seq, n in enumerate(lengths):
            if j < n:
                tables.resize(seq, j + 1)
                mha.write_paged_cache(keys[seq][j:j + 1], values[seq][j:j + 1], key_cache,
                                      value_cache, torch.tensor([tables.slot(seq, j)]))
    return tables, key_cache, value_cache, keys, values


def reference(query, keys, values, window=None):
    """Each sequence's newest token over its keys: torch's SDPA in float64 with grouped heads."""
    out = []
    for b, (k, v) in enumerate(zip(keys, values)):
        if window is not None:
            k, v = k[-(window + 1):], v[-(window + 1):]
        q = query[b].double().transpose(0, 1)  # [H, 1, d]
        out.append(F.scaled_dot_product_attention(q, k.double().transpose(0, 1),
                                                  v.double().transpose(0, 1), enable_gqa=True)
                   .transpose(0, 1))
    return torch.stack(out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("head_dim,block_size", [(64, 16), (128, 32), (17, 1)])
def test_matches_torch_per_sequence(seed, dtype, head_dim, block_size):
    lengths = [1, 130, 47]
    tables, key_cache, value_cache, keys, values = paged_problem(lengths, 8, 2, head_dim,
                                                                 block_size, dtype)
    query = torch.randn(3, 1, 8, head_dim).to(dtype)
    got = mha.paged_attention(query, key_cache, value_cache, torch.tensor(tables.block_table),
                              torch.tensor(tables.sequence_lengths))
    assert got.dtype == dtype and got.shape == (3, 1, 8, head_dim)
    assert relative_error(got, reference(query, keys, values)) < tolerance(dtype)
    windowed = mha.paged_attention(query, key_cache, value_cache,
                                   torch.tensor(tables.block_table),
                                   torch.tensor(tables.sequence_lengths), window=20)
    assert relative_error(windowed, reference(query, keys, values, window=20)) < tolerance(dtype)


def test_lse_and_an_empty_sequence(seed):
    tables, key_cache, value_cache, keys, values = paged_problem([9, 4], 4, 4, 16, 16,
                                                                 torch.float32)
    tables.resize(1, 0)  # ended: its blocks back in the pool
    query = torch.randn(2, 1, 4, 16)
    out, lse = mha.paged_attention(query, key_cache, value_cache,
                                   torch.tensor(tables.block_table),
                                   torch.tensor(tables.sequence_lengths), return_lse=True)
    assert torch.all(out[1] == 0) and torch.all(lse[1] == -torch.inf)
    scores = torch.einsum("hd,jhd->hj", query[0, 0].double(), keys[0].double()) / 4.0
    torch.testing.assert_close(lse[0, :, 0].double(), torch.logsumexp(scores, -1), rtol=1e-5,
                               atol=1e-5)


@pytest.mark.parametrize("num_splits", [1, 2, 5])
def test_splits_merge_to_the_same_output_and_lse(seed, num_splits):
    lengths = [300, 1, 77]
    tables, key_cache, value_cache, keys, values = paged_problem(lengths, 4, 1, 32, 16,
                                                                 torch.float32)
    query = torch.randn(3, 1, 4, 32)
    out, lse = mha.paged_attention(query, key_cache, value_cache,
                                   torch.tensor(tables.block_table),
                                   torch.tensor(tables.sequence_lengths), num_splits=num_splits,
                                   return_lse=True)
    assert relative_error(out, reference(query, keys, values)) < 1e-5
    scores = torch.einsum("hd,jhd->hj", query[0, 0].double(), keys[0].double()) / 32 ** 0.5
    torch.testing.assert_close(lse[0, :, 0].double(), torch.logsumexp(scores, -1), rtol=1e-5,
                               atol=1e-5)


def test_write_skips_padding_slots_and_checks_the_rest():
    key_cache, value_cache = torch.zeros(2, 4, 1, 3), torch.zeros(2, 4, 1, 3)
    key = torch.arange(6.0).reshape(2, 1, 3)
    mha.write_paged_cache(key, key + 10, key_cache, value_cache, torch.tensor([5, -1]))
    assert torch.equal(key_cache[1, 1, 0], key[0, 0])
    assert torch.equal(value_cache[1, 1, 0], key[0, 0] + 10)
    assert key_cache.count_nonzero() == 2  # key 0 of token 0 is 0; token 1 skipped
    with pytest.raises(mha.Error, match=r"slot_mapping\[0\] is 8: the cache has slots 0 to 7"):
        mha.write_paged_cache(key, key, key_cache, value_cache, torch.tensor([8, 0]))
    with pytest.raises(TypeError, match="slot_mapping is torch.int32: it must be torch.int64"):
        mha.write_paged_cache(key, key, key_cache, value_cache, torch.tensor([0, 1],
                                                                             dtype=torch.int32))


def test_tables_give_blocks_back():
    tables = mha.PagedBlockTables(num_blocks=4, block_size=16, max_sequences=2,
                                  max_blocks_per_sequence=3)
    tables.resize(0, 33)
    assert tables.free_blocks == 1
    with pytest.raises(mha.Error, match="sequence 1 of 20 keys needs 2 more blocks; 1 are free"):
        tables.resize(1, 20)
    tables.resize(0, 0)
    assert tables.free_blocks == 4 and list(tables.sequence_lengths) == [0, 0]


def test_compile_fullgraph_and_export(seed):
    tables, key_cache, value_cache, keys, values = paged_problem([5, 30], 4, 2, 16, 16,
                                                                 torch.float32)
    table, lengths = torch.tensor(tables.block_table), torch.tensor(tables.sequence_lengths)
    query = torch.randn(2, 1, 4, 16)
    angles = torch.rand(32, 8)
    rotary = mha.Rotary(cos=angles.cos(), sin=angles.sin())

    def step(q, k_cache, v_cache, new_k, slots):
        mha.write_paged_cache(new_k, new_k, k_cache, v_cache, slots)
        return mha.paged_attention(q, k_cache, v_cache, table, lengths, softcap=5.0,
                                   rotary=rotary)

    new_k = keys[1][-1:].clone()
    slots = torch.tensor([tables.slot(1, 29)])
    eager = step(query, key_cache.clone(), value_cache.clone(), new_k, slots)
    compiled = torch.compile(step, fullgraph=True)
    torch.testing.assert_close(compiled(query, key_cache.clone(), value_cache.clone(), new_k,
                                        slots), eager)

    class Step(torch.nn.Module):
        def forward(self, q, k_cache, v_cache):
            return mha.paged_attention(q, k_cache, v_cache, table, lengths)

    exported = torch.export.export(Step(), (query, key_cache, value_cache))
    assert "mha.paged_attention" in str(exported.graph)
    torch.testing.assert_close(exported.module()(query, key_cache, value_cache),
                               mha.paged_attention(query, key_cache, value_cache, table, lengths))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_module_decode_over_a_paged_cache_matches_causal_forward(seed, dtype):
    """mha.MultiheadAttention.decode over an engine's paged cache: three sequences grown one
    token a step through PagedBlockTables, taking part in different steps (padding rows
    otherwise), each output that of forward() with is_causal over its sequence so far."""
    E, H, steps, block_size = 48, 6, 21, 16
    module = mha.MultiheadAttention(E, H, batch_first=True, dtype=dtype).eval()
    tables = mha.PagedBlockTables(num_blocks=6, block_size=block_size, max_sequences=3,
                                  max_blocks_per_sequence=2)
    shape = (tables.num_blocks, block_size, H, E // H)
    key_cache, value_cache = torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)
    tokens = torch.randn(3, steps, E).to(dtype)
    lengths = [0, 0, 0]
    for step in range(steps):
        active = [True, step % 3 != 1, step >= 4]
        slots = [-1, -1, -1]
        for b in range(3):
            if active[b]:
                tables.resize(b, lengths[b] + 1)
                slots[b] = tables.slot(b, lengths[b])
                lengths[b] += 1
        new = torch.stack([tokens[b, max(lengths[b] - 1, 0)] for b in range(3)]).unsqueeze(1)
        cache = mha.PagedDecodeCache(key_cache, value_cache, torch.tensor(tables.block_table),
                                     torch.tensor(tables.sequence_lengths), torch.tensor(slots))
        got = module.decode(new, cache)
        assert got.dtype == dtype and got.shape == (3, 1, E)
        for b in range(3):
            if not active[b]:
                assert not got[b].any()
                continue
            seq = tokens[b:b + 1, :lengths[b]]
            want, _ = module(seq, seq, seq, is_causal=True, need_weights=False)
            assert relative_error(got[b, 0], want[0, -1]) < 2 * tolerance(dtype)


def test_module_decode_over_a_paged_cache_rotates_each_new_token(seed):
    """A PagedDecodeCache with an mha.Rotary: each step rotates its new tokens' queries and keys
    at their positions (cache_seqlens - 1), here GPT-J's interleaved pairs over part of each head
    by caller-given tables, as make_cache(rotary=...) rotates them in a contiguous cache."""
    E, H, steps, block_size, rotary_dim = 48, 4, 9, 16, 6
    module = mha.MultiheadAttention(E, H, batch_first=True).eval()
    angles = torch.rand(32, rotary_dim // 2) * 6.28
    rotary = mha.Rotary(interleaved=True, rotary_dim=rotary_dim, cos=angles.cos(),
                        sin=angles.sin())
    tables = mha.PagedBlockTables(num_blocks=4, block_size=block_size, max_sequences=2,
                                  max_blocks_per_sequence=2)
    shape = (tables.num_blocks, block_size, H, E // H)
    key_cache, value_cache = torch.zeros(shape), torch.zeros(shape)
    contiguous = module.make_cache(2, steps, rotary=rotary)
    tokens = torch.randn(2, steps, E)
    for step in range(steps):
        slots = []
        for b in range(2):
            tables.resize(b, step + 1)
            slots.append(tables.slot(b, step))
        cache = mha.PagedDecodeCache(key_cache, value_cache, torch.tensor(tables.block_table),
                                     torch.tensor(tables.sequence_lengths), torch.tensor(slots),
                                     rotary)
        got = module.decode(tokens[:, step:step + 1], cache)
        want = module.decode(tokens[:, step:step + 1], contiguous)
        assert relative_error(got, want) < 1e-5


def test_module_decode_checks_the_paged_cache():
    module = mha.MultiheadAttention(16, 2, batch_first=True, dtype=torch.bfloat16).eval()
    tables = mha.PagedBlockTables(num_blocks=2, block_size=16, max_sequences=1,
                                  max_blocks_per_sequence=1)
    tables.resize(0, 1)
    pages = torch.zeros(2, 16, 2, 8, dtype=torch.float16)
    table, lengths = torch.tensor(tables.block_table), torch.tensor(tables.sequence_lengths)
    slots = torch.tensor([tables.slot(0, 0)])
    token = torch.randn(1, 1, 16).to(torch.bfloat16)
    with pytest.raises(mha.Error, match="a f16 cache for a bf16 module"):
        module.decode(token, mha.PagedDecodeCache(pages, pages, table, lengths, slots))
    pages = pages.to(torch.bfloat16)
    with pytest.raises(TypeError, match="slot_mapping is torch.int32: it must be torch.int64"):
        module.decode(token, mha.PagedDecodeCache(pages, pages, table, lengths, slots.int()))
    with pytest.raises(ValueError, match="takes no key_padding_mask or new_tokens"):
        module.decode(token, mha.PagedDecodeCache(pages, pages, table, lengths, slots),
                      new_tokens=[1])
    assert not pages.any()
