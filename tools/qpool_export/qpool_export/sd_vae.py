"""A trace-clean AutoencoderKL decoder (post_quant_conv + decoder) with diffusers' parameter names
(Note [Importing through qpool's modules] in sd_unet.py).

forward(latents [B, C, h, w], already divided by the scaling factor (and shifted, where the config
has a shift factor)) -> image [B, 3, h * 2**(levels - 1), w * ...] in about [-1, 1].
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Tuple

import torch
import torch.nn as nn

from .blocks import (ChannelsLastGroupNorm, ResnetBlock2D, Upsample2D, VaeAttention,
                     norm_silu)
from .import_error import ImportFailure


@dataclass(frozen=True)
class SdVaeConfig:
    latent_channels: int
    out_channels: int
    block_out_channels: Tuple[int, ...]  # encoder order, as in config.json
    layers_per_block: int
    norm_num_groups: int
    scaling_factor: float
    shift_factor: float
    force_upcast: bool
    use_post_quant_conv: bool

    @property
    def downscale(self) -> int:
        return 2 ** (len(self.block_out_channels) - 1)

    FIXED = {"act_fn": "silu", "mid_block_add_attention": True, "latents_mean": None,
             "latents_std": None}

    @staticmethod
    def from_diffusers(config: Dict[str, object], where: str) -> "SdVaeConfig":
        for field, want in SdVaeConfig.FIXED.items():
            got = config.get(field, want)
            if got != want:
                raise ImportFailure(f"{where}: field '{field}' is {got!r}; qpool imports "
                                    f"{want!r} only")
        blocks = tuple(config.get("block_out_channels", (64,)))
        up = config.get("up_block_types", ("UpDecoderBlock2D",) * len(blocks))
        if len(up) != len(blocks) or any(t != "UpDecoderBlock2D" for t in up):
            raise ImportFailure(f"{where}: field 'up_block_types' is {list(up)!r}; qpool imports "
                                f"{len(blocks)} UpDecoderBlock2D")
        shift = config.get("shift_factor")
        return SdVaeConfig(
            latent_channels=config.get("latent_channels", 4),
            out_channels=config.get("out_channels", 3), block_out_channels=blocks,
            layers_per_block=config.get("layers_per_block", 1),
            norm_num_groups=config.get("norm_num_groups", 32),
            scaling_factor=float(config.get("scaling_factor", 0.18215)),
            shift_factor=float(shift) if shift is not None else 0.0,
            force_upcast=bool(config.get("force_upcast", True)),
            use_post_quant_conv=bool(config.get("use_post_quant_conv", True)))


class UpDecoderBlock(nn.Module):
    def __init__(self, cin: int, cout: int, layers: int, upsample: bool, groups: int,
                 gemm_shortcuts: bool):
        super().__init__()
        self.resnets = nn.ModuleList(
            ResnetBlock2D(cin if i == 0 else cout, cout, None, groups, 1e-6, ChannelsLastGroupNorm,
                          channels_last=True, gemm_shortcut=gemm_shortcuts)
            for i in range(layers))
        if upsample:
            self.upsamplers = nn.ModuleList([Upsample2D(cout)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for res in self.resnets:
            x = res(x)
        if hasattr(self, "upsamplers"):
            x = self.upsamplers[0](x)
        return x


class MidBlock(nn.Module):
    def __init__(self, channels: int, groups: int):
        super().__init__()
        self.attentions = nn.ModuleList(
            [VaeAttention(channels, groups, 1e-6, ChannelsLastGroupNorm)])
        self.resnets = nn.ModuleList([
            ResnetBlock2D(channels, channels, None, groups, 1e-6, ChannelsLastGroupNorm,
                          channels_last=True)
            for _ in range(2)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.resnets[0](x)
        x = self.attentions[0](x)
        return self.resnets[1](x)


class Decoder(nn.Module):
    def __init__(self, cfg: SdVaeConfig, gemm_shortcuts: bool):
        super().__init__()
        rev = list(reversed(cfg.block_out_channels))
        groups = cfg.norm_num_groups
        self.conv_in = nn.Conv2d(cfg.latent_channels, rev[0], 3, padding=1)
        self.mid_block = MidBlock(rev[0], groups)
        self.up_blocks = nn.ModuleList()
        cin = rev[0]
        for i, cout in enumerate(rev):
            self.up_blocks.append(UpDecoderBlock(cin, cout, cfg.layers_per_block + 1,
                                                 i < len(rev) - 1, groups, gemm_shortcuts))
            cin = cout
        self.conv_norm_out = ChannelsLastGroupNorm(groups, rev[-1], eps=1e-6)
        self.conv_out = nn.Conv2d(rev[-1], cfg.out_channels, 3, padding=1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        x = self.mid_block(self.conv_in(z))
        for block in self.up_blocks:
            x = block(x)
        return self.conv_out(norm_silu(self.conv_norm_out, x))


class SdVaeDecoder(nn.Module):
    """`gemm_shortcuts`: the resnet blocks' 1x1 shortcuts run as GEMMs over the pixels
    (PointwiseConv2d), not as convolutions; the same parameters either way."""

    def __init__(self, cfg: SdVaeConfig, gemm_shortcuts: bool = True):
        super().__init__()
        self.config = cfg
        if cfg.use_post_quant_conv:
            self.post_quant_conv = nn.Conv2d(cfg.latent_channels, cfg.latent_channels, 1)
        self.decoder = Decoder(cfg, gemm_shortcuts)

    def forward(self, latents: torch.Tensor) -> torch.Tensor:
        if hasattr(self, "post_quant_conv"):
            latents = self.post_quant_conv(latents)
        return self.decoder(latents)
