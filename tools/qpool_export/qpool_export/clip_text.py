"""A trace-clean CLIP text encoder with transformers' parameter names (CLIPTextModel, and
CLIPTextModelWithProjection's text_projection) (Note [Importing through qpool's modules] in
sd_unet.py).

forward(input_ids int64 [B, L]) -> hidden states [B, L, hidden], or with `pooled` the tuple
(hidden states, text_embeds [B, projection_dim]). `skip` is diffusers' clip_skip:
- kind sd (`penultimate` false): the output of layer -(skip + 1) after the final layer norm (the
  last hidden state when skip is 0);
- kind sdxl (`penultimate` true): the output of layer -(skip + 2) without the final layer norm
  (StableDiffusionXLPipeline's hidden_states[-(clip_skip + 2)]).
text_embeds is CLIPTextModelWithProjection's: the final layer norm of the last layer's output at
the end-of-text position, through text_projection.
With `pooler` (kind flux), forward returns CLIPTextModel's pooler_output alone, [B, hidden]: the
final layer norm of the last layer's output at the end-of-text position; with `projected` (kind
hidream, both CLIPs) text_embeds alone, [B, projection_dim].
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List

import torch
import torch.nn as nn
import torch.nn.functional as F

from .import_error import ImportFailure
from .smoothquant import Fold
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
    projection_dim: int = 0  # CLIPTextModelWithProjection's text_projection width
    # The end-of-text token text_embeds is read at: its first position, or with transformers'
    # legacy value 2 (configs written before the fix, SDXL's among them) the largest id's.
    eos_token_id: int = 49407

    @staticmethod
    def from_transformers(config: Dict[str, object], where: str) -> "ClipTextConfig":
        act = config.get("hidden_act", "quick_gelu")
        if act not in ("quick_gelu", "gelu"):
            raise ImportFailure(f"{where}: field 'hidden_act' is {act!r}; qpool imports "
                                f"'quick_gelu' or 'gelu'")

        def number(field: str, cast=int, default=None):
            value = config.get(field, default)
            if value is None:
                raise ImportFailure(f"{where}: field '{field}' is required")
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ImportFailure(f"{where}: field '{field}' is {value!r}; expected a number")
            return cast(value)

        return ClipTextConfig(
            vocab_size=number("vocab_size"), hidden_size=number("hidden_size"),
            intermediate_size=number("intermediate_size"),
            num_hidden_layers=number("num_hidden_layers"),
            num_attention_heads=number("num_attention_heads"),
            max_position_embeddings=number("max_position_embeddings", default=77),
            layer_norm_eps=number("layer_norm_eps", float, 1e-5), hidden_act=act,
            projection_dim=number("projection_dim", default=0),
            eos_token_id=number("eos_token_id", default=49407))


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

    def smoothing_folds(self) -> List[Fold]:
        """The MLP's first layer reads layer_norm2 alone (Note [Folded smoothing] in
        smoothquant.py)."""
        return [Fold("mlp.fc1", "layer_norm2")]


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
    def __init__(self, cfg: ClipTextConfig, skip: int = 0, penultimate: bool = False,
                 pooled: bool = False, pooler: bool = False, projected: bool = False):
        super().__init__()
        if (pooler or projected) and (pooled or skip or penultimate or (pooler and projected)):
            raise ImportFailure("the pooler output is read at the last layer, with no "
                                "clip skip, alone or projected")
        if not 0 <= skip < cfg.num_hidden_layers:
            raise ImportFailure(f"clip skip {skip} must be in [0, {cfg.num_hidden_layers})")
        if (pooled or projected) and cfg.projection_dim <= 0:
            raise ImportFailure("text_embeds need a text_projection (config field "
                                "'projection_dim')")
        self.config = cfg
        # The hidden states are the output of the first `hidden_layers` layers.
        self.hidden_layers = cfg.num_hidden_layers - skip - (1 if penultimate else 0)
        self.norm_hidden = not penultimate
        self.pooled = pooled
        self.pooler = pooler
        self.projected = projected
        self.embeddings = ClipEmbeddings(cfg)
        self.encoder = ClipEncoder(cfg)
        self.final_layer_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        if pooled or projected:
            self.text_projection = nn.Linear(cfg.hidden_size, cfg.projection_dim, bias=False)

    def drop_unused(self) -> None:
        """Drops what forward never runs (the layers past the hidden states' and, without
        text_embeds, the final layer norm where the hidden states skip it), weights included."""
        if self.pooled or self.pooler or self.projected:
            return
        del self.encoder.layers[self.hidden_layers:]
        if not self.norm_hidden:
            self.final_layer_norm = None

    def _pooler_output(self, input_ids: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        if self.config.eos_token_id == 2:
            eos = input_ids.argmax(-1)
        else:  # the first end-of-text token (the pad token may be the same one)
            eos = (input_ids == self.config.eos_token_id).type_as(input_ids).argmax(-1)
        index = eos[:, None, None].expand(-1, 1, last.shape[2])
        return self.final_layer_norm(last.gather(1, index)[:, 0])

    def _text_embeds(self, input_ids: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        return self.text_projection(self._pooler_output(input_ids, last))

    def forward(self, input_ids: torch.Tensor):
        x = self.embeddings(input_ids)
        if self.pooler or self.projected:
            for layer in self.encoder.layers:
                x = layer(x)
            if self.projected:
                return self._text_embeds(input_ids, x)
            return self._pooler_output(input_ids, x)
        hidden = x
        for i, layer in enumerate(self.encoder.layers):
            x = layer(x)
            if i + 1 == self.hidden_layers:
                hidden = x
        if self.norm_hidden:
            hidden = self.final_layer_norm(hidden)
        if self.pooled:
            return hidden, self._text_embeds(input_ids, x)
        return hidden
