"""A float64 NumPy reference of torch.nn.MultiheadAttention (batch first), and random modules:
shared by the NumPy API's tests and the Python fuzz harness."""
import numpy as np

import mha


def reference(query, key, value, weights, biases, num_heads, key_padding_mask=None,
              attn_mask=None, is_causal=False, average_attn_weights=True):
    """torch.nn.MultiheadAttention's definition in float64 (batch first, blocked = -1e9): masks
    bool (True = blocked) or float (added), attn_mask [Sq, Sk] or [B*H, Sq, Sk]. Returns the
    output and the weights, averaged over heads or per head."""
    # (float64 -inf - -inf is NaN where a row is -inf everywhere, as in PyTorch.)
    q, k, v = (x.astype(np.float64) @ w.T.astype(np.float64) + b
               for x, w, b in zip((query, key, value), weights[:3], biases[:3]))
    batch, query_len, embed_dim = q.shape
    key_len = k.shape[1]
    head_dim = embed_dim // num_heads

    def heads(x):
        return x.reshape(batch, -1, num_heads, head_dim).transpose(0, 2, 1, 3)

    scores = heads(q) @ heads(k).transpose(0, 1, 3, 2) / np.sqrt(head_dim)
    blocked = np.zeros(scores.shape, bool)
    added = np.zeros(scores.shape)
    masks = []
    if key_padding_mask is not None:
        masks.append(key_padding_mask[:, None, None, :])
    if attn_mask is not None:
        masks.append(attn_mask.reshape(batch, num_heads, query_len, key_len)
                     if attn_mask.ndim == 3 else attn_mask)
    # A boolean mask combined with a float one adds -inf where True, as PyTorch converts it (a
    # row it blocks everywhere is then NaN); alone, it blocks with -1e9.
    combined = any(mask.dtype != np.bool_ for mask in masks)
    for mask in masks:
        if mask.dtype == np.bool_ and combined:
            added = added + np.where(mask, -np.inf, 0.0)
        elif mask.dtype == np.bool_:
            blocked = blocked | mask
        else:
            added = added + mask
    scores = np.where(blocked, -1e9, scores + added)
    later = np.triu(np.ones((query_len, key_len), bool), 1) if is_causal else np.zeros((1, 1), bool)
    scores = np.where(later, -np.inf, scores)
    with np.errstate(invalid="ignore"):  # -inf - -inf: a row masked everywhere
        scores = np.exp(scores - scores.max(-1, keepdims=True))
    # Later keys weigh exactly 0, whatever the masks make of the others (a NaN row included).
    attention = np.where(later, 0.0, scores / scores.sum(-1, keepdims=True))
    context = (attention @ heads(v)).transpose(0, 2, 1, 3).reshape(batch, query_len, embed_dim)
    output = context @ weights[3].T.astype(np.float64) + biases[3]
    return output, attention.mean(1) if average_attn_weights else attention


def random_module(rng, embed_dim, num_heads):
    weights = [(rng.standard_normal((embed_dim, embed_dim)) / np.sqrt(embed_dim)).astype(np.float32)
               for _ in range(4)]
    biases = [rng.standard_normal(embed_dim).astype(np.float32) for _ in range(4)]
    module = mha.Attention(embed_dim, num_heads, *weights, q_bias=biases[0], k_bias=biases[1],
                           v_bias=biases[2], out_bias=biases[3])
    return module, weights, biases
