"""The NumPy API: arrays in and out, float32, row-major."""
from __future__ import annotations

import numpy as np

from . import _mha


def float32_array(name: str, array) -> np.ndarray:
    """A C-contiguous float32 view of `array` (no copy when it already is one)."""
    array = np.asarray(array)
    if array.dtype != np.float32:
        raise TypeError(f"{name} is {array.dtype}; mha computes in float32: pass float32 data")
    return np.ascontiguousarray(array)


def mask_array(name: str, mask) -> np.ndarray | None:
    """A bool (True = blocked) or float32 (added to the scores) mask, C-contiguous."""
    if mask is None:
        return None
    mask = np.asarray(mask)
    if mask.dtype != np.bool_ and mask.dtype != np.float32:
        raise TypeError(f"{name} is {mask.dtype}: pass bool (True = blocked) or float32 (added)")
    return np.ascontiguousarray(mask)


def weights_shape(query, key, num_heads: int, average_attn_weights: bool) -> tuple:
    """The attention weights' shape: [B, Sq, Sk] averaged over heads, or [B, H, Sq, Sk]."""
    heads = () if average_attn_weights else (num_heads,)
    return (query.shape[0], *heads, query.shape[1], key.shape[1])


class Attention:
    """Multi-head attention over NumPy arrays, weights in nn.Linear's [out, in] layout.

    ``Attention(E, H, q_weight, k_weight, v_weight, out_weight, q_bias=..., ...)`` copies and
    prepacks the weights. ``attn(query, key, value, ...)`` takes ``[B, Sq, E]``, ``[B, Sk, kdim]``,
    ``[B, Sk, vdim]`` and returns ``(output [B, Sq, E], weights or None)`` with the meaning of
    ``torch.nn.MultiheadAttention`` (batch first): ``key_padding_mask`` ``[B, Sk]`` and
    ``attn_mask`` ``[Sq, Sk]`` or ``[B*H, Sq, Sk]``, bool (True = blocked) or float32 (added);
    ``is_causal`` hides later keys; weights ``[B, Sq, Sk]`` averaged over heads or
    ``[B, H, Sq, Sk]``.
    """

    def __init__(self, embed_dim: int, num_heads: int, q_weight, k_weight, v_weight, out_weight,
                 q_bias=None, k_bias=None, v_bias=None, out_bias=None):
        def optional(name, array):
            return None if array is None else float32_array(name, array)

        self.native = _mha.Module(
            embed_dim, num_heads,
            float32_array("q_weight", q_weight), optional("q_bias", q_bias),
            float32_array("k_weight", k_weight), optional("k_bias", k_bias),
            float32_array("v_weight", v_weight), optional("v_bias", v_bias),
            float32_array("out_weight", out_weight), optional("out_bias", out_bias))

    @property
    def embed_dim(self) -> int:
        return self.native.embed_dim

    @property
    def num_heads(self) -> int:
        return self.native.num_heads

    def __call__(self, query, key, value, key_padding_mask=None, need_weights=False,
                 attn_mask=None, average_attn_weights=True, is_causal=False):
        query = float32_array("query", query)
        key = float32_array("key", key)
        value = float32_array("value", value)
        for name, array in (("query", query), ("key", key), ("value", value)):
            if array.ndim != 3:
                raise ValueError(
                    f"{name} has shape {array.shape}: expected [batch, tokens, features]")
        batch, query_len, _ = query.shape
        output = np.empty((batch, query_len, self.embed_dim), np.float32)
        weights = None
        if need_weights:
            weights = np.empty(weights_shape(query, key, self.num_heads, average_attn_weights),
                               np.float32)
        self.native.forward(query, key, value, output,
                            key_padding_mask=mask_array("key_padding_mask", key_padding_mask),
                            attn_mask=mask_array("attn_mask", attn_mask), is_causal=is_causal,
                            weights=weights, average_weights=average_attn_weights)
        return output, weights

    def make_cache(self, batch: int, capacity: int, dtype: str | None = None) -> _mha.KvCache:
        """A KV cache for `batch` rows of up to `capacity` tokens (self-attention, kdim = E),
        its keys and values in `dtype` ("f32", "bf16", "f16" or "int8"; the module's by
        default)."""
        return self.native.make_cache(batch, capacity, dtype)

    def decode(self, tokens, cache: _mha.KvCache, key_padding_mask=None, new_tokens=()):
        """One decode step: tokens ``[B, n, E]`` are appended to `cache`; returns their outputs.

        Each new token attends over its row's cached tokens and the new ones up to itself.
        ``key_padding_mask`` ``[B, capacity]`` (bool, True = hidden) hides cache positions;
        ``new_tokens`` says how many of the n each row appends (default: all).
        """
        tokens = float32_array("tokens", tokens)
        output = np.empty_like(tokens)
        padding = None if key_padding_mask is None else np.ascontiguousarray(key_padding_mask,
                                                                              dtype=np.bool_)
        self.native.decode(tokens, cache, output, key_padding_mask=padding,
                           new_tokens=list(new_tokens))
        return output
