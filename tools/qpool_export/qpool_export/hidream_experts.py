"""HiDream-I1's feed-forwards for hidream_transformer.py: the SwiGLU (through qpool::swiglu once
fused) and the image stream's mixture of experts, per expert or grouped.

Note [Routed experts]
The feed-forward of the image stream is a mixture of experts: a softmax gate picks
num_activated_experts of num_routed_experts per token and adds their outputs weighted by the gate,
plus a shared expert. Each expert runs on its own tokens only, as diffusers' moe_infer, so each
token's sum is diffusers' up to rounding (the gate weight multiplies the rows before the expert's
last linear, inside qpool::swiglu, rather than after it). Two forms, chosen at import:
- Grouped (MoeSwiGlu.group(), which every import of unquantized checkpoint weights does after
  fusing them): the experts' w13 and w2 are stacked into one GroupedQuantLinear each, a layer
  of [experts * out, in] that quantizes as one (--quantize at import, or the server at load);
  the token-expert pairs are put in expert order (stable, by counting: expert_order), each
  pair's row gathered, and two grouped products (qpool::grouped_quant_linear, Note [Grouped
  linear op] in server/quant/grouped_linear_op.h: torch._grouped_mm, one kernel for every
  expert, each on its rows, after dequantizing a quantized layer) run w13 and w2 on the ordered
  rows, with where each
  expert's rows end counted on the device; the rows go back to their token's order and each
  token sums its activated experts. Nothing reads a size on the host (in bfloat16 on Hopper,
  where the product is one CUTLASS kernel; elsewhere PyTorch may take a per-expert fallback
  that reads the ends, whose capture then fails and leaves the forward eager, Note [Forward
  graphs] in server/component/graph_cache.h), so the forward is CUDA-graph capturable (Note
  [HiDream conditioning]). The products equal the per-expert ones bit for bit
  (bench/results/hidream_moe_grouped_h200.txt). A quantized layer pays a dequantization of the
  experts' weights per call for it, and w8a8 multiplies weight-only there.
- Per expert (bitsandbytes checkpoints, whose layers keep their names, and widths the grouped
  product's kernel does not take): nonzero() finds each expert's tokens, index_select gathers
  them and index_add puts the weighted outputs back, experts in order. The trace keeps those
  sizes as data (no Python int comes from a tensor), so one trace serves every routing, but
  nonzero waits for the GPU, and such a forward runs without CUDA graphs.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import ops
from .blocks import fused_linear
from .grouped_quant import GroupedQuantLinear


def swiglu_width(hidden_dim: int, multiple_of: int = 256) -> int:
    """HiDreamImageFeedForwardSwiGLU's inner width for `hidden_dim`."""
    hidden_dim = int(2 * hidden_dim / 3)
    return multiple_of * ((hidden_dim + multiple_of - 1) // multiple_of)


# qpool::swiglu's schema, byte-identical to kSwigluSchema in server/quant/swiglu_op.h (a unit test
# compares them).
SWIGLU_SCHEMA = "swiglu(Tensor x, Tensor? weight) -> Tensor"


def _swiglu_ref(x: torch.Tensor, weight: Optional[torch.Tensor]) -> torch.Tensor:
    """silu of x's first half times its second, times weight[..., None] where given:
    qpool::swiglu's reference, the server's CPU kernel's operations (Note [SwiGLU op] in
    server/quant/swiglu_op.h)."""
    gate, value = x.chunk(2, dim=-1)
    out = F.silu(gate) * value
    return out if weight is None else out * weight[..., None]


def _swiglu_fake(x: torch.Tensor, weight: Optional[torch.Tensor]) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], x.shape[-1] // 2))


_SWIGLU_LIB = ops.register(SWIGLU_SCHEMA, _swiglu_ref, _swiglu_fake)


class SwiGlu(nn.Module):
    """w2(silu(w1 x) * w3 x), each row's product times `weight` (a routed expert's gate weights,
    Note [Routed experts]) before w2 where one is given."""

    def __init__(self, dim: int, hidden_dim: int):
        super().__init__()
        inner = swiglu_width(hidden_dim)
        self.w1 = nn.Linear(dim, inner, bias=False)
        self.w2 = nn.Linear(inner, dim, bias=False)
        self.w3 = nn.Linear(dim, inner, bias=False)

    def fuse(self) -> bool:
        """w1 and w3 as one w13 (Note [Fused projections] in blocks.py); False, changing
        nothing, where they are not plain linears."""
        fused = fused_linear([self.w1, self.w3])
        if fused is None:
            return False
        del self.w1, self.w3
        self.w13 = fused
        return True

    def forward(self, x: torch.Tensor, weight: Optional[torch.Tensor] = None) -> torch.Tensor:
        if hasattr(self, "w13"):  # one qpool::swiglu (Note [SwiGLU op])
            return self.w2(torch.ops.qpool.swiglu(self.w13(x), weight))
        h = F.silu(self.w1(x)) * self.w3(x)
        return self.w2(h if weight is None else h * weight[..., None])


class MoeGate(nn.Module):
    def __init__(self, dim: int, experts: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(experts, dim) / dim ** 0.5)


class MoeSwiGlu(nn.Module):
    """The routed experts, grouped or each on its own tokens (Note [Routed experts]), and the
    shared one."""

    def __init__(self, dim: int, hidden_dim: int, routed: int, activated: int):
        super().__init__()
        self.activated = activated
        self.shared_experts = SwiGlu(dim, hidden_dim // 2)
        self.experts = nn.ModuleList(SwiGlu(dim, hidden_dim) for _ in range(routed))
        self.gate = MoeGate(dim, routed)

    def group(self) -> bool:
        """The routed experts' fused weights stacked as w13 (experts of 2 inner x dim) and w2
        (experts of dim x inner), GroupedQuantLinear layers, for the grouped form (Note [Routed
        experts]); False, changing nothing, unless every expert is fused into plain linears
        without bias whose widths are multiples of 16 (what the grouped product's CUDA kernel
        takes)."""
        experts = list(self.experts)

        def plain(layer: nn.Module) -> bool:
            return (type(layer) is nn.Linear and layer.bias is None
                    and layer.in_features % 16 == 0 and layer.out_features % 16 == 0)

        if not experts or not all(hasattr(e, "w13") and plain(e.w13) and plain(e.w2)
                                  for e in experts):
            return False
        self.w13 = GroupedQuantLinear.stacked([e.w13.weight for e in experts])
        self.w2 = GroupedQuantLinear.stacked([e.w2.weight for e in experts])
        del self.experts
        return True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.flatten(0, 1)  # [tokens, dim]
        scores = F.linear(flat, self.gate.weight).softmax(dim=-1)
        top_weight, top_index = torch.topk(scores, k=self.activated, dim=-1, sorted=False)
        routed = self._grouped if hasattr(self, "w13") else self._per_expert
        return routed(flat, top_weight.type_as(flat), top_index).view(x.shape) + \
            self.shared_experts(x)

    def _per_expert(self, flat: torch.Tensor, top_weight: torch.Tensor,
                    top_index: torch.Tensor) -> torch.Tensor:
        y = torch.zeros_like(flat)
        for i, expert in enumerate(self.experts):
            token, slot = (top_index == i).nonzero(as_tuple=True)
            out = expert(flat.index_select(0, token), top_weight[token, slot])
            y = y.index_add(0, token, out.type_as(flat))
        return y

    def _grouped(self, flat: torch.Tensor, top_weight: torch.Tensor,
                 top_index: torch.Tensor) -> torch.Tensor:
        k = self.activated
        order, place, ends = expert_order(top_index.flatten(), self.w13.groups)
        rows = flat.index_select(0, order // k)
        h = torch.ops.qpool.swiglu(self.w13(rows, ends),
                                   top_weight.flatten().index_select(0, order))
        out = self.w2(h, ends)
        return out.index_select(0, place).view(-1, k, flat.shape[-1]).sum(1)


def expert_order(expert: torch.Tensor, groups: int):
    """The token-expert pairs (expert[p]: pair p's expert, int64, below groups) ordered by expert,
    stably, by counting rather than sorting (Note [Routed experts]): `order[i]` is the pair at
    sorted position i, `place[p]` the sorted position of pair p, `ends[e]` (int32) where expert
    e's pairs end. A pair's position is its expert's start plus the pairs of that expert before
    it: a running count along each expert's row of [groups, pairs] flags, the innermost
    dimension (a count down the pairs of [pairs, groups] runs a far slower scan on CUDA). On the
    GPU this took less time than the two radix sorts of torch.sort and argsort
    (bench/expert_order_bench.py). The ids come from `expert`, not torch.arange (which a trace
    bakes a device into)."""
    ids = expert.new_ones(groups).cumsum(0) - 1
    hot = (ids[:, None] == expert[None, :]).to(torch.int32)  # [groups, pairs]
    seen = hot.cumsum(1)  # pairs of each expert up to and including p
    counts = hot.sum(1)
    ends = counts.cumsum(0)
    place = (ends - counts).index_select(0, expert) + seen.gather(0, expert[None, :])[0] - 1
    pair = expert.new_ones(expert.shape[0]).cumsum(0) - 1
    order = torch.empty_like(pair).index_copy(0, place, pair)
    return order, place, ends.to(torch.int32)


def group_experts(module: nn.Module) -> int:
    """Stacks the routed experts of every mixture in `module` (the transformer, or one of its
    blocks streamed alone) for the grouped form (Note [Routed experts]), after fuse_projections;
    returns how many were grouped."""
    return sum(m.group() for m in list(module.modules()) if isinstance(m, MoeSwiGlu))
