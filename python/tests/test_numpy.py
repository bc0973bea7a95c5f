"""The NumPy API, without PyTorch: against a float64 NumPy reference."""
import numpy as np
import pytest

import mha


def reference(query, key, value, weights, biases, num_heads, key_padding_mask=None,
              attn_mask=None, is_causal=False):
    """torch.nn.MultiheadAttention's definition in float64 (batch first, blocked = -1e9)."""
    q, k, v = (x.astype(np.float64) @ w.T.astype(np.float64) + b
               for x, w, b in zip((query, key, value), weights[:3], biases[:3]))
    batch, query_len, embed_dim = q.shape
    key_len = k.shape[1]
    head_dim = embed_dim // num_heads

    def heads(x):
        return x.reshape(batch, -1, num_heads, head_dim).transpose(0, 2, 1, 3)

    scores = heads(q) @ heads(k).transpose(0, 1, 3, 2) / np.sqrt(head_dim)
    blocked = np.zeros(scores.shape, bool)
    if key_padding_mask is not None:
        blocked |= key_padding_mask[:, None, None, :]
    if attn_mask is not None:
        blocked |= attn_mask
    if is_causal:
        blocked |= np.triu(np.ones((query_len, key_len), bool), 1)
    scores = np.where(blocked, -1e9, scores)
    scores = np.exp(scores - scores.max(-1, keepdims=True))
    attention = scores / scores.sum(-1, keepdims=True)
    context = (attention @ heads(v)).transpose(0, 2, 1, 3).reshape(batch, query_len, embed_dim)
    return context @ weights[3].T.astype(np.float64) + biases[3], attention.mean(1)


def random_module(rng, embed_dim, num_heads):
    weights = [(rng.standard_normal((embed_dim, embed_dim)) / np.sqrt(embed_dim)).astype(np.float32)
               for _ in range(4)]
    biases = [rng.standard_normal(embed_dim).astype(np.float32) for _ in range(4)]
    module = mha.Attention(embed_dim, num_heads, *weights, q_bias=biases[0], k_bias=biases[1],
                           v_bias=biases[2], out_bias=biases[3])
    return module, weights, biases


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
    with pytest.raises(mha.Error, match="embed_dim 9 is not divisible by num_heads 2"):
        mha.Attention(9, 2, *(np.zeros((9, 9), np.float32),) * 4)
