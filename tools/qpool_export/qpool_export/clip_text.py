"""A trace-clean CLIP text encoder with transformers' parameter names (CLIPTextModel, and
CLIPTextModelWithProjection's text_projection) (Note [Importing through qpool's modules] in
sd_unet.py).

forward(input_ids int64 [B, L]) -> hidden states [B, L, hidden]: the last layer's after the final
layer norm, or with `skip` > 0 the output of layer -(skip + 1) after the final layer norm (what
diffusers' clip_skip gives).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict

import torch
import torch.nn as nn
import torch.nn.functional as F

from .import_error import ImportFailure
from .text_encoder import ClipAttention


@dataclass(frozen=True)
class ClipTextConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    max_position_embeddings: int
    layer_norm_eps: float
    hidden_act: str  # quick_gelu | gelu

    @staticmethod
    def from_transformers(config: Dict[str, object], where: str) -> "ClipTextConfig":
        act = config.get("hidden_act", "quick_gelu")
        if act not in ("quick_gelu", "gelu"):
            raise ImportFailure(f"{where}: field 'hidden_act' is {act!r}; qpool imports "
                                f"'quick_gelu' or 'gelu'")
        try:
            return ClipTextConfig(
                vocab_size=int(config["vocab_size"]), hidden_size=int(config["hidden_size"]),
                intermediate_size=int(config["intermediate_size"]),
                num_hidden_layers=int(config["num_hidden_layers"]),
                num_attention_heads=int(config["num_attention_heads"]),
                max_position_embeddings=int(config.get("max_position_embeddings", 77)),
                layer_norm_eps=float(config.get("layer_norm_eps", 1e-5)), hidden_act=act)
        except KeyError as e:
            raise ImportFailure(f"{where}: field {e} is required") from None


class ClipMlp(nn.Module):
    def __init__(self, dim: int, hidden: int, act: str):
        super().__init__()
        self.quick = act == "quick_gelu"
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x)
        if self.quick:
            # aten::mul.Scalar keeps 1.702 a float (Note [No tensor constants] in tracing.py).
            h = h * torch.sigmoid(torch.ops.aten.mul.Scalar(h, 1.702))
        else:
            h = F.gelu(h)
        return self.fc2(h)


class ClipLayer(nn.Module):
    def __init__(self, cfg: ClipTextConfig):
        super().__init__()
        self.self_attn = ClipAttention(cfg.hidden_size, cfg.num_attention_heads)
        self.layer_norm1 = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.mlp = ClipMlp(cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act)
        self.layer_norm2 = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp(self.layer_norm2(x))


class ClipEmbeddings(nn.Module):
    def __init__(self, cfg: ClipTextConfig):
        super().__init__()
        self.token_embedding = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.position_embedding = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = self.position_embedding.weight[: input_ids.shape[1]]
        return self.token_embedding(input_ids) + positions[None]


class ClipEncoder(nn.Module):
    def __init__(self, cfg: ClipTextConfig):
        super().__init__()
        self.layers = nn.ModuleList(ClipLayer(cfg) for _ in range(cfg.num_hidden_layers))


class ClipTextEncoder(nn.Module):
    def __init__(self, cfg: ClipTextConfig, skip: int = 0):
        super().__init__()
        if not 0 <= skip < cfg.num_hidden_layers:
            raise ImportFailure(f"clip skip {skip} must be in [0, {cfg.num_hidden_layers})")
        self.config = cfg
        self.skip = skip
        self.embeddings = ClipEmbeddings(cfg)
        self.encoder = ClipEncoder(cfg)
        self.final_layer_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embeddings(input_ids)
        for layer in self.encoder.layers[: len(self.encoder.layers) - self.skip]:
            x = layer(x)
        return self.final_layer_norm(x)
