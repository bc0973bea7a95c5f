"""mha.paged_attention and mha.write_paged_cache: a decode step of a batch of sequences over a
paged KV cache laid out as FlashAttention's ``flash_attn_with_kvcache`` and vLLM's FlashAttention
backend lay it out, so that an engine hands over its own tensors.

The cache: ``key_cache`` [num_blocks, block_size, Hkv, d] and ``value_cache`` [num_blocks,
block_size, Hkv, dv] (block_size a power of two), ``block_table`` [B, max_blocks] int32 (key j of
sequence b in slot j % block_size of block ``block_table[b, j // block_size]``) and
``cache_seqlens`` [B] int32 (each sequence's keys, its newest token's included). Both are custom
ops with fake implementations (``torch.compile(fullgraph=True)`` and ``torch.export`` keep them);
tensors are read in place.
"""
from typing import NamedTuple, Optional

import torch
from torch import Tensor

from . import _mha
from ._sdpa import _DTYPES, Rotary, _array, _rotation, _rotation_args


class PagedDecodeCache(NamedTuple):
    """An engine's paged cache for ``mha.MultiheadAttention.decode``: ``key_cache`` and
    ``value_cache`` [num_blocks, block_size, Hkv, d] (float32, bfloat16 or float16; the step
    writes its new keys and values into them in place), ``block_table`` [B, max_blocks] and
    ``cache_seqlens`` [B] int32 (each sequence's keys, the new token's included), and
    ``slot_mapping`` [B] int64, the slot of each sequence's new token (block * block_size +
    offset; negative: a padding row, whose output is 0). With ``rotary`` (an ``mha.Rotary``),
    the step rotates each new query and key at its position, cache_seqlens - 1."""
    key_cache: Tensor
    value_cache: Tensor
    block_table: Tensor
    cache_seqlens: Tensor
    slot_mapping: Tensor
    rotary: Optional[Rotary] = None


def _check(name: str, tensor: Tensor, dtype: torch.dtype) -> None:
    if not tensor.is_cpu:
        raise ValueError(f"mha's paged cache runs on the CPU: {name} is on {tensor.device}")
    if tensor.dtype != dtype:
        raise TypeError(f"{name} is {tensor.dtype}: it must be {dtype}")


def check_decode_cache(cache: PagedDecodeCache) -> None:
    if cache.key_cache.dtype not in _DTYPES:
        raise TypeError(f"key_cache is {cache.key_cache.dtype}: mha's caches are float32, "
                        f"bfloat16 or float16")
    dtypes = (cache.key_cache.dtype,) * 2 + (torch.int32,) * 2 + (torch.int64,)
    for name, tensor, dtype in zip(PagedDecodeCache._fields, cache[:5], dtypes):
        _check(name, tensor, dtype)


@torch.library.custom_op("mha::paged_attention", mutates_args=())
def _paged_op(query: Tensor, key_cache: Tensor, value_cache: Tensor, block_table: Tensor,
              cache_seqlens: Tensor, scale: Optional[float], window_left: int, softcap: float,
              alibi_slopes: Optional[Tensor], num_splits: int, rotary_dim: int,
              rotary_interleaved: bool, rotary_theta: float, rotary_cos: Optional[Tensor],
              rotary_sin: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    """query [B, 1, H, d] -> (output [B, 1, H, dv], lse [B, H, 1]); rotary_dim -1: no
    rotation."""
    output = torch.empty(*query.shape[:-1], value_cache.shape[-1], dtype=query.dtype)
    lse = torch.empty(query.shape[0], query.shape[2], 1, dtype=torch.float32)
    _mha.paged_attention(_array(query), _array(key_cache), _array(value_cache),
                         _array(block_table), _array(cache_seqlens), _array(output),
                         _DTYPES[query.dtype], scale=scale, window_left=window_left,
                         softcap=softcap,
                         alibi_slopes=None if alibi_slopes is None
                         else _array(alibi_slopes.to(torch.float32)),
                         lse=_array(lse), num_splits=num_splits,
                         rotary=_rotation(rotary_dim, rotary_interleaved, rotary_theta,
                                          rotary_cos, rotary_sin))
    return output, lse


@_paged_op.register_fake
def _(query, key_cache, value_cache, block_table, cache_seqlens, scale, window_left, softcap,
      alibi_slopes, num_splits, rotary_dim, rotary_interleaved, rotary_theta, rotary_cos,
      rotary_sin):
    return (query.new_empty(*query.shape[:-1], value_cache.shape[-1]),
            query.new_empty(query.shape[0], query.shape[2], 1, dtype=torch.float32))


def paged_attention(query: Tensor, key_cache: Tensor, value_cache: Tensor, block_table: Tensor,
                    cache_seqlens: Tensor, *, scale: Optional[float] = None,
                    window: Optional[int] = None, softcap: Optional[float] = None,
                    alibi_slopes: Optional[Tensor] = None, num_splits: int = 0,
                    rotary: Optional[Rotary] = None, return_lse: bool = False):
    """One new token per sequence over its paged cache, as ``flash_attn_with_kvcache`` with a
    ``block_table``: query [B, 1, H, d] -> output [B, 1, H, dv], H a multiple of Hkv, the query
    the last of its sequence's ``cache_seqlens[b]`` keys (write its key and value first, with
    ``write_paged_cache``). ``window``: the keys at most that many positions before it (-1 or
    None: all); ``softcap`` and ``alibi_slopes`` [H] as ``mha.scaled_dot_product_attention``
    takes them; ``num_splits`` as ``flash_attn_with_kvcache``'s (each sequence's keys in that
    many splits run as tasks of their own, merged by log-sum-exp; 0 chooses from the threads;
    a window that leaves keys out, or ALiBi, runs one); ``rotary`` (an ``mha.Rotary``), the
    query is read rotated at its position ``cache_seqlens[b] - 1`` (the cache's keys as they
    lie: rotate them before they are written); ``return_lse`` returns ``(output, lse)``, lse
    [B, H, 1] in float32. A sequence of no keys gets zeros."""
    if query.dtype not in _DTYPES:
        raise TypeError(f"query is {query.dtype}: mha computes in float32, bfloat16 or float16")
    for name, tensor in (("query", query), ("key_cache", key_cache),
                         ("value_cache", value_cache)):
        _check(name, tensor, query.dtype)
    _check("block_table", block_table, torch.int32)
    _check("cache_seqlens", cache_seqlens, torch.int32)
    output, lse = _paged_op(query, key_cache, value_cache, block_table, cache_seqlens,
                            None if scale is None else float(scale),
                            -1 if window is None else int(window),
                            0.0 if softcap is None else float(softcap), alibi_slopes,
                            int(num_splits), *_rotation_args(rotary))
    return (output, lse) if return_lse else output


@torch.library.custom_op("mha::write_paged_cache", mutates_args=("key_cache", "value_cache"))
def write_paged_cache(key: Tensor, value: Tensor, key_cache: Tensor, value_cache: Tensor,
                      slot_mapping: Tensor) -> None:
    """Writes tokens' keys [T, Hkv, d] and values [T, Hkv, dv] into slots ``slot_mapping`` [T]
    int64 (block * block_size + offset; negative: a padding token, skipped) of the paged caches,
    as vLLM's ``reshape_and_cache_flash``."""
    for name, tensor in (("key", key), ("value", value), ("key_cache", key_cache),
                         ("value_cache", value_cache)):
        _check(name, tensor, key_cache.dtype)
    if key_cache.dtype not in _DTYPES:
        raise TypeError(f"key_cache is {key_cache.dtype}: mha's caches are float32, bfloat16 or "
                        f"float16")
    _check("slot_mapping", slot_mapping, torch.int64)
    _mha.write_paged_cache(_array(key), _array(value), _array(key_cache), _array(value_cache),
                           _array(slot_mapping), _DTYPES[key_cache.dtype])


@write_paged_cache.register_fake
def _(key, value, key_cache, value_cache, slot_mapping):
    return None
