"""Hugging Face transformers on mha's attention kernels: after ``import mha.transformers``, a
model built with ``attn_implementation="mha"`` runs every attention layer through
``mha.scaled_dot_product_attention``.

Two functions are registered under the name "mha":

- the attention function (``transformers.AttentionInterface``), called by each layer with its
  projected, rotated queries [B, H, Sq, d] and keys and values [B, Hkv, Sk, d] (the model's cache
  already appended), the layer's mask, and its sliding window and soft-capping;
- the mask function (``transformers.masking_utils.AttentionMaskInterface``), which builds the
  boolean mask sdpa's builds, but none where the layer's causal order and sliding window say all
  there is to say (no padding, the queries the last positions of the keys): the kernels then
  skip the key tiles outside them instead of reading a mask.
"""
import torch
from transformers import AttentionInterface
from transformers.masking_utils import (AttentionMaskInterface, prepare_padding_mask,
                                        sdpa_mask)

from ._sdpa import scaled_dot_product_attention

NAME = "mha"


def _all_true(padding: torch.Tensor) -> bool:
    return bool(padding.all())


def mha_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, attention_mask=None,
             allow_is_causal_skip=True, allow_is_bidirectional_skip=False, **kwargs):
    """sdpa's mask, or None where the attention function's own causal order and window make it
    (then the kernels skip what a mask would hide)."""
    padding = prepare_padding_mask(attention_mask, kv_length, kv_offset)
    no_padding = padding is None or (not torch.compiler.is_compiling() and _all_true(padding))
    # The queries are the last q_length positions of the keys: a bottom-right causal order.
    last_positions = (isinstance(q_offset, int) and isinstance(kv_offset, int)
                      and q_offset + q_length == kv_offset + kv_length)
    if no_padding and not torch.compiler.is_exporting():
        if allow_is_causal_skip and last_positions:
            return None
        if allow_is_bidirectional_skip:
            return None
    return sdpa_mask(batch_size, q_length, kv_length, q_offset=q_offset, kv_offset=kv_offset,
                     attention_mask=attention_mask, allow_is_causal_skip=False,
                     allow_is_bidirectional_skip=False, **kwargs)


def mha_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                          is_causal=None, sliding_window=None, softcap=None, **kwargs):
    """One layer's attention: (output [B, Sq, H, d], None)."""
    if kwargs.get("position_bias") is not None:
        raise NotImplementedError("attn_implementation='mha' takes no position_bias (T5-style "
                                  "relative attention biases)")
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    window = None
    if attention_mask is None:
        # What the mask function left out: the causal order (the queries the last positions of
        # the keys) and the layer's sliding window, which sees sliding_window positions back.
        causal = is_causal and query.shape[2] > 1
        if is_causal and sliding_window is not None:
            window = (sliding_window - 1, 0)
    else:
        causal = False  # the mask holds the causal order, the window and the padding
    if causal and key.shape[2] != query.shape[2]:
        # Bottom-right, as the mask function's skip promised, with a window or without.
        window = window or (-1, 0)
        causal = False
    output = scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout if module.training else 0.0,
        is_causal=causal, scale=scaling, enable_gqa=True, window=window, softcap=softcap)
    return output.transpose(1, 2).contiguous(), None


AttentionInterface.register(NAME, mha_attention_forward)
AttentionMaskInterface.register(NAME, mha_mask)
