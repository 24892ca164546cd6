"""AutoencoderKL-decoder-like module (the SD 1.x VAE decoder's structure) with random weights.

forward(latents [B, C, h, w], already divided by scaling_factor)
  -> image [B, 3, h * 2**(len(block_out_channels) - 1), w * ...], not clamped (the server clamps).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

import torch
import torch.nn as nn

from .blocks import (ChannelsLastGroupNorm, ResnetBlock2D, Upsample2D, VaeAttention,
                     norm_silu)


@dataclass(frozen=True)
class VaeDecoderConfig:
    latent_channels: int = 4
    out_channels: int = 3
    block_out_channels: Tuple[int, ...] = (128, 256, 512, 512)  # encoder order, as diffusers
    layers_per_block: int = 2
    norm_groups: int = 32
    norm_eps: float = 1e-6

    @property
    def downscale(self) -> int:
        return 2 ** (len(self.block_out_channels) - 1)


class VaeUpBlock(nn.Module):
    def __init__(self, cin: int, cout: int, layers: int, upsample: bool, groups: int, eps: float):
        super().__init__()
        self.resnets = nn.ModuleList(
            ResnetBlock2D(cin if j == 0 else cout, cout, None, groups, eps, ChannelsLastGroupNorm,
                          channels_last=True)
            for j in range(layers))
        self.upsamplers = nn.ModuleList([Upsample2D(cout)] if upsample else [])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for res in self.resnets:
            x = res(x)
        for up in self.upsamplers:
            x = up(x)
        return x


class VaeMidBlock(nn.Module):
    def __init__(self, channels: int, groups: int, eps: float):
        super().__init__()
        self.resnets = nn.ModuleList(
            [ResnetBlock2D(channels, channels, None, groups, eps, ChannelsLastGroupNorm,
                           channels_last=True)
             for _ in range(2)])
        self.attentions = nn.ModuleList(
            [VaeAttention(channels, groups, eps, ChannelsLastGroupNorm)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.resnets[0](x)
        x = self.attentions[0](x)
        return self.resnets[1](x)


class VaeDecoder(nn.Module):
    def __init__(self, cfg: VaeDecoderConfig):
        super().__init__()
        self.config = cfg
        rev = list(reversed(cfg.block_out_channels))
        groups, eps = cfg.norm_groups, cfg.norm_eps
        self.post_quant_conv = nn.Conv2d(cfg.latent_channels, cfg.latent_channels, 1)
        self.conv_in = nn.Conv2d(cfg.latent_channels, rev[0], 3, padding=1)
        self.mid_block = VaeMidBlock(rev[0], groups, eps)
        self.up_blocks = nn.ModuleList()
        cin = rev[0]
        for i, cout in enumerate(rev):
            self.up_blocks.append(VaeUpBlock(cin, cout, cfg.layers_per_block + 1,
                                             i < len(rev) - 1, groups, eps))
            cin = cout
        self.conv_norm_out = ChannelsLastGroupNorm(groups, cin, eps=eps)
        self.conv_out = nn.Conv2d(cin, cfg.out_channels, 3, padding=1)

    def forward(self, latents: torch.Tensor) -> torch.Tensor:
        x = self.conv_in(self.post_quant_conv(latents))
        x = self.mid_block(x)
        for block in self.up_blocks:
            x = block(x)
        return self.conv_out(norm_silu(self.conv_norm_out, x))
