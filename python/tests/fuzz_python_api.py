"""An atheris (libFuzzer for Python) harness over the Python package's entry points: mha.Attention's
constructor and call, make_cache and decode steps (the NumPy API, which mha.MultiheadAttention
calls through the same extension).

Each input describes a module and a call, and most inputs corrupt one argument the way Python
callers do: another dtype, a rank too many or too few, None, a list, an integer out of any range,
a mask of the wrong type or shape, bad decode counts. Valid inputs in unusual layouts (strided
and Fortran-ordered arrays) are not corruptions. The oracle: a corrupted call raises TypeError,
ValueError (mha.Error is one) or OverflowError; a valid call returns what the float64 NumPy
reference computes. Anything else, an interpreter crash included, is a finding.

    python fuzz_python_api.py -runs=100000            (tests/test_fuzz.py runs it in CI)
"""
import sys

import atheris
import numpy as np

with atheris.instrument_imports(include=["mha"]):
    import mha

from numpy_reference import reference

EXPECTED_ERRORS = (TypeError, ValueError, OverflowError)
UNUSUAL_INTEGERS = (0, -1, 2**31, 2**32 + 1, 2**63 - 1, 2**63, -2**63 - 1, 2**80)


class Finding(Exception):
    """What the harness found; atheris reports it with the input."""


@atheris.instrument_func  # its branches guide the search too
def unusual_layout(fdp, array):
    """The same values in another memory layout (a valid argument)."""
    choice = fdp.ConsumeIntInRange(0, 2)
    if choice == 1:  # strided: every other element of a larger array
        wide = np.zeros(array.shape[:-1] + (2 * array.shape[-1],), array.dtype)
        wide[..., ::2] = array
        return wide[..., ::2]
    if choice == 2:
        return np.asfortranarray(array)
    return array


@atheris.instrument_func
def corrupted(fdp, array):
    """`array` made into something no call takes."""
    choice = fdp.ConsumeIntInRange(0, 5)
    if choice == 0:
        return array.astype(fdp.PickValueInList([np.float64, np.float16, np.int32, np.bool_]))
    if choice == 1:
        return array[..., None]  # one rank too many
    if choice == 2:
        return array.reshape(-1) if array.ndim > 1 else array.reshape(1, 1, -1, 1)
    if choice == 3:
        return None
    if choice == 4:
        return array.tolist()  # float64 once NumPy converts it
    return np.zeros(array.shape[:-1] + (array.shape[-1] + 1,), array.dtype)  # one too wide


@atheris.instrument_func
def valid_mask(name, mask, batch, heads, query_len, key_len):
    """Whether a call takes `mask` as its `name`."""
    if mask is None:
        return True
    mask = np.asarray(mask)
    if mask.dtype not in (np.bool_, np.float32):
        return False
    if name == "key_padding_mask":
        return mask.shape == (batch, key_len)
    return mask.shape in ((query_len, key_len), (batch * heads, query_len, key_len))


@atheris.instrument_func
def fuzz_forward(fdp, rng, arrays, module, weights, biases, num_heads):
    batch = fdp.ConsumeIntInRange(1, 3)
    query_len = fdp.ConsumeIntInRange(1, 7)
    key_len = fdp.ConsumeIntInRange(1, 7)
    embed_dim = weights[0].shape[0]
    query = rng.standard_normal((batch, query_len, embed_dim)).astype(np.float32)
    key = rng.standard_normal((batch, key_len, embed_dim)).astype(np.float32)
    value = rng.standard_normal((batch, key_len, embed_dim)).astype(np.float32)
    kwargs = {"need_weights": fdp.ConsumeBool(), "average_attn_weights": fdp.ConsumeBool(),
              "is_causal": fdp.ConsumeBool()}
    if fdp.ConsumeBool():
        padding = rng.random((batch, key_len)) < 0.3
        padding[:, 0] = False  # every query sees a key
        kwargs["key_padding_mask"] = (padding if fdp.ConsumeBool()
                                      else (rng.random((batch, key_len)) - 0.5).astype(np.float32))
    if fdp.ConsumeBool():
        shape = (query_len, key_len) if fdp.ConsumeBool() else (batch * num_heads, query_len,
                                                                 key_len)
        attn = rng.random(shape) < 0.3
        attn[..., 0] = False
        kwargs["attn_mask"] = attn if fdp.ConsumeBool() else (rng.random(shape) - 0.5).astype(
            np.float32)
    inputs = {"query": query, "key": key, "value": value}
    inputs.update({name: kwargs[name] for name in ("key_padding_mask", "attn_mask")
                   if name in kwargs})
    corrupt = arrays.corrupt_one and fdp.ConsumeBool()
    names = sorted(inputs)
    target = names[fdp.ConsumeIntInRange(0, len(names) - 1)]
    call = dict(inputs)
    for name in names:
        call[name] = unusual_layout(fdp, call[name])
    if corrupt:
        call[target] = corrupted(fdp, inputs[target])
        if target.endswith("mask") and valid_mask(target, call[target], batch, num_heads,
                                                  query_len, key_len):
            corrupt = False  # e.g. no mask, or a float mask made boolean: still a valid call
            if call[target] is None:
                del inputs[target], call[target]
            else:
                inputs[target] = np.asarray(call[target])
    args = {name: call[name] for name in ("key_padding_mask", "attn_mask") if name in call}
    try:
        output, attention = module(call["query"], call["key"], call["value"], **args,
                                   need_weights=kwargs["need_weights"],
                                   average_attn_weights=kwargs["average_attn_weights"],
                                   is_causal=kwargs["is_causal"])
    except EXPECTED_ERRORS:
        if not corrupt:
            raise
        return
    if corrupt:
        raise Finding(f"a corrupted {target} was accepted: {call[target]!r}"[:400])
    want, want_attention = reference(query, key, value, weights, biases, num_heads,
                                     key_padding_mask=inputs.get("key_padding_mask"),
                                     attn_mask=inputs.get("attn_mask"),
                                     is_causal=kwargs["is_causal"],
                                     average_attn_weights=kwargs["average_attn_weights"])
    np.testing.assert_allclose(output, want, atol=1e-5, rtol=1e-4)
    if kwargs["need_weights"]:
        np.testing.assert_allclose(attention, want_attention, atol=1e-6)


@atheris.instrument_func
def fuzz_decode(fdp, rng, arrays, module, weights, biases, num_heads):
    embed_dim = weights[0].shape[0]
    batch = fdp.ConsumeIntInRange(1, 3)
    capacity = fdp.ConsumeIntInRange(1, 9)
    if arrays.corrupt_one and fdp.ConsumeIntInRange(0, 3) == 0:
        bad = fdp.PickValueInList(list(UNUSUAL_INTEGERS))
        try:
            module.make_cache(bad, capacity) if fdp.ConsumeBool() else module.make_cache(batch, bad)
        except EXPECTED_ERRORS:
            return
        raise Finding(f"make_cache accepted {bad}")
    cache = module.make_cache(batch, capacity)
    sequence = np.zeros((batch, 0, embed_dim), np.float32)
    for _ in range(fdp.ConsumeIntInRange(1, 3)):
        n = fdp.ConsumeIntInRange(1, 3)
        tokens = rng.standard_normal((batch, n, embed_dim)).astype(np.float32)
        fits = sequence.shape[1] + n <= capacity
        corrupt = arrays.corrupt_one and fdp.ConsumeBool()
        call_tokens, new_tokens = tokens, ()
        if corrupt and fdp.ConsumeBool():
            call_tokens = corrupted(fdp, tokens)
        elif corrupt:
            new_tokens = [fdp.PickValueInList([n + 1, -1, 2**63, n])] * (batch + fdp.ConsumeIntInRange(0, 1))
            corrupt = new_tokens != [n] * batch
        lengths = list(cache.lengths)
        try:
            output = module.decode(unusual_layout(fdp, call_tokens) if not corrupt else call_tokens,
                                   cache, new_tokens=new_tokens)
        except EXPECTED_ERRORS:
            if not corrupt and fits:
                raise
            if list(cache.lengths) != lengths:
                raise Finding("a failed decode step changed the cache")
            continue
        if corrupt or not fits:
            raise Finding("a decode step that cannot be taken was accepted")
        sequence = np.concatenate([sequence, tokens], axis=1)
        want, _ = reference(sequence, sequence, sequence, weights, biases, num_heads,
                            is_causal=True)
        np.testing.assert_allclose(output, want[:, -n:], atol=1e-5, rtol=1e-4)


class Arrays:
    corrupt_one = False


@atheris.instrument_func
def test_one_input(data):
    fdp = atheris.FuzzedDataProvider(data)
    rng = np.random.default_rng(fdp.ConsumeIntInRange(0, 2**16))
    num_heads = fdp.ConsumeIntInRange(1, 4)
    embed_dim = num_heads * fdp.ConsumeIntInRange(1, 5)
    arrays = Arrays()
    arrays.corrupt_one = fdp.ConsumeBool()
    weights = [(rng.standard_normal((embed_dim, embed_dim)) / np.sqrt(embed_dim)).astype(np.float32)
               for _ in range(4)]
    biases = [rng.standard_normal(embed_dim).astype(np.float32) for _ in range(4)]
    # The constructor: one of its arguments corrupted, or a valid module.
    if arrays.corrupt_one and fdp.ConsumeIntInRange(0, 3) == 0:
        args = [embed_dim, num_heads, *weights]
        slot = fdp.ConsumeIntInRange(0, len(args) - 1)
        args[slot] = (fdp.PickValueInList(list(UNUSUAL_INTEGERS)) if slot < 2
                      else corrupted(fdp, weights[slot - 2]))
        try:
            mha.Attention(*args, q_bias=biases[0], k_bias=biases[1], v_bias=biases[2],
                          out_bias=biases[3])
        except EXPECTED_ERRORS:
            return
        if slot == 1 and args[1] >= 1 and embed_dim % args[1] == 0:
            return  # another valid head count
        if slot in (3, 4) and isinstance(args[slot], np.ndarray) and args[slot].ndim == 2 and \
                args[slot].dtype == np.float32:
            return  # a key or value projection of other input features (kdim, vdim)
        raise Finding(f"the constructor accepted argument {slot} = {args[slot]!r}"[:400])
    module = mha.Attention(embed_dim, num_heads,
                           *(unusual_layout(fdp, w) for w in weights),
                           q_bias=biases[0], k_bias=biases[1], v_bias=biases[2],
                           out_bias=biases[3])
    if fdp.ConsumeBool():
        fuzz_decode(fdp, rng, arrays, module, weights, biases, num_heads)
    else:
        fuzz_forward(fdp, rng, arrays, module, weights, biases, num_heads)


if __name__ == "__main__":
    mha.set_num_threads(1)
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()
