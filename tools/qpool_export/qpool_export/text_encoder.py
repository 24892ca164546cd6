"""CLIP-text-like transformer (the SD 1.x text encoder's structure) with random weights.

Every linear layer is a plain nn.Linear (so quant.quantize_module can swap it) and every tensor
the forward needs is a parameter or buffer (no tensor constants after torch.jit.trace).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List

import torch
import torch.nn as nn
import torch.nn.functional as F

from .smoothquant import Fold


@dataclass(frozen=True)
class TextEncoderConfig:
    vocab_size: int = 49408
    hidden_size: int = 768
    num_layers: int = 12
    num_heads: int = 12
    intermediate_size: int = 3072
    max_position_embeddings: int = 77
    layer_norm_eps: float = 1e-5


class ClipAttention(nn.Module):
    """Multi-head causal self-attention with separate q/k/v/out projections."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        if dim % heads:
            raise ValueError(f"hidden size {dim} is not divisible by {heads} heads")
        self.heads = heads
        self.q_proj = nn.Linear(dim, dim)
        self.k_proj = nn.Linear(dim, dim)
        self.v_proj = nn.Linear(dim, dim)
        self.out_proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q = self.q_proj(x).view(b, n, self.heads, -1).transpose(1, 2)
        k = self.k_proj(x).view(b, n, self.heads, -1).transpose(1, 2)
        v = self.v_proj(x).view(b, n, self.heads, -1).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out_proj(y.transpose(1, 2).reshape(b, n, d))

    def smoothing_folds(self) -> List[Fold]:
        """The output projection reads the value projection's channels (Note [Folded
        smoothing] in smoothquant.py)."""
        return [Fold("out_proj", "v_proj")]


class ClipMlp(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x)
        # quick_gelu. aten::mul.Scalar records 1.702 as a float; `1.702 * h` would trace to a
        # 0-dim tensor constant (Note [No tensor constants] in tracing.py).
        return self.fc2(h * torch.sigmoid(torch.ops.aten.mul.Scalar(h, 1.702)))


class ClipEncoderLayer(nn.Module):
    """Pre-LN transformer layer: x + attn(ln1(x)), then x + mlp(ln2(x))."""

    def __init__(self, cfg: TextEncoderConfig):
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.self_attn = ClipAttention(cfg.hidden_size, cfg.num_heads)
        self.layer_norm2 = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.mlp = ClipMlp(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp(self.layer_norm2(x))

    def smoothing_folds(self) -> List[Fold]:
        """The MLP's first layer reads layer_norm2 alone (Note [Folded smoothing])."""
        return [Fold("mlp.fc1", "layer_norm2")]


class TextEncoder(nn.Module):
    """forward(input_ids int64 [B, L<=max_positions]) -> last hidden state [B, L, hidden_size]."""

    def __init__(self, cfg: TextEncoderConfig):
        super().__init__()
        self.config = cfg
        self.token_embedding = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.position_embedding = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        self.register_buffer("position_ids",
                             torch.arange(cfg.max_position_embeddings, dtype=torch.long)[None, :])
        self.layers = nn.ModuleList(ClipEncoderLayer(cfg) for _ in range(cfg.num_layers))
        self.final_layer_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = self.position_ids[:, : input_ids.shape[1]]
        x = self.token_embedding(input_ids) + self.position_embedding(positions)
        for layer in self.layers:
            x = layer(x)
        return self.final_layer_norm(x)
