"""mha.rotary_embedding: rotary position embeddings applied in place to packed queries and keys,
as vLLM's ``rotary_embedding`` op applies them before the attention and the cache write (an
``mha.Rotary`` gives the same rotation to a decode step or an attention call).

A custom op that mutates its query and key (``torch.compile(fullgraph=True)`` and
``torch.export`` keep it).
"""
from typing import Optional

import torch
from torch import Tensor

from . import _mha
from ._paged import _check
from ._sdpa import _DTYPES, Rotary, _array, _rotation, _rotation_args


def rotary_args(rotary: Optional[Rotary]):
    """What the extension takes for a rotation: a tuple, or None."""
    return _rotation(*_rotation_args(rotary))


@torch.library.custom_op("mha::rotary_embedding", mutates_args=("query", "key"))
def _rotary_op(query: Tensor, key: Tensor, positions: Tensor, interleaved: bool, rotary_dim: int,
               theta: float, cos: Optional[Tensor], sin: Optional[Tensor]) -> None:
    _mha.rotary_embedding(_array(query), _array(key), _array(positions), _DTYPES[query.dtype],
                          interleaved=interleaved, rotary_dim=rotary_dim, theta=theta,
                          cos=None if cos is None else _array(cos),
                          sin=None if sin is None else _array(sin))


@_rotary_op.register_fake
def _(query, key, positions, interleaved, rotary_dim, theta, cos, sin):
    return None


def rotary_embedding(query: Tensor, key: Tensor, positions: Tensor, *, interleaved: bool = False,
                     rotary_dim: Optional[int] = None, theta: float = 10000.0,
                     cos: Optional[Tensor] = None, sin: Optional[Tensor] = None) -> None:
    """Rotates query [T, H, d] and key [T, Hkv, d] in place, token t at ``positions[t]`` (int64
    [T]): the first ``rotary_dim`` features (even; None: all) in pairs, feature i with i +
    rotary_dim / 2 (Llama's and NeoX's rotate-half) or, with ``interleaved``, 2i with 2i + 1
    (GPT-J's), by the angle position * theta^(-2i / rotary_dim) computed in float32 as
    transformers computes it, or by the float32 tables ``cos`` and ``sin`` [max_position,
    rotary_dim / 2] (a scaled variant's). Tensors of any strides, the same dtype (float32,
    bfloat16 or float16), rounded once."""
    if query.dtype not in _DTYPES:
        raise TypeError(f"query is {query.dtype}: mha computes in float32, bfloat16 or float16")
    _check("query", query, query.dtype)
    _check("key", key, query.dtype)
    _check("positions", positions, torch.int64)
    rotary_dim, interleaved, theta, cos, sin = _rotation_args(
        Rotary(interleaved, rotary_dim, theta, cos, sin), prefix="")
    _rotary_op(query, key, positions, interleaved, rotary_dim, theta, cos, sin)
