"""The NumPy API, without PyTorch: against a float64 NumPy reference."""
import numpy as np
import pytest

import mha
from numpy_reference import random_module, reference


@pytest.mark.parametrize("batch,query_len,key_len,embed_dim,num_heads",
                         [(1, 1, 1, 4, 1), (2, 7, 13, 30, 5), (3, 17, 17, 64, 8)])
def test_matches_reference(seed, batch, query_len, key_len, embed_dim, num_heads):
    rng = np.random.default_rng(seed)
    module, weights, biases = random_module(rng, embed_dim, num_heads)
    query = rng.standard_normal((batch, query_len, embed_dim), np.float32)
    key = rng.standard_normal((batch, key_len, embed_dim), np.float32)
    padding = rng.random((batch, key_len)) < 0.3
    padding[:, 0] = False
    output, attention = module(query, key, key, key_padding_mask=padding, need_weights=True)
    expected, expected_attention = reference(query, key, key, weights, biases, num_heads,
                                             key_padding_mask=padding)
    np.testing.assert_allclose(output, expected, atol=1e-5, rtol=1e-4)
    np.testing.assert_allclose(attention, expected_attention, atol=1e-6)
    np.testing.assert_allclose(attention.sum(-1), 1, atol=1e-5)


def test_decode_steps_match_causal_attention(seed):
    rng = np.random.default_rng(seed)
    module, weights, biases = random_module(rng, 24, 3)
    tokens = rng.standard_normal((2, 6, 24), np.float32)
    cache = module.make_cache(batch=2, capacity=8)
    outputs = [module.decode(tokens[:, :4], cache)]
    outputs += [module.decode(tokens[:, i:i + 1], cache) for i in (4, 5)]
    expected, _ = reference(tokens, tokens, tokens, weights, biases, 3, is_causal=True)
    np.testing.assert_allclose(np.concatenate(outputs, axis=1), expected, atol=1e-5, rtol=1e-4)
    with pytest.raises(mha.Error, match="capacity"):
        module.decode(tokens[:, :3], cache)
    assert cache.lengths == [6, 6]  # the failed step left the cache as it was


def test_errors_name_the_argument():
    rng = np.random.default_rng(0)
    module, _, _ = random_module(rng, 8, 2)
    x = np.zeros((1, 3, 8), np.float32)
    with pytest.raises(TypeError, match="query is float64"):
        module(x.astype(np.float64), x, x)
    with pytest.raises(mha.Error, match="value"):
        module(x, x, np.zeros((1, 4, 8), np.float32))
    # A key of another rank with weights asked for (found by fuzz_python_api.py: an IndexError).
    with pytest.raises(ValueError, match="key has shape"):
        module(x, np.zeros(8, np.float32), x, need_weights=True)
    with pytest.raises(mha.Error, match="embed_dim 9 is not divisible by num_heads 2"):
        mha.Attention(9, 2, *(np.zeros((9, 9), np.float32),) * 4)
