"""Multi-head attention with ahead-of-time compiled Halide kernels.

- ``mha.Attention``: NumPy arrays in and out, no PyTorch needed (also the KV-cache decode step).
- ``mha.MultiheadAttention``: a ``torch.nn.Module`` with the constructor, forward and
  ``state_dict`` of ``torch.nn.MultiheadAttention`` (imported when PyTorch is installed).
- ``mha.scaled_dot_product_attention``: ``torch.nn.functional.scaled_dot_product_attention``'s
  signature and semantics, with sliding windows, soft-capping and ALiBi; ``import
  mha.transformers`` registers it with Hugging Face transformers as ``attn_implementation="mha"``.
"""
from ._mha import Error, KvCache, dispatched_isa, set_num_threads, tuned_schedules
from ._numpy import Attention

__all__ = [
    "Attention",
    "Error",
    "KvCache",
    "dispatched_isa",
    "set_num_threads",
    "tuned_schedules",
]

try:
    import torch  # noqa: F401
except ImportError:  # the NumPy API works without PyTorch
    pass
else:
    from ._sdpa import scaled_dot_product_attention
    from ._torch import MultiheadAttention

    __all__ += ["MultiheadAttention", "scaled_dot_product_attention"]
