"""Multi-head attention with ahead-of-time compiled Halide kernels.

- ``mha.Attention``: NumPy arrays in and out, no PyTorch needed (also the KV-cache decode step).
- ``mha.MultiheadAttention``: a ``torch.nn.Module`` with the constructor, forward and
  ``state_dict`` of ``torch.nn.MultiheadAttention`` (imported when PyTorch is installed).
- ``mha.scaled_dot_product_attention``: ``torch.nn.functional.scaled_dot_product_attention``'s
  signature and semantics, with sliding windows, soft-capping and ALiBi; ``import
  mha.transformers`` registers it with Hugging Face transformers as ``attn_implementation="mha"``.
- ``mha.paged_attention`` and ``mha.write_paged_cache``: a decode step over a paged KV cache in
  FlashAttention's and vLLM's layout; ``mha.PagedBlockTables`` hands its blocks to sequences;
  ``mha.MultiheadAttention.decode`` steps over one too (``mha.PagedDecodeCache``).
- ``mha.varlen_attention``: sequences packed without padding (``flash_attn_varlen_func``);
  ``mha.rotary_embedding`` rotates their queries and keys in place (vLLM's op); given an
  ``mha.Rotary``, the attention calls read them rotated, and a module's decode steps rotate their
  new tokens' queries and keys.
"""
from ._mha import (Error, KvCache, PagedBlockTables, dispatched_isa, set_num_threads,
                   tuned_schedules)
from ._numpy import Attention

__all__ = [
    "Attention",
    "Error",
    "KvCache",
    "PagedBlockTables",
    "dispatched_isa",
    "set_num_threads",
    "tuned_schedules",
]

try:
    import torch  # noqa: F401
except ImportError:  # the NumPy API works without PyTorch
    pass
else:
    from ._paged import PagedDecodeCache, paged_attention, write_paged_cache
    from ._rotary import Rotary, rotary_embedding
    from ._sdpa import scaled_dot_product_attention
    from ._torch import MultiheadAttention
    from ._varlen import varlen_attention

    __all__ += ["MultiheadAttention", "PagedDecodeCache", "Rotary", "paged_attention",
                "rotary_embedding", "scaled_dot_product_attention", "varlen_attention",
                "write_paged_cache"]
