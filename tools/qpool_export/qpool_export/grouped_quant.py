"""The mixture-of-experts grouped layer: the Python reference of the ``qpool::grouped_quant_linear``
op (Note [Grouped linear op] in server/quant/grouped_linear_op.h) and ``GroupedQuantLinear``, a
mixture's routed experts as one quantizable layer of their stacked weights (hidream_experts.py,
Note [Routed experts]). Its tensors are a QuantLinear's (quant.py), which quantize_module
quantizes as one layer.
"""

import torch

from . import ops
from .quant import QuantLinear, State, _check_devices, _layout, dequantize_tensors, quantize

# Byte-identical to kGroupedQuantLinearSchema in server/quant/grouped_linear_op.h; keep it on one
# line: unit_grouped_linear_op_test reads it from this file and compares.
GROUPED_QUANT_LINEAR_SCHEMA = "grouped_quant_linear(Tensor x, Tensor offs, Tensor weight, Tensor absmax, Tensor code, Tensor nested_absmax, Tensor nested_code, Tensor offset) -> Tensor"  # noqa: E501


def _grouped_check(x, offs, weight, absmax, code, nested_absmax, nested_code_t, offset):
    _check_devices(x, weight, absmax, code, nested_absmax, nested_code_t, offset, None)
    if offs.device != x.device:
        raise RuntimeError(f"qpool::grouped_quant_linear: offs is on {offs.device} but x is on "
                           f"{x.device}; every tensor must be on x's device")
    if x.dim() != 2 or x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise RuntimeError(f"qpool::grouped_quant_linear: x must be a float32, float16 or "
                           f"bfloat16 [rows, in_features], got {x.dtype} {tuple(x.shape)}")
    if offs.dim() != 1 or offs.numel() < 1 or offs.dtype != torch.int32:
        raise RuntimeError(f"qpool::grouped_quant_linear: offs must be int32 [groups] with at "
                           f"least one group, got {offs.dtype} {tuple(offs.shape)}")
    if weight.dim() != 2 or weight.shape[0] % offs.numel():
        raise RuntimeError(f"qpool::grouped_quant_linear: weight must be [groups * "
                           f"out_features, ...] for {offs.numel()} groups, got "
                           f"{tuple(weight.shape)}")


def _grouped_quant_linear_ref(x, offs, weight, absmax, code, nested_absmax, nested_code_t,
                              offset):
    """qpool::grouped_quant_linear's reference (Note [Grouped linear op] in
    server/quant/grouped_linear_op.h): the server's CPU kernel's operations, a float layer in
    x's dtype, a quantized one dequantized into float32 (on CUDA into x's dtype, as the
    server's CUDA kernel)."""
    _grouped_check(x, offs, weight, absmax, code, nested_absmax, nested_code_t, offset)
    from .weights_file import is_placeholder

    groups, k = offs.numel(), x.shape[1]
    n = weight.shape[0] // groups
    if is_placeholder(weight):
        # A streamed graph's placeholder (Note [Streaming import] in stream_import.py), zeros,
        # which the grouped product refuses (stride 0): the product is zeros.
        return x.new_zeros((x.shape[0], n))
    fmt = _layout(weight, absmax, code, k)[0]
    dtype = x.dtype if fmt == "none" or x.is_cuda else torch.float32
    w = dequantize_tensors(weight, absmax, code, nested_absmax, nested_code_t, offset, k, dtype)
    if x.shape[0] == 0:
        return x.new_empty((0, n))
    w = w.contiguous().view(groups, n, k).transpose(1, 2)
    return torch._grouped_mm(x.to(dtype).contiguous(), w, offs=offs).to(x.dtype)


def _grouped_quant_linear_fake(x, offs, weight, absmax, code, nested_absmax, nested_code_t,
                               offset):
    _grouped_check(x, offs, weight, absmax, code, nested_absmax, nested_code_t, offset)
    return x.new_empty((x.shape[0], weight.shape[0] // offs.numel()))


_GROUPED_LIB = ops.register(GROUPED_QUANT_LINEAR_SCHEMA, _grouped_quant_linear_ref,
                            _grouped_quant_linear_fake)


class GroupedQuantLinear(QuantLinear):
    """`groups` linears of in_features -> out_features without bias, one per group of rows (a
    mixture's routed experts), through torch.ops.qpool.grouped_quant_linear (Note [Grouped linear
    op] in server/quant/grouped_linear_op.h). Its tensors are one QuantLinear's for the weights
    stacked as [groups * out_features, in_features], so quantize_module and the server's
    load-time quantizer quantize it as one layer."""

    def __init__(self, in_features: int, out_features: int, groups: int, state: State):
        super().__init__(in_features, groups * out_features, state)
        self.groups = groups
        self.group_features = out_features

    @classmethod
    def stacked(cls, weights) -> "GroupedQuantLinear":
        """A float layer of the [out, in] `weights`, one per group."""
        w = torch.stack([t.detach() for t in weights])
        groups, out, k = w.shape
        return cls(k, out, groups, quantize(w.reshape(groups * out, k), "none"))

    def forward(self, x: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return torch.ops.qpool.grouped_quant_linear(x, offs, self.weight, self.absmax, self.code,
                                                    self.nested_absmax, self.nested_code,
                                                    self.offset)

    def extra_repr(self) -> str:
        return (f"groups={self.groups}, in_features={self.in_features}, "
                f"out_features={self.group_features}, format={self.format}")
