"""mha.MultiheadAttention against torch.nn.MultiheadAttention, argument by argument."""
import copy as copy_module
import itertools
import pickle

import pytest
import torch
import torch.nn.functional as F

import mha

# What the library calls each dtype.
DTYPE_NAMES = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}

# (batch, query tokens, key tokens, embed_dim, heads): primes, 1, head_dim 1, non-multiples of
# the vector width.
SHAPES = [(1, 1, 1, 8, 1), (2, 5, 7, 12, 3), (3, 17, 13, 64, 4), (2, 31, 31, 96, 8),
          (1, 3, 9, 7, 7)]
MASKS = ["none", "key_padding_bool", "key_padding_float", "attn_bool_2d", "attn_float_3d",
         "both", "causal"]


def reference(module, *args, **kwargs):
    """torch.nn.MultiheadAttention's general path (with autograd on, its fast path, which
    zeroes padded rows of nested tensors, is not taken)."""
    with torch.enable_grad():
        output, weights = module(*args, **kwargs)
    return output.detach(), None if weights is None else weights.detach()


def make_masks(kind, batch, heads, query_len, key_len):
    """PyTorch masks of `kind`; key 0 is never blocked (a row blocked everywhere is NaN in
    PyTorch and uniform in mha)."""
    def blocked(*shape):
        mask = torch.rand(*shape) < 0.3
        mask[..., 0] = False
        return mask

    masks = {}
    if kind in ("key_padding_bool", "both"):
        masks["key_padding_mask"] = blocked(batch, key_len)
    if kind == "key_padding_float":
        masks["key_padding_mask"] = torch.randn(batch, key_len)
    if kind == "attn_bool_2d":
        masks["attn_mask"] = blocked(query_len, key_len)
    if kind in ("attn_float_3d", "both"):
        masks["attn_mask"] = torch.randn(batch * heads, query_len, key_len)
    if kind == "causal":
        masks["attn_mask"] = torch.ones(query_len, key_len, dtype=torch.bool).triu(1)
        masks["is_causal"] = True
    return masks


@pytest.mark.filterwarnings("ignore:Support for mismatched key_padding_mask and attn_mask")
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("batch_first", [True, False])
def test_matches_torch(seed, shape, mask, batch_first):
    batch, query_len, key_len, embed_dim, heads = shape
    if mask == "causal" and query_len != key_len:
        query_len = key_len
    theirs = torch.nn.MultiheadAttention(embed_dim, heads, batch_first=batch_first).eval()
    with torch.no_grad():
        theirs.in_proj_bias.normal_()
        theirs.out_proj.bias.normal_()
    ours = mha.MultiheadAttention.from_torch(theirs).eval()

    def sequence(length):
        x = torch.randn(batch, length, embed_dim)
        return x if batch_first else x.transpose(0, 1)

    query, key = sequence(query_len), sequence(key_len)
    value = sequence(key_len)
    masks = make_masks(mask, batch, heads, query_len, key_len)
    for need_weights, average in itertools.product([True, False], [True, False]):
        kwargs = dict(masks, need_weights=need_weights, average_attn_weights=average)
        expected, expected_weights = reference(theirs, query, key, value, **kwargs)
        with torch.no_grad():
            output, weights = ours(query, key, value, **kwargs)
        torch.testing.assert_close(output, expected, atol=2e-5, rtol=1e-4)
        assert (weights is None) == (expected_weights is None)
        if weights is not None:
            torch.testing.assert_close(weights, expected_weights, atol=2e-6, rtol=1e-4)


@pytest.mark.parametrize("kdim,vdim,bias", [(5, 11, True), (64, 64, False), (3, 64, False)])
def test_kdim_vdim_and_no_bias(seed, kdim, vdim, bias):
    theirs = torch.nn.MultiheadAttention(64, 4, bias=bias, kdim=kdim, vdim=vdim,
                                         batch_first=True).eval()
    ours = mha.MultiheadAttention.from_torch(theirs)
    query, key, value = torch.randn(2, 9, 64), torch.randn(2, 13, kdim), torch.randn(2, 13, vdim)
    expected, expected_weights = reference(theirs, query, key, value)
    output, weights = ours(query, key, value)
    torch.testing.assert_close(output, expected, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(weights, expected_weights, atol=2e-6, rtol=1e-4)


def test_unbatched_input(seed):
    theirs = torch.nn.MultiheadAttention(16, 2).eval()
    ours = mha.MultiheadAttention.from_torch(theirs)
    query, key = torch.randn(5, 16), torch.randn(7, 16)
    padding = torch.tensor([False, True, False, False, True, False, False])
    expected, expected_weights = reference(theirs, query, key, key, key_padding_mask=padding)
    output, weights = ours(query, key, key, key_padding_mask=padding)
    torch.testing.assert_close(output, expected, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(weights, expected_weights, atol=2e-6, rtol=1e-4)


def test_state_dict_loads_both_ways(seed):
    theirs = torch.nn.MultiheadAttention(24, 3, kdim=10, vdim=6)
    ours = mha.MultiheadAttention(24, 3, kdim=10, vdim=6)
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    ours.load_state_dict(theirs.state_dict())
    back = torch.nn.MultiheadAttention(24, 3, kdim=10, vdim=6)
    back.load_state_dict(ours.state_dict())
    for name, tensor in theirs.state_dict().items():
        assert torch.equal(back.state_dict()[name], tensor), name


def test_parameter_changes_are_seen(seed):
    """The prepacked weights follow in-place updates and load_state_dict."""
    ours = mha.MultiheadAttention(16, 4, batch_first=True).eval()
    x = torch.randn(1, 3, 16)
    before, _ = ours(x, x, x)
    with torch.no_grad():
        ours.out_proj.bias.add_(1.0)
    after, _ = ours(x, x, x)
    torch.testing.assert_close(after, before + 1.0, atol=1e-5, rtol=1e-5)
    theirs = torch.nn.MultiheadAttention(16, 4, batch_first=True).eval()
    ours.load_state_dict(theirs.state_dict())
    torch.testing.assert_close(ours(x, x, x)[0], reference(theirs, x, x, x)[0], atol=2e-5,
                               rtol=1e-4)


def test_copies_have_their_own_weights(seed):
    ours = mha.MultiheadAttention(16, 2, batch_first=True).eval()
    x = torch.randn(1, 4, 16)
    before, _ = ours(x, x, x)
    copy = pickle.loads(pickle.dumps(copy_module.deepcopy(ours)))
    assert copy._module_id != ours._module_id
    with torch.no_grad():
        copy.out_proj.bias.add_(1.0)
    torch.testing.assert_close(copy(x, x, x)[0], before + 1.0, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours(x, x, x)[0], before)


def test_is_causal_without_mask(seed):
    ours = mha.MultiheadAttention(32, 4, batch_first=True).eval()
    theirs = torch.nn.MultiheadAttention(32, 4, batch_first=True).eval()
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(2, 11, 32)
    causal = torch.ones(11, 11, dtype=torch.bool).triu(1)
    expected, _ = reference(theirs, x, x, x, attn_mask=causal)
    torch.testing.assert_close(ours(x, x, x, is_causal=True)[0], expected, atol=2e-5, rtol=1e-4)


def test_contiguous_inputs_are_not_copied():
    x = torch.randn(2, 3, 8)
    assert mha._torch._array(x).__array_interface__["data"][0] == x.data_ptr()
    assert mha._torch._array(x.transpose(0, 1)).flags.c_contiguous


@pytest.mark.parametrize("argument,value", [("add_bias_kv", True), ("add_zero_attn", True),
                                            ("dtype", torch.float64), ("device", "meta")])
def test_unsupported_constructor_arguments_are_named(argument, value):
    with pytest.raises(NotImplementedError, match=argument):
        mha.MultiheadAttention(8, 2, **{argument: value})


def test_dropout_in_training_is_named():
    module = mha.MultiheadAttention(8, 2, dropout=0.1)
    x = torch.randn(3, 1, 8)
    with pytest.raises(NotImplementedError, match="dropout"):
        module(x, x, x)
    module.eval()(x, x, x)  # dropout does nothing in evaluation


def test_bad_inputs_are_clear_errors():
    module = mha.MultiheadAttention(8, 2, batch_first=True)
    x = torch.randn(1, 3, 8)
    with pytest.raises(TypeError, match="query is torch.float64"):
        module(x.double(), x, x)
    with pytest.raises(TypeError, match="attn_mask is torch.int32"):
        module(x, x, x, attn_mask=torch.zeros(3, 3, dtype=torch.int32))
    with pytest.raises(mha.Error, match="key"):
        module(x, torch.randn(1, 3, 5), x)
    with pytest.raises(ValueError, match="not divisible"):
        mha.MultiheadAttention(10, 3)
    # A key of another rank (found by fuzz_python_api.py: an IndexError before).
    with pytest.raises(ValueError, match="all must be 3-D"):
        module(x, torch.randn(3, 8), x)


def test_decode_matches_causal_forward(seed):
    module = mha.MultiheadAttention(48, 6, batch_first=True).eval()
    with torch.no_grad():
        module.in_proj_bias.normal_()
    tokens = torch.randn(2, 9, 48)
    expected, _ = module(tokens, tokens, tokens, is_causal=True, need_weights=False)
    cache = module.make_cache(2, 16)
    prompt = module.decode(tokens[:, :5], cache)
    steps = [module.decode(tokens[:, i:i + 1], cache) for i in range(5, 9)]
    assert cache.lengths == [9, 9]
    torch.testing.assert_close(torch.cat([prompt, *steps], dim=1), expected, atol=2e-5,
                               rtol=1e-4)


def test_decode_rotates_queries_and_keys_as_llama_does(seed):
    """With make_cache(rotary=mha.Rotary(...)), each step rotates its new queries and keys at
    their positions before the keys are cached: the outputs are those of transformers'
    apply_rotary_pos_emb (Llama's rotate-half, cos and sin as LlamaRotaryEmbedding computes them)
    on the projections, then causal attention, whatever the steps."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    E, H, theta, T = 64, 4, 500000.0, 11
    d = E // H
    module = mha.MultiheadAttention(E, H, batch_first=True).eval()
    tokens = torch.randn(2, T, E)
    cache = module.make_cache(2, 16, rotary=mha.Rotary(theta=theta))
    assert cache.rotary
    outputs = torch.cat([module.decode(tokens[:, :6], cache),
                         *(module.decode(tokens[:, i:i + 1], cache) for i in range(6, T))], 1)
    with torch.no_grad():
        q, k, v = F.linear(tokens, module.in_proj_weight, module.in_proj_bias).chunk(3, -1)
        q, k, v = (x.unflatten(-1, (H, d)).transpose(1, 2) for x in (q, k, v))
        inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
        freqs = torch.arange(T).float()[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        q, k = apply_rotary_pos_emb(q, k, emb.cos()[None], emb.sin()[None])
        context = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        want = module.out_proj(context.transpose(1, 2).flatten(2))
    assert ((outputs - want).norm() / want.norm()).item() < 2e-5
    assert not module.make_cache(1, 4).rotary
    with pytest.raises(mha.Error, match="rotary_dim 3 must be even"):
        module.make_cache(1, 4, rotary=mha.Rotary(rotary_dim=3))
    with pytest.raises(TypeError, match="give an mha.Rotary"):
        module.make_cache(1, 4, rotary={"theta": 10.0})


@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float16])
def test_decode_with_a_sixteen_bit_cache(seed, cache_dtype):
    """A float32 module's cache may hold its keys and values in 16 bits: the outputs are those
    of keys and values rounded to that type. Weights on a grid of 2^-8 and tokens on one of 2^-6
    (within [-1, 1]) make the projections exact in float32, so that both sides round the same
    keys and values."""
    module = mha.MultiheadAttention(40, 5, batch_first=True).eval()
    with torch.no_grad():
        for p in module.parameters():
            p.copy_((p.clamp(-1, 1) * 256).round() / 256)
    tokens = ((torch.rand(2, 7, 40) * 2 - 1) * 64).round() / 64
    cache = module.make_cache(2, 9, dtype=cache_dtype)
    assert cache.dtype == DTYPE_NAMES[cache_dtype]
    assert module.make_cache(2, 9).dtype == "f32"
    outputs = torch.cat([module.decode(tokens[:, :4], cache),
                         *(module.decode(tokens[:, i:i + 1], cache) for i in range(4, 7))], 1)
    with torch.no_grad():
        q, k, v = F.linear(tokens, module.in_proj_weight, module.in_proj_bias).chunk(3, -1)
        heads = [x.unflatten(-1, (5, 8)).transpose(1, 2) for x in (q, k, v)]
        rounded = [heads[0]] + [x.to(cache_dtype).float() for x in heads[1:]]
        context = F.scaled_dot_product_attention(*rounded, is_causal=True)
        want = module.out_proj(context.transpose(1, 2).flatten(2))
        unrounded, _ = module(tokens, tokens, tokens, is_causal=True, need_weights=False)
    assert ((outputs - want).norm() / want.norm()).item() < 1e-5
    assert ((outputs - unrounded).norm() / unrounded.norm()).item() > 1e-4
    with pytest.raises(TypeError, match="it holds float32, bfloat16, float16 or int8"):
        module.make_cache(2, 9, dtype=torch.uint8)


@pytest.mark.parametrize("module_dtype", [torch.float32, torch.bfloat16])
def test_decode_with_an_int8_cache(seed, module_dtype):
    """An int8 cache holds each token's key and value heads quantized, one scale each: the steps'
    outputs stay within 2e-2 (relative L2) of the module's causal forward pass."""
    module = mha.MultiheadAttention(64, 4, batch_first=True).to(module_dtype).eval()
    tokens = torch.randn(2, 40, 64).to(module_dtype)
    cache = module.make_cache(2, 40, dtype=torch.int8)
    assert cache.dtype == "int8"
    outputs = torch.cat([module.decode(tokens[:, :37], cache),
                         *(module.decode(tokens[:, i:i + 1], cache) for i in range(37, 40))], 1)
    with torch.no_grad():
        want, _ = module(tokens, tokens, tokens, is_causal=True, need_weights=False)
    assert outputs.dtype == module_dtype
    error = ((outputs.float() - want.float()).norm() / want.float().norm()).item()
    assert 1e-5 < error < 2e-2


def test_tuned_schedules_name_the_dispatched_isas_tuning():
    """Each linked instruction set says whose tuned parameters it runs here, and why."""
    schedules = {s["isa"]: s for s in mha.tuned_schedules()}
    f32 = schedules[mha.dispatched_isa()]
    assert f32["why"]
    assert (f32["tuned_cpu"] == "defaults") == (f32["tuned_on"] == "")


def test_dispatched_isa_names_each_dtypes_kernels():
    """bf16 runs its own instruction set where the CPU and the build have one, else the f32 one;
    f16 always the f32 one."""
    f32 = mha.dispatched_isa()
    assert mha.dispatched_isa("f32") == f32 and mha.dispatched_isa("f16") == f32
    assert mha.dispatched_isa("bf16") in {f32, "amx", "avx512bf16"}
    with pytest.raises(TypeError, match="dtype f8 is none of f32, bf16, f16"):
        mha.dispatched_isa("f8")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_sixteen_bit_modules_match_float32_on_the_rounded_values(seed, dtype):
    """A module of a 16-bit dtype takes and returns tensors of it, and computes what a float32
    module computes on its rounded weights and inputs (to the 16-bit output's rounding; bf16 on a
    CPU with bf16 products rounds their operands too: 1e-2)."""
    theirs = torch.nn.MultiheadAttention(64, 4, batch_first=True).eval()
    ours = mha.MultiheadAttention.from_torch(theirs.to(dtype))
    assert ours.in_proj_weight.dtype == dtype
    x = torch.randn(2, 9, 64).to(dtype)
    padding = torch.zeros(2, 9, dtype=torch.bool)
    padding[1, 6:] = True
    output, weights = ours(x, x, x, key_padding_mask=padding)
    assert output.dtype == dtype and weights.dtype == dtype
    want, want_weights = theirs.float()(x.float(), x.float(), x.float(), key_padding_mask=padding)
    error = ((output.float() - want).norm() / want.norm()).item()
    assert error < 1e-2
    assert ((weights.float() - want_weights).norm() / want_weights.norm()).item() < 1e-2
    cache = ours.make_cache(2, 16)
    step = ours.decode(x[:, :4], cache)
    assert step.dtype == dtype and cache.lengths == [4, 4] and cache.dtype == DTYPE_NAMES[dtype]
    other = torch.float16 if dtype == torch.bfloat16 else torch.bfloat16
    with pytest.raises(mha.Error, match=f"a {DTYPE_NAMES[other]} cache for a {DTYPE_NAMES[dtype]}"):
        ours.make_cache(2, 16, dtype=other)
    with pytest.raises(TypeError, match="query is torch.float32"):
        ours(x.float(), x.float(), x.float())
