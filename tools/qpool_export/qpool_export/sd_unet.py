"""A trace-clean UNet2DConditionModel: diffusers' SD 1.x / 2.x and SDXL UNets rebuilt from their
config with the same parameter names, so a diffusers state dict loads into it strictly.

Note [Importing through qpool's modules]
diffusers and transformers modules cannot be traced as they are: they read `x.dtype` and
`x.device` in Python (`t_emb.to(dtype=sample.dtype)`, `torch.arange(..., device=...)`), which a
trace bakes into the graph as constants, so a component would stay on its export device and
dtype. The importer therefore builds qpool's own modules from the diffusers config, with the
parameter names of diffusers (and of transformers for CLIP), loads the checkpoint's state dict
into them with strict=True (a missing or unexpected tensor fails the import, naming it), and
checks them against the original modules on random inputs before anything is written. Only the
configurations written here are accepted; any other config value fails naming the field.

forward(sample [B, C, h, w], timestep [B] (dtype of sample), encoder_hidden_states [B, L, D])
  -> the model's prediction (epsilon or v) [B, C, h, w]; h and w may be any size.
With SDXL's `text_time` additional embedding (addition_embed_type), forward takes two more
inputs, text_embeds [B, P] (the pooled text embedding) and time_ids [B, 6] (original size, crop
top-left, target size; dtype of sample), added to the time embedding as diffusers does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn

from .blocks import (BasicTransformerBlock, ChannelsLastGroupNorm, Downsample2D,
                     PointwiseConv2d, ResnetBlock2D)
from .import_error import ImportFailure
from .unet import TimestepEmbedding, TimestepProjection, UpsampleToSkip


def _per_block(value: Union[int, Sequence[int]], n: int, field: str, where: str) -> List[int]:
    if isinstance(value, int):
        return [value] * n
    if isinstance(value, (list, tuple)) and len(value) == n and all(isinstance(v, int) for v in value):
        return list(value)
    raise ImportFailure(f"{where}: field '{field}' must be an int or a list of {n} ints "
                       f"(got {value!r})")


@dataclass(frozen=True)
class SdUNetConfig:
    in_channels: int
    out_channels: int
    block_out_channels: Tuple[int, ...]
    down_attention: Tuple[bool, ...]  # per down block (CrossAttnDownBlock2D or DownBlock2D)
    up_attention: Tuple[bool, ...]    # per up block (CrossAttnUpBlock2D or UpBlock2D)
    layers_per_block: int
    heads: Tuple[int, ...]            # per down block; up blocks take them reversed
    transformer_layers: Tuple[int, ...]  # per down block; up blocks take them reversed
    cross_attention_dim: int
    use_linear_projection: bool
    norm_num_groups: int
    norm_eps: float
    sample_size: int
    # SDXL's additional embedding ("text_time"), or None. With it: the width of each of the six
    # time ids' sinusoidal embeddings and the input width of add_embedding (pooled text + 6 *
    # addition_time_embed_dim).
    addition_embed_type: Optional[str] = None
    addition_time_embed_dim: int = 0
    projection_class_embeddings_input_dim: int = 0
    # The mid block (UNetMidBlock2DCrossAttn), or none (mid_block_type null: diffusers then runs
    # the up blocks on the last down block's output).
    mid_block: bool = True

    # The diffusers UNet2DConditionModel config values this module reproduces; any other value of
    # these fields is refused.
    FIXED = {
        "center_input_sample": False, "flip_sin_to_cos": True, "freq_shift": 0,
        "only_cross_attention": False,
        "downsample_padding": 1, "mid_block_scale_factor": 1, "act_fn": "silu",
        "encoder_hid_dim": None, "encoder_hid_dim_type": None, "dual_cross_attention": False,
        "class_embed_type": None, "num_class_embeds": None,
        "resnet_time_scale_shift": "default",
        "resnet_skip_time_act": False, "resnet_out_scale_factor": 1.0,
        "time_embedding_type": "positional", "time_embedding_dim": None,
        "time_embedding_act_fn": None, "timestep_post_act": None, "time_cond_proj_dim": None,
        "conv_in_kernel": 3, "conv_out_kernel": 3, "attention_type": "default",
        "class_embeddings_concat": False, "mid_block_only_cross_attention": None,
        "cross_attention_norm": None, "reverse_transformer_layers_per_block": None,
    }

    @staticmethod
    def from_diffusers(config: Dict[str, object], where: str) -> "SdUNetConfig":
        """`config` is the UNet's config.json as a dict; `where` names that file in errors."""
        mid = config.get("mid_block_type", "UNetMidBlock2DCrossAttn")
        if mid not in ("UNetMidBlock2DCrossAttn", None):
            raise ImportFailure(f"{where}: field 'mid_block_type' is {mid!r}; qpool imports "
                               f"'UNetMidBlock2DCrossAttn' or null")
        for field, want in SdUNetConfig.FIXED.items():
            got = config.get(field, want)
            if got != want and not (isinstance(want, float) and got == int(want)):
                raise ImportFailure(f"{where}: field '{field}' is {got!r}; qpool imports "
                                   f"{want!r} only")
        blocks = tuple(config["block_out_channels"])
        n = len(blocks)
        down, up = config["down_block_types"], config["up_block_types"]
        down_ok = {"CrossAttnDownBlock2D": True, "DownBlock2D": False}
        up_ok = {"CrossAttnUpBlock2D": True, "UpBlock2D": False}
        for field, types, ok in (("down_block_types", down, down_ok),
                                 ("up_block_types", up, up_ok)):
            if len(types) != n or any(t not in ok for t in types):
                raise ImportFailure(f"{where}: field '{field}' is {list(types)!r}; qpool imports "
                                   f"{n} of {sorted(ok)}")
        down_attention = tuple(down_ok[t] for t in down)
        up_attention = tuple(up_ok[t] for t in up)
        if up_attention != tuple(reversed(down_attention)):
            raise ImportFailure(f"{where}: field 'up_block_types' must mirror 'down_block_types'")
        # diffusers' legacy naming: attention_head_dim is the number of heads unless
        # num_attention_heads is given.
        heads_value = config.get("num_attention_heads") or config.get("attention_head_dim", 8)
        heads = _per_block(heads_value, n, "attention_head_dim", where)
        layers = _per_block(config.get("transformer_layers_per_block", 1), n,
                            "transformer_layers_per_block", where)
        lpb = config.get("layers_per_block", 2)
        if not isinstance(lpb, int):
            raise ImportFailure(f"{where}: field 'layers_per_block' must be an int (got {lpb!r})")
        cross = config.get("cross_attention_dim", 1280)
        if isinstance(cross, list) and cross and all(c == cross[0] for c in cross):
            cross = cross[0]  # one width per block, all equal: one width
        if not isinstance(cross, int):
            raise ImportFailure(f"{where}: field 'cross_attention_dim' must be an int or a list "
                               f"of equal ints (got {cross!r})")
        # upcast_attention is not read: it upcasts the scores of diffusers' unfused attention
        # only, and its fused attention (what diffusers runs) and qpool's compute the softmax in
        # float32 either way. Heads are counted where a block has attention (the mid block has).
        for i, (c, h) in enumerate(zip(blocks, heads)):
            if (down_attention[i] or (i == n - 1 and mid is not None)) and c % h:
                raise ImportFailure(f"{where}: {c} channels are not divisible by {h} heads "
                                   f"(field 'attention_head_dim')")
        addition = SdUNetConfig._addition(config, where)
        return SdUNetConfig(
            in_channels=config.get("in_channels", 4), out_channels=config.get("out_channels", 4),
            block_out_channels=blocks, down_attention=down_attention, up_attention=up_attention,
            layers_per_block=lpb, heads=tuple(heads), transformer_layers=tuple(layers),
            cross_attention_dim=cross,
            use_linear_projection=bool(config.get("use_linear_projection", False)),
            norm_num_groups=config.get("norm_num_groups", 32),
            norm_eps=float(config.get("norm_eps", 1e-5)),
            sample_size=config.get("sample_size", 64) or 64, mid_block=mid is not None,
            **addition)

    ADDITIONS = (None, "text_time")

    @staticmethod
    def _addition(config: Dict[str, object], where: str) -> Dict[str, object]:
        """The config's additional-embedding fields: none, or SDXL's text_time."""
        kind = config.get("addition_embed_type")
        if kind not in SdUNetConfig.ADDITIONS:
            raise ImportFailure(f"{where}: field 'addition_embed_type' is {kind!r}; qpool imports "
                               f"None (kind sd) or 'text_time' (kind sdxl)")
        if kind is None:
            return {}
        out: Dict[str, object] = {"addition_embed_type": kind}
        # The sinusoids come in cos/sin halves: an odd width (zero-padded by diffusers) is refused.
        for field, step in (("addition_time_embed_dim", 2),
                            ("projection_class_embeddings_input_dim", 1)):
            value = config.get(field)
            if not isinstance(value, int) or value <= 0 or value % step:
                raise ImportFailure(f"{where}: field '{field}' is {value!r}; 'text_time' needs a "
                                   f"positive {'even ' if step == 2 else ''}int")
            out[field] = value
        return out


class Transformer2D(nn.Module):
    """diffusers' Transformer2DModel (continuous input): GroupNorm, projection in (1x1 conv, or a
    linear over the tokens with use_linear_projection), transformer blocks, projection out,
    residual."""

    def __init__(self, channels: int, cross_dim: int, heads: int, groups: int, depth: int,
                 linear: bool):
        super().__init__()
        self.linear = linear
        self.norm = ChannelsLastGroupNorm(groups, channels, eps=1e-6)
        self.proj_in = (nn.Linear(channels, channels) if linear
                        else PointwiseConv2d(channels, channels))
        self.transformer_blocks = nn.ModuleList(
            BasicTransformerBlock(channels, cross_dim, heads) for _ in range(depth))
        self.proj_out = (nn.Linear(channels, channels) if linear
                         else PointwiseConv2d(channels, channels))

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        t = self.norm(x)
        if self.linear:
            t = self.proj_in(t.permute(0, 2, 3, 1).reshape(b, h * w, c))
        else:
            t = self.proj_in(t).permute(0, 2, 3, 1).reshape(b, h * w, c)
        for block in self.transformer_blocks:
            t = block(t, context)
        if self.linear:
            t = self.proj_out(t).reshape(b, h, w, c).permute(0, 3, 1, 2)
        else:
            t = self.proj_out(t.reshape(b, h, w, c).permute(0, 3, 1, 2))
        return x + t


class Block(nn.Module):
    """One level of the UNet (diffusers' down, mid or up block): its resnets, transformers and
    resampler, walked by SdUNet.forward."""

    def __init__(self):
        super().__init__()
        self.resnets = nn.ModuleList()
        self.attentions = nn.ModuleList()


class SdUNet(nn.Module):
    def __init__(self, cfg: SdUNetConfig):
        super().__init__()
        self.config = cfg
        ch0 = cfg.block_out_channels[0]
        temb_dim = ch0 * 4
        groups, eps = cfg.norm_num_groups, cfg.norm_eps

        def resnet(cin: int, cout: int) -> ResnetBlock2D:
            return ResnetBlock2D(cin, cout, temb_dim, groups, eps, ChannelsLastGroupNorm,
                                 channels_last=True)

        def transformer(c: int, heads: int, depth: int) -> Transformer2D:
            return Transformer2D(c, cfg.cross_attention_dim, heads, groups, depth,
                                 cfg.use_linear_projection)

        self.time_proj = TimestepProjection(ch0)
        self.time_embedding = TimestepEmbedding(ch0, temb_dim)
        if cfg.addition_embed_type == "text_time":
            self.add_time_proj = TimestepProjection(cfg.addition_time_embed_dim)
            self.add_embedding = TimestepEmbedding(cfg.projection_class_embeddings_input_dim,
                                                   temb_dim)
        self.conv_in = nn.Conv2d(cfg.in_channels, ch0, 3, padding=1)

        n = len(cfg.block_out_channels)
        skips: List[int] = [ch0]
        self.down_blocks = nn.ModuleList()
        cin = ch0
        for i, cout in enumerate(cfg.block_out_channels):
            block = Block()
            for _ in range(cfg.layers_per_block):
                block.resnets.append(resnet(cin, cout))
                if cfg.down_attention[i]:
                    block.attentions.append(transformer(cout, cfg.heads[i],
                                                        cfg.transformer_layers[i]))
                skips.append(cout)
                cin = cout
            if i < n - 1:
                block.downsamplers = nn.ModuleList([Downsample2D(cout)])
                skips.append(cout)
            self.down_blocks.append(block)

        if cfg.mid_block:
            self.mid_block = Block()
            self.mid_block.resnets.extend([resnet(cin, cin), resnet(cin, cin)])
            self.mid_block.attentions.append(transformer(cin, cfg.heads[-1],
                                                         cfg.transformer_layers[-1]))

        self.up_blocks = nn.ModuleList()
        heads = list(reversed(cfg.heads))
        layers = list(reversed(cfg.transformer_layers))
        for i, cout in enumerate(reversed(cfg.block_out_channels)):
            block = Block()
            for _ in range(cfg.layers_per_block + 1):
                block.resnets.append(resnet(cin + skips.pop(), cout))
                if cfg.up_attention[i]:
                    block.attentions.append(transformer(cout, heads[i], layers[i]))
                cin = cout
            if i < n - 1:
                block.upsamplers = nn.ModuleList([UpsampleToSkip(cout)])
            self.up_blocks.append(block)

        self.conv_norm_out = ChannelsLastGroupNorm(groups, ch0, eps=eps)
        self.conv_out = nn.Conv2d(ch0, cfg.out_channels, 3, padding=1)

    def forward(self, sample: torch.Tensor, timestep: torch.Tensor,
                encoder_hidden_states: torch.Tensor, text_embeds: Optional[torch.Tensor] = None,
                time_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        temb = self.time_embedding(self.time_proj(timestep, sample))
        if self.config.addition_embed_type == "text_time":
            if text_embeds is None or time_ids is None:
                raise ValueError("a text_time UNet takes text_embeds and time_ids")
            # diffusers: each time id's sinusoidal embedding, concatenated after the pooled text.
            time_embeds = self.add_time_proj(time_ids.flatten(), temb)
            time_embeds = time_embeds.reshape(text_embeds.shape[0], -1)
            added = torch.cat([text_embeds.type_as(temb), time_embeds], dim=-1)
            temb = temb + self.add_embedding(added)
        x = self.conv_in(sample)
        skips = [x]
        for block in self.down_blocks:
            for i, res in enumerate(block.resnets):
                x = res(x, temb)
                if len(block.attentions) > 0:
                    x = block.attentions[i](x, encoder_hidden_states)
                skips.append(x)
            if hasattr(block, "downsamplers"):
                x = block.downsamplers[0](x)
                skips.append(x)

        if self.config.mid_block:
            mid = self.mid_block
            x = mid.resnets[0](x, temb)
            x = mid.attentions[0](x, encoder_hidden_states)
            x = mid.resnets[1](x, temb)

        for block in self.up_blocks:
            for i, res in enumerate(block.resnets):
                x = res(torch.cat([x, skips.pop()], dim=1), temb)
                if len(block.attentions) > 0:
                    x = block.attentions[i](x, encoder_hidden_states)
            if hasattr(block, "upsamplers"):
                # diffusers passes the skip's size when the latent is not a multiple of the
                # UNet's total downscale; with it, this is the same interpolation in both cases.
                x = block.upsamplers[0](x, skips[-1])
        return self.conv_out(self.conv_norm_out(x, silu=True))
