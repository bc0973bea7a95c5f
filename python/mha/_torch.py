"""mha.MultiheadAttention: a drop-in for torch.nn.MultiheadAttention (inference, CPU; float32,
bfloat16 or float16 modules).

The call is the custom op ``torch.ops.mha.multihead_attention`` (with a fake implementation), so
``torch.compile`` keeps it as one op and ``torch.export`` can export it. The weights are
prepacked once per module and prepacked again only when a parameter changes (its data pointer
or version counter), so ``load_state_dict``, optimizers and in-place updates are seen.
"""
import itertools
import threading
import weakref
from typing import Dict, Optional, Tuple, Union

import torch
from torch import Tensor
from torch.nn.modules.linear import NonDynamicallyQuantizableLinear

from . import _mha
from ._numpy import weights_shape
from ._paged import PagedDecodeCache, check_decode_cache
from ._rotary import Rotary, rotary_args
from ._sdpa import _array as _strided

# Prepacked modules by module id: (what they were packed from, the native module).
_natives: Dict[int, Tuple[tuple, _mha.Module]] = {}
_natives_lock = threading.Lock()
_module_ids = itertools.count()


def _fingerprint(tensor: Optional[Tensor]):
    """What identifies a parameter's values: its data and its version counter (which every
    in-place change, resize included, advances)."""
    if tensor is None:
        return None
    try:
        return tensor.data_ptr(), tensor._version
    except RuntimeError:  # an inference tensor has no version counter
        return tensor.data_ptr(), None


_DTYPES = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}
_CACHE_DTYPES = {**_DTYPES, torch.int8: "int8"}


def _array(tensor: Tensor):
    """A NumPy view of a CPU tensor, copied only when it is not contiguous (NumPy's buffer
    protocol reaches the extension faster than DLPack); a 16-bit float tensor as its bits."""
    tensor = tensor.detach().contiguous()
    if tensor.dtype in (torch.bfloat16, torch.float16):
        tensor = tensor.view(torch.int16)
    return tensor.numpy()


def _f32_array(tensor: Tensor):
    """A parameter as the float32 the extension takes weights in (16-bit ones widened, exact)."""
    return _array(tensor.detach().float())


def _optional_array(tensor: Optional[Tensor]):
    return None if tensor is None else _f32_array(tensor)


def _native(module_id: int, num_heads: int, weights: tuple) -> _mha.Module:
    """The prepacked module for these parameters, packed again when one has changed."""
    fingerprint = tuple(_fingerprint(w) for w in weights)
    with _natives_lock:
        cached = _natives.get(module_id)
    if cached is not None and cached[0] == fingerprint:
        return cached[1]
    in_proj_weight, q_weight, k_weight, v_weight, in_proj_bias, out_weight, out_bias = weights
    embed_dim = out_weight.shape[0]
    if in_proj_weight is not None:
        q_weight, k_weight, v_weight = in_proj_weight.split(embed_dim)
    biases = (None, None, None) if in_proj_bias is None else in_proj_bias.split(embed_dim)
    native = _mha.Module(embed_dim, num_heads, _f32_array(q_weight), _optional_array(biases[0]),
                         _f32_array(k_weight), _optional_array(biases[1]), _f32_array(v_weight),
                         _optional_array(biases[2]), _f32_array(out_weight),
                         _optional_array(out_bias), dtype=_DTYPES[out_weight.dtype])
    with _natives_lock:
        _natives[module_id] = (fingerprint, native)
    return native


def _forget(module_id: int) -> None:
    with _natives_lock:
        _natives.pop(module_id, None)


def _weights_shape(query: Tensor, key: Tensor, num_heads: int, need_weights: bool,
                   average_attn_weights: bool) -> tuple:
    return weights_shape(query, key, num_heads, average_attn_weights) if need_weights else (0,)


def _forward(query, key, value, weights, num_heads, module_id, key_padding_mask, attn_mask,
             is_causal, need_weights, average_attn_weights):
    """The op's computation on real tensors."""
    native = _native(module_id, num_heads, weights)
    output = torch.empty(query.shape[0], query.shape[1], weights[5].shape[0], dtype=query.dtype)
    attention = torch.empty(_weights_shape(query, key, num_heads, need_weights,
                                           average_attn_weights))
    masks = dict(key_padding_mask=None if key_padding_mask is None else _mask_array(key_padding_mask),
                 attn_mask=None if attn_mask is None else _mask_array(attn_mask),
                 is_causal=is_causal, weights=attention.numpy() if need_weights else None,
                 average_weights=average_attn_weights)
    if query.dtype == torch.float32:
        native.forward(_array(query), _array(key), _array(value), output.numpy(), **masks)
    else:  # the weights come in f32, as the library returns them; torch returns its dtype
        native.forward_bits(_array(query), _array(key), _array(value), _array(output),
                            _DTYPES[query.dtype], **masks)
    return output, attention.to(query.dtype)


def _mask_array(mask: Tensor):
    """A mask as the extension takes it: bool, or float32 (16-bit floats widened)."""
    return _array(mask if mask.dtype in (torch.bool, torch.float32) else mask.float())


def _traced(query: Tensor) -> bool:
    """Whether something records this call (torch.compile, torch.export, jit.trace, a dispatch
    mode, a tensor subclass): it must then see the custom op. Otherwise the op's dispatch, some
    15 microseconds, is skipped."""
    return (torch.compiler.is_compiling() or torch.jit.is_tracing()
            or torch._C._len_torch_dispatch_stack() > 0 or type(query) is not torch.Tensor)


@torch.library.custom_op("mha::multihead_attention", mutates_args=())
def multihead_attention(query: Tensor, key: Tensor, value: Tensor,
                        in_proj_weight: Optional[Tensor], q_proj_weight: Optional[Tensor],
                        k_proj_weight: Optional[Tensor], v_proj_weight: Optional[Tensor],
                        in_proj_bias: Optional[Tensor], out_proj_weight: Tensor,
                        out_proj_bias: Optional[Tensor], num_heads: int, module_id: int,
                        key_padding_mask: Optional[Tensor], attn_mask: Optional[Tensor],
                        is_causal: bool, need_weights: bool,
                        average_attn_weights: bool) -> Tuple[Tensor, Tensor]:
    """Batch-first attention: query [B, Sq, E], key [B, Sk, kdim], value [B, Sk, vdim] ->
    (output [B, Sq, E], weights [B, Sq, Sk] or [B, H, Sq, Sk], or an empty tensor)."""
    return _forward(query, key, value, (in_proj_weight, q_proj_weight, k_proj_weight,
                                        v_proj_weight, in_proj_bias, out_proj_weight,
                                        out_proj_bias), num_heads, module_id, key_padding_mask,
                    attn_mask, is_causal, need_weights, average_attn_weights)


@multihead_attention.register_fake
def _(query, key, value, in_proj_weight, q_proj_weight, k_proj_weight, v_proj_weight,
      in_proj_bias, out_proj_weight, out_proj_bias, num_heads, module_id, key_padding_mask,
      attn_mask, is_causal, need_weights, average_attn_weights):
    output = query.new_empty((query.shape[0], query.shape[1], out_proj_weight.shape[0]))
    weights = query.new_empty(_weights_shape(query, key, num_heads, need_weights,
                                             average_attn_weights))
    return output, weights  # of query's dtype, as _forward returns them


def _check_cpu(name: str, tensor: Tensor, dtype: torch.dtype) -> None:
    if not tensor.is_cpu:
        raise ValueError(f"mha.MultiheadAttention runs on the CPU: {name} is on {tensor.device}")
    if tensor.dtype != dtype:
        raise TypeError(f"the module computes in {dtype}: {name} is {tensor.dtype}")


def _check_mask(name: str, mask: Optional[Tensor]) -> None:
    if mask is None:
        return
    if not mask.is_cpu:
        raise ValueError(f"{name} is on {mask.device}: mha.MultiheadAttention runs on the CPU")
    if mask.dtype != torch.bool and mask.dtype not in _DTYPES:
        raise TypeError(f"{name} is {mask.dtype}: pass bool (True = not attended) or a float "
                        f"mask (added to the scores)")


class MultiheadAttention(torch.nn.Module):
    """torch.nn.MultiheadAttention's constructor, parameters and forward, on mha's kernels.

    Inference only (no autograd through the kernels), CPU, in float32, bfloat16 or float16 (the
    module's ``dtype``, as torch's; its tensors in it). Every argument has PyTorch's meaning
    except where it raises NotImplementedError naming it: ``add_bias_kv``, ``add_zero_attn``,
    ``dropout`` > 0 in training mode, other devices and dtypes. One difference
    remains: a query row whose every key a *bool* mask blocks gets uniform weights (blocked scores
    are -1e9) where PyTorch gives NaN. ``is_causal=True`` hides later keys with or without an
    ``attn_mask`` (PyTorch requires the mask, as a hint). Also: ``make_cache`` and ``decode`` for
    decoding with a KV cache, and ``from_torch`` to copy a ``torch.nn.MultiheadAttention``.
    """

    __constants__ = ["batch_first"]

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 add_bias_kv: bool = False, add_zero_attn: bool = False,
                 kdim: Optional[int] = None, vdim: Optional[int] = None,
                 batch_first: bool = False, device=None, dtype=None) -> None:
        super().__init__()
        if add_bias_kv:
            raise NotImplementedError("mha.MultiheadAttention: add_bias_kv=True is not supported")
        if add_zero_attn:
            raise NotImplementedError("mha.MultiheadAttention: add_zero_attn=True is not supported")
        if device is not None and torch.device(device).type != "cpu":
            raise NotImplementedError(f"mha.MultiheadAttention: device={device} (CPU only)")
        if dtype is not None and dtype not in _DTYPES:
            raise NotImplementedError(f"mha.MultiheadAttention: dtype={dtype} (float32, bfloat16 "
                                      f"or float16)")
        if embed_dim <= 0 or num_heads <= 0 or embed_dim % num_heads != 0:
            raise ValueError(f"embed_dim {embed_dim} is not divisible by num_heads {num_heads}")
        self.embed_dim = embed_dim
        self.kdim = kdim if kdim is not None else embed_dim
        self.vdim = vdim if vdim is not None else embed_dim
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        self.num_heads = num_heads
        self.dropout = dropout
        self.batch_first = batch_first
        self.head_dim = embed_dim // num_heads
        kind = dict(dtype=dtype or torch.float32)
        if self._qkv_same_embed_dim:
            self.in_proj_weight = torch.nn.Parameter(torch.empty(3 * embed_dim, embed_dim, **kind))
            self.register_parameter("q_proj_weight", None)
            self.register_parameter("k_proj_weight", None)
            self.register_parameter("v_proj_weight", None)
        else:
            self.q_proj_weight = torch.nn.Parameter(torch.empty(embed_dim, embed_dim, **kind))
            self.k_proj_weight = torch.nn.Parameter(torch.empty(embed_dim, self.kdim, **kind))
            self.v_proj_weight = torch.nn.Parameter(torch.empty(embed_dim, self.vdim, **kind))
            self.register_parameter("in_proj_weight", None)
        if bias:
            self.in_proj_bias = torch.nn.Parameter(torch.empty(3 * embed_dim, **kind))
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = NonDynamicallyQuantizableLinear(embed_dim, embed_dim, bias=bias, **kind)
        self.bias_k = self.bias_v = None
        self.add_zero_attn = False
        self._reset_parameters()
        self._take_module_id()

    def _take_module_id(self) -> None:
        # Each module, copies and unpickled ones included, has its own prepacked weights,
        # dropped with it.
        self._module_id = next(_module_ids)
        weakref.finalize(self, _forget, self._module_id)

    def __setstate__(self, state) -> None:  # copy.deepcopy, pickle, torch.load
        super().__setstate__(state)
        self._take_module_id()

    def _reset_parameters(self) -> None:
        # torch.nn.MultiheadAttention's initialization.
        if self._qkv_same_embed_dim:
            torch.nn.init.xavier_uniform_(self.in_proj_weight)
        else:
            torch.nn.init.xavier_uniform_(self.q_proj_weight)
            torch.nn.init.xavier_uniform_(self.k_proj_weight)
            torch.nn.init.xavier_uniform_(self.v_proj_weight)
        if self.in_proj_bias is not None:
            torch.nn.init.constant_(self.in_proj_bias, 0.0)
            torch.nn.init.constant_(self.out_proj.bias, 0.0)

    @classmethod
    def from_torch(cls, module: torch.nn.MultiheadAttention) -> "MultiheadAttention":
        """A module computing what `module` computes, with a copy of its parameters."""
        if module.bias_k is not None:
            raise NotImplementedError("mha.MultiheadAttention: add_bias_kv=True is not supported")
        if module.add_zero_attn:
            raise NotImplementedError("mha.MultiheadAttention: add_zero_attn=True is not supported")
        copy = cls(module.embed_dim, module.num_heads, dropout=module.dropout,
                   bias=module.in_proj_bias is not None, kdim=module.kdim, vdim=module.vdim,
                   batch_first=module.batch_first, dtype=module.out_proj.weight.dtype)
        copy.load_state_dict(module.state_dict())
        return copy.train(module.training)

    def _weights(self) -> tuple:
        # From the parameter dictionaries: nn.Module's attribute lookup costs microseconds.
        own, out = self._parameters, self.out_proj._parameters
        return (own["in_proj_weight"], own["q_proj_weight"], own["k_proj_weight"],
                own["v_proj_weight"], own["in_proj_bias"], out["weight"], out["bias"])

    def forward(self, query: Tensor, key: Tensor, value: Tensor,
                key_padding_mask: Optional[Tensor] = None, need_weights: bool = True,
                attn_mask: Optional[Tensor] = None, average_attn_weights: bool = True,
                is_causal: bool = False) -> Tuple[Tensor, Optional[Tensor]]:
        if self.training and self.dropout > 0:
            raise NotImplementedError(
                f"mha.MultiheadAttention: dropout={self.dropout} in training mode (call .eval())")
        dtype = self.out_proj.weight.dtype
        for name, tensor in (("query", query), ("key", key), ("value", value)):
            _check_cpu(name, tensor, dtype)
        _check_mask("key_padding_mask", key_padding_mask)
        _check_mask("attn_mask", attn_mask)
        if query.dim() not in (2, 3) or key.dim() != query.dim() or value.dim() != query.dim():
            raise ValueError(
                f"query, key and value have shapes {tuple(query.shape)}, {tuple(key.shape)} and "
                f"{tuple(value.shape)}: all must be 3-D (batched) or all 2-D [L, E] (unbatched)")
        batched = query.dim() == 3
        if not batched:  # [L, E]: one sequence
            query, key, value = query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        elif not self.batch_first:  # [L, N, E]
            query, key, value = query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1)
        weights = self._weights()
        if _traced(query):
            output, weights = multihead_attention(
                query, key, value, *weights, self.num_heads, self._module_id, key_padding_mask,
                attn_mask, is_causal, need_weights, average_attn_weights)
        else:
            output, weights = _forward(query, key, value, weights, self.num_heads,
                                       self._module_id, key_padding_mask, attn_mask, is_causal,
                                       need_weights, average_attn_weights)
        if not batched:
            return output.squeeze(0), weights.squeeze(0) if need_weights else None
        if not self.batch_first:
            output = output.transpose(0, 1).contiguous()
        return output, weights if need_weights else None

    def make_cache(self, batch: int, capacity: int, dtype: Optional[torch.dtype] = None,
                   rotary: Optional[Rotary] = None) -> _mha.KvCache:
        """A KV cache for decode(): `batch` rows of up to `capacity` tokens (kdim = vdim = E),
        its keys and values stored in `dtype` (float32, bfloat16, float16, or int8 with one scale
        per token and head; the module's parameters' by default), rounded to it once as they are
        appended. With ``rotary`` (an
        ``mha.Rotary``), each step rotates its new tokens' queries and keys at their positions
        (the row's cached tokens count from 0) before their keys are stored, as an LLM's
        attention does; the cache copies its tables."""
        if dtype is not None and dtype not in _CACHE_DTYPES:
            raise TypeError(f"a cache of {dtype}: it holds float32, bfloat16, float16 or int8")
        name = _CACHE_DTYPES[dtype or self.out_proj.weight.dtype]
        return _native(self._module_id, self.num_heads, self._weights()).make_cache(
            batch, capacity, name, rotary_args(rotary))

    def decode(self, tokens: Tensor, cache: Union[_mha.KvCache, PagedDecodeCache],
               key_padding_mask: Optional[Tensor] = None, new_tokens=()) -> Tensor:
        """One decode step of self-attention: `tokens` ([B, n, E], or [n, B, E] unless
        batch_first) are appended to `cache`; each attends over its row's cached tokens and the
        new ones up to itself, as forward() with is_causal over the whole sequence would.
        ``key_padding_mask`` [B, capacity] (bool, True = hidden) hides cache positions;
        ``new_tokens`` says how many of the n each row appends (default: all).

        ``cache`` is a ``make_cache()`` cache, or an engine's paged one (``mha.PagedDecodeCache``:
        its tensors, in float32 or the module's dtype; the step writes each sequence's new key
        and value into its slot and reads the sequence's keys through the block table). A paged
        step takes one token per sequence (n = 1) and no ``key_padding_mask`` or
        ``new_tokens``: a negative slot makes a row padding."""
        _check_cpu("tokens", tokens, self.out_proj.weight.dtype)
        if tokens.dim() == 3 and not self.batch_first:
            tokens = tokens.transpose(0, 1)
        tokens = tokens.detach().contiguous()
        output = torch.empty_like(tokens)
        native = _native(self._module_id, self.num_heads, self._weights())
        if isinstance(cache, PagedDecodeCache):
            if key_padding_mask is not None or len(new_tokens) != 0:
                raise ValueError("a paged decode step takes no key_padding_mask or new_tokens: "
                                 "a negative slot in slot_mapping makes a row padding")
            check_decode_cache(cache)
            native.decode_paged(_array(tokens), *(_strided(t) for t in cache[:5]), _array(output),
                                _DTYPES[tokens.dtype], _DTYPES[cache.key_cache.dtype],
                                rotary_args(cache.rotary))
            return output if self.batch_first else output.transpose(0, 1).contiguous()
        step = dict(key_padding_mask=None if key_padding_mask is None
                    else _array(key_padding_mask.to(torch.bool)), new_tokens=list(new_tokens))
        if tokens.dtype == torch.float32:
            native.decode(_array(tokens), cache, output.numpy(), **step)
        else:
            native.decode_bits(_array(tokens), cache, _array(output), _DTYPES[tokens.dtype],
                               **step)
        if not self.batch_first:
            output = output.transpose(0, 1).contiguous()
        return output
