"""mha.varlen_attention: sequences packed without padding, as FlashAttention's
``flash_attn_varlen_func`` takes them (a prefill of requests of different lengths, whose keys and
values ``write_paged_cache`` then writes into a paged cache from the same packed rows).

A custom op with a fake implementation (``torch.compile(fullgraph=True)`` and ``torch.export``
keep it); tensors are read in place, strides and all, when each row's features are contiguous.
"""
from typing import Optional, Tuple, Union

import torch
from torch import Tensor

from . import _mha
from ._paged import _check
from ._sdpa import _DTYPES, Rotary, _array, _rotation, _rotation_args, _window_sides

_CAUSAL_BOTTOM_RIGHT = 2  # FlashAttention's causal order


@torch.library.custom_op("mha::varlen_attention", mutates_args=())
def _varlen_op(query: Tensor, key: Tensor, value: Tensor, cu_seqlens_q: Tensor,
               cu_seqlens_k: Tensor, scale: Optional[float], causal: bool, window_left: int,
               window_right: int, softcap: float,
               alibi_slopes: Optional[Tensor], rotary_dim: int, rotary_interleaved: bool,
               rotary_theta: float, rotary_cos: Optional[Tensor],
               rotary_sin: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    """query [total_q, H, d] -> (output [total_q, H, dv], lse [H, total_q]); rotary_dim -1: no
    rotation."""
    output = torch.empty(*query.shape[:-1], value.shape[-1], dtype=query.dtype)
    lse = torch.empty(query.shape[1], query.shape[0], dtype=torch.float32)
    _mha.varlen_attention(_array(query), _array(key), _array(value), _array(cu_seqlens_q),
                          _array(cu_seqlens_k), _array(output), _DTYPES[query.dtype],
                          scale=scale, causal=_CAUSAL_BOTTOM_RIGHT if causal else 0,
                          window_left=window_left, window_right=window_right, softcap=softcap,
                          alibi_slopes=None if alibi_slopes is None
                          else _array(alibi_slopes.to(torch.float32)),
                          lse=_array(lse),
                          rotary=_rotation(rotary_dim, rotary_interleaved, rotary_theta,
                                           rotary_cos, rotary_sin))
    return output, lse


@_varlen_op.register_fake
def _(query, key, value, cu_seqlens_q, cu_seqlens_k, scale, causal, window_left, window_right,
      softcap, alibi_slopes, rotary_dim, rotary_interleaved, rotary_theta, rotary_cos,
      rotary_sin):
    return (query.new_empty(*query.shape[:-1], value.shape[-1]),
            query.new_empty(query.shape[1], query.shape[0], dtype=torch.float32))


def varlen_attention(query: Tensor, key: Tensor, value: Tensor, cu_seqlens_q: Tensor,
                     cu_seqlens_k: Tensor, max_seqlen_q: Optional[int] = None,
                     max_seqlen_k: Optional[int] = None, *, causal: bool = False,
                     scale: Optional[float] = None,
                     window: Union[None, int, Tuple[int, int]] = None,
                     softcap: Optional[float] = None, alibi_slopes: Optional[Tensor] = None,
                     rotary: Optional[Rotary] = None, return_lse: bool = False):
    """Attention over sequences packed without padding, as ``flash_attn_varlen_func``: query
    [total_q, H, d], key [total_k, Hkv, d], value [total_k, Hkv, dv] -> output [total_q, H, dv],
    H a multiple of Hkv. Sequence b is query rows ``cu_seqlens_q[b]`` to ``cu_seqlens_q[b + 1] -
    1`` over key rows ``cu_seqlens_k[b]`` to ``cu_seqlens_k[b + 1] - 1`` (int32 [B + 1], from 0,
    ending at the totals). ``causal``: each query sees the keys up to its position aligned to its
    sequence's last key (FlashAttention's bottom-right order); ``window``, ``softcap`` and
    ``alibi_slopes`` as ``mha.scaled_dot_product_attention`` takes them, within each sequence;
    ``rotary`` (an ``mha.Rotary``), each sequence's query row i is read rotated at position
    Sk - Sq + i and key j at j, Sq and Sk its lengths; ``return_lse`` returns ``(output, lse)``,
    lse [H, total_q] in float32. A sequence of no keys gets zeros. ``max_seqlen_q`` and
    ``max_seqlen_k`` are FlashAttention's launch sizes, accepted for its signature and not
    needed."""
    if query.dtype not in _DTYPES:
        raise TypeError(f"query is {query.dtype}: mha computes in float32, bfloat16 or float16")
    for name, tensor in (("query", query), ("key", key), ("value", value)):
        _check(name, tensor, query.dtype)
    _check("cu_seqlens_q", cu_seqlens_q, torch.int32)
    _check("cu_seqlens_k", cu_seqlens_k, torch.int32)
    window_left, window_right = _window_sides(window, causal)
    output, lse = _varlen_op(query, key, value, cu_seqlens_q, cu_seqlens_k,
                             None if scale is None else float(scale), bool(causal),
                             window_left, window_right,
                             0.0 if softcap is None else float(softcap), alibi_slopes,
                             *_rotation_args(rotary))
    return (output, lse) if return_lse else output
