"""mha.scaled_dot_product_attention: torch.nn.functional.scaled_dot_product_attention's signature
and semantics on mha's attention kernels (CPU; float32, bfloat16, float16), with FlashAttention's
extras: sliding windows, logit soft-capping, ALiBi, rotary embeddings, the log-sum-exp; and
mha.Rotary, a rotation as every attention op and a module's decode steps take it.

The call is the custom op ``torch.ops.mha.scaled_dot_product_attention`` with a fake
implementation, so ``torch.compile(fullgraph=True)`` keeps it as one op and ``torch.export``
exports it. Tensors reach the kernels in place, strides and all, when each row's features are
contiguous.
"""
from typing import NamedTuple, Optional, Tuple, Union

import torch
from torch import Tensor

from . import _mha

_DTYPES = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}
_CAUSAL_TOP_LEFT = 1


def _array(tensor: Tensor):
    """A NumPy view of a CPU tensor, strides and all; 16-bit floats as their bits."""
    if tensor.requires_grad:
        tensor = tensor.detach()
    if tensor.dtype in (torch.bfloat16, torch.float16):
        tensor = tensor.view(torch.int16)
    return tensor.numpy()


class Rotary(NamedTuple):
    """A rotary position embedding (RoPE), with ``rotary_embedding``'s options: Llama's is
    ``Rotary(theta=config.rope_theta)``. A decode step applies it to its new tokens' queries and
    keys at their positions before their keys are stored (``MultiheadAttention.make_cache(
    rotary=...)``, or a ``PagedDecodeCache``'s ``rotary``); the attention calls' ``rotary``
    argument to their queries and keys as they read them."""
    interleaved: bool = False
    rotary_dim: Optional[int] = None
    theta: float = 10000.0
    cos: Optional[Tensor] = None
    sin: Optional[Tensor] = None


_NO_ROTATION = (-1, False, 0.0, None, None)


def _rotation_args(rotary: Optional[Rotary], prefix: str = "rotary."):
    """A rotation as the ops take it: (rotary_dim, interleaved, theta, cos, sin), rotary_dim -1
    without one (0: all features); errors name its fields after `prefix`."""
    if rotary is None:
        return _NO_ROTATION
    if not isinstance(rotary, Rotary):
        raise TypeError(f"rotary is {type(rotary).__name__}: give an mha.Rotary")
    for name, table in (("cos", rotary.cos), ("sin", rotary.sin)):
        if table is not None and not table.is_cpu:
            raise ValueError(f"{prefix}{name} is on {table.device}: mha runs on the CPU")
        if table is not None and table.dtype != torch.float32:
            raise TypeError(f"{prefix}{name} is {table.dtype}: it must be torch.float32")
    rotary_dim = 0 if rotary.rotary_dim is None else int(rotary.rotary_dim)
    if rotary_dim < 0:
        raise _mha.Error(f"{prefix}rotary_dim is {rotary_dim}: give the rotated features (even), "
                         f"or None for all")
    return (rotary_dim, bool(rotary.interleaved), float(rotary.theta), rotary.cos, rotary.sin)


def _rotation(rotary_dim: int, interleaved: bool, theta: float, cos: Optional[Tensor],
              sin: Optional[Tensor]):
    """The extension's rotation of the ops' arguments: (interleaved, rotary_dim, theta, cos,
    sin), or None."""
    if rotary_dim < 0:
        return None
    return (interleaved, rotary_dim, theta, None if cos is None else _array(cos),
            None if sin is None else _array(sin))


def _as_4d(tensor: Tensor) -> Tensor:
    """[..., L, E] as [B, H, L, E]: views of rank 2 to 4 (leading dimensions beyond two are
    folded into the batch)."""
    if tensor.dim() == 4:
        return tensor
    if tensor.dim() == 3:
        return tensor.unsqueeze(1)
    if tensor.dim() == 2:
        return tensor.unsqueeze(0).unsqueeze(0)
    return tensor.reshape(-1, *tensor.shape[-3:])


def _run(query: Tensor, key: Tensor, value: Tensor, attn_mask: Optional[Tensor],
         is_causal: bool, scale: Optional[float], window_left: int, window_right: int,
         softcap: float, alibi_slopes: Optional[Tensor], rotation: tuple,
         with_lse: bool = True) -> Tuple[Tensor, Optional[Tensor]]:
    """The op's computation: output [B, H, L, Ev] of query's dtype, lse [B, H, L] float32 (None
    without ``with_lse``, which only untraced calls leave out)."""
    q, k, v = _as_4d(query), _as_4d(key), _as_4d(value)
    output = torch.empty(q.shape[0], q.shape[1], q.shape[2], v.shape[3], dtype=query.dtype)
    lse = (torch.empty(q.shape[0], q.shape[1], q.shape[2], dtype=torch.float32) if with_lse
           else None)
    mask = None
    if attn_mask is not None:
        mask = attn_mask if attn_mask.dtype == torch.bool else attn_mask.to(torch.float32)
        mask = _array(mask)
    _mha.attention(_array(q), _array(k), _array(v), _array(output), _DTYPES[query.dtype],
                   mask=mask, scale=scale, causal=_CAUSAL_TOP_LEFT if is_causal else 0,
                   window_left=window_left, window_right=window_right, softcap=softcap,
                   alibi_slopes=None if alibi_slopes is None
                   else _array(alibi_slopes.to(torch.float32)),
                   lse=None if lse is None else _array(lse), rotary=_rotation(*rotation))
    shape = (*query.shape[:-1], value.shape[-1])
    return output.reshape(shape), None if lse is None else lse.reshape(shape[:-1])


@torch.library.custom_op("mha::scaled_dot_product_attention", mutates_args=())
def _sdpa_op(query: Tensor, key: Tensor, value: Tensor, attn_mask: Optional[Tensor],
             is_causal: bool, scale: Optional[float], window_left: int, window_right: int,
             softcap: float, alibi_slopes: Optional[Tensor], rotary_dim: int,
             rotary_interleaved: bool, rotary_theta: float, rotary_cos: Optional[Tensor],
             rotary_sin: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    """query [..., L, E], key [..., S, E], value [..., S, Ev] -> (output [..., L, Ev], lse
    [..., L]); rotary_dim -1: no rotation."""
    return _run(query, key, value, attn_mask, is_causal, scale, window_left, window_right,
                softcap, alibi_slopes,
                (rotary_dim, rotary_interleaved, rotary_theta, rotary_cos, rotary_sin))


@_sdpa_op.register_fake
def _(query, key, value, attn_mask, is_causal, scale, window_left, window_right, softcap,
      alibi_slopes, rotary_dim, rotary_interleaved, rotary_theta, rotary_cos, rotary_sin):
    shape = (*query.shape[:-1], value.shape[-1])
    return query.new_empty(shape), query.new_empty(shape[:-1], dtype=torch.float32)


def _traced(query: Tensor) -> bool:
    """Whether something records this call (torch.compile, torch.export, a dispatch mode, a
    tensor subclass), which must see the custom op; otherwise its dispatch is skipped."""
    return (torch.compiler.is_compiling() or torch.jit.is_tracing()
            or torch._C._len_torch_dispatch_stack() > 0 or type(query) is not torch.Tensor)


def _check(query: Tensor, key: Tensor, value: Tensor, attn_mask: Optional[Tensor],
           dropout_p: float, is_causal: bool, enable_gqa: bool) -> None:
    if dropout_p != 0.0:
        raise ValueError(f"dropout_p={dropout_p}: mha computes attention for inference, "
                         f"without dropout (pass 0.0)")
    for name, tensor in (("query", query), ("key", key), ("value", value)):
        if not tensor.is_cpu:
            raise ValueError(f"mha.scaled_dot_product_attention runs on the CPU: {name} is on "
                             f"{tensor.device}")
        if tensor.dtype not in _DTYPES:
            raise TypeError(f"{name} is {tensor.dtype}: mha computes in float32, bfloat16 or "
                            f"float16")
        if tensor.dim() < 2:
            raise ValueError(f"{name} has shape {tuple(tensor.shape)}: it must be [..., L, E]")
    if key.dtype != query.dtype or value.dtype != query.dtype:
        raise TypeError(f"query, key and value are {query.dtype}, {key.dtype} and {value.dtype}: "
                        f"they must be of one dtype")
    heads = query.shape[-3] if query.dim() > 2 else 1
    kv_heads = key.shape[-3] if key.dim() > 2 else 1
    if heads != kv_heads and not enable_gqa:
        raise ValueError(f"query has {heads} heads and key {kv_heads}: pass enable_gqa=True for "
                         f"grouped-query attention")
    if attn_mask is not None:
        if is_causal:
            raise ValueError("an explicit attn_mask should not be set when is_causal=True "
                             "(as torch's scaled_dot_product_attention)")
        if not attn_mask.is_cpu:
            raise ValueError(f"attn_mask is on {attn_mask.device}: mha runs on the CPU")
        if attn_mask.dtype != torch.bool and not attn_mask.is_floating_point():
            raise TypeError(f"attn_mask is {attn_mask.dtype}: pass bool (True = takes part) or a "
                            f"float mask (added to the scores)")


def _window_sides(window: Union[None, int, Tuple[int, int]], causal: bool) -> Tuple[int, int]:
    """(window_left, window_right) of a ``window`` argument: None unbounded, an int ``(window,
    0)`` with a causal order and both sides otherwise, or the pair; -1 leaves a side unbounded."""
    if window is None:
        left, right = -1, -1
    elif isinstance(window, int):
        left, right = window, (0 if causal else window)
    else:
        left, right = window
    return int(left), 0 if causal and right == -1 else int(right)


def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor,
                                 attn_mask: Optional[Tensor] = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: Optional[float] = None,
                                 enable_gqa: bool = False, *,
                                 window: Union[None, int, Tuple[int, int]] = None,
                                 softcap: Optional[float] = None,
                                 alibi_slopes: Optional[Tensor] = None,
                                 rotary: Optional[Rotary] = None, return_lse: bool = False):
    """torch.nn.functional.scaled_dot_product_attention on mha's kernels.

    query [..., Hq, L, E], key [..., H, S, E], value [..., H, S, Ev] -> [..., Hq, L, Ev], as
    torch computes it (a boolean attn_mask's True takes part; a float one is added; a query that
    no key weighs gets zeros). ``dropout_p`` must be 0. Extras, as FlashAttention defines them:
    ``window``, keys within ``(left, right)`` positions of the diagonal (an int: ``(window,
    0)`` with ``is_causal``, else both sides; -1 leaves a side unbounded), the diagonal aligned to
    the bottom right when L != S (top left with ``is_causal``); ``softcap``, scores become
    ``softcap * tanh(score / softcap)``; ``alibi_slopes`` [Hq], scores minus ``slope * |i + S -
    L - j|``; ``rotary`` (an ``mha.Rotary``), the kernels read query row i rotated at position
    S - L + i (the last L of S positions, whichever corner ``is_causal`` aligns the mask to) and
    key j at j, the tensors left as they are; ``return_lse`` returns ``(output, lse)``, lse
    [..., Hq, L] the float32 log-sum-exp of each row's scores.
    """
    _check(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa)
    window_left, window_right = _window_sides(window, is_causal)
    args = (query, key, value, attn_mask, is_causal,
            None if scale is None else float(scale), window_left, window_right,
            0.0 if softcap is None else float(softcap), alibi_slopes)
    rotation = _rotation_args(rotary)
    if _traced(query):
        output, lse = _sdpa_op(*args, *rotation)
    else:
        output, lse = _run(*args, rotation, with_lse=return_lse)
    return (output, lse) if return_lse else output

