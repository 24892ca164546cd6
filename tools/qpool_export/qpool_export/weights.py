"""Deterministic random initialisation of the exported modules."""

from __future__ import annotations

import zlib

import torch
import torch.nn as nn


def component_seed(seed: int, component: str) -> int:
    """Seed of one component: independent of which other components are exported."""
    return (seed * 1_000_003 + zlib.crc32(component.encode())) % (2**63)


def init_weights(module: nn.Module) -> None:
    """Re-initialises embeddings (N(0, 0.02), as CLIP) and norm affines (near identity, so they
    are not all-ones); linear and conv layers keep PyTorch's default (seeded) init."""
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.Embedding):
                m.weight.normal_(0.0, 0.02)
            elif isinstance(m, (nn.LayerNorm, nn.GroupNorm)) and m.weight is not None:
                m.weight.normal_(1.0, 0.02)
                m.bias.normal_(0.0, 0.02)


def build_component(preset, component: str, seed: int) -> nn.Module:
    """The preset's component with seeded weights, fp32 on CPU, eval mode, no grads."""
    torch.manual_seed(component_seed(seed, component))
    with torch.device("cpu"):
        module = preset.build(component)
    init_weights(module)
    return module.float().eval().requires_grad_(False)
