"""UNet2DCondition-like denoiser (the SD 1.x UNet's structure) with random weights.

forward(sample [B, C, h, w], timestep [B] (dtype of sample), encoder_hidden_states [B, L, D])
  -> predicted noise [B, C, h, w].  h and w may be any size (odd sizes included): each upsampler
  resizes to the spatial size of the skip connection it is concatenated with.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from .blocks import ChannelsLastGroupNorm, Downsample2D, ResnetBlock2D, Transformer2D


@dataclass(frozen=True)
class UNetConfig:
    in_channels: int = 4
    out_channels: int = 4
    block_out_channels: Tuple[int, ...] = (320, 640, 1280, 1280)
    down_attention: Tuple[bool, ...] = (True, True, True, False)  # per down block; up mirrors it
    layers_per_block: int = 2
    cross_attention_dim: int = 768
    num_heads: int = 8
    norm_groups: int = 32
    norm_eps: float = 1e-5


class TimestepProjection(nn.Module):
    """Sinusoidal embedding [cos | sin] of the timestep (flip_sin_to_cos, no frequency shift).

    The frequency table is a buffer; the product is computed in the buffer's dtype and the result
    follows the sample's dtype, so the graph bakes neither device nor dtype.
    """

    def __init__(self, dim: int, max_period: float = 10000.0):
        super().__init__()
        half = dim // 2
        exponent = -math.log(max_period) * torch.arange(half, dtype=torch.float32) / half
        self.register_buffer("freqs", torch.exp(exponent))

    def forward(self, timestep: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        args = timestep.type_as(self.freqs)[:, None] * self.freqs[None, :]
        return torch.cat([torch.cos(args), torch.sin(args)], dim=-1).type_as(like)


class TimestepEmbedding(nn.Module):
    def __init__(self, in_dim: int, dim: int):
        super().__init__()
        self.linear_1 = nn.Linear(in_dim, dim)
        self.linear_2 = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(F.silu(self.linear_1(x)))


class UpsampleToSkip(nn.Module):
    """Nearest upsampling to the spatial size of the next skip tensor (one qpool::upsample_nearest
    op), then a 3x3 convolution."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        return self.conv(torch.ops.qpool.upsample_nearest(x, skip))


class UNetBlock(nn.Module):
    """Container of one resolution level: resnets, optional transformers, optional resampler.
    The UNet's forward walks it (so the traced graph needs no tuple plumbing)."""

    def __init__(self):
        super().__init__()
        self.resnets = nn.ModuleList()
        self.attentions = nn.ModuleList()
        self.samplers = nn.ModuleList()


class UNet(nn.Module):
    def __init__(self, cfg: UNetConfig):
        super().__init__()
        if len(cfg.down_attention) != len(cfg.block_out_channels):
            raise ValueError("down_attention needs one entry per block")
        self.config = cfg
        ch0 = cfg.block_out_channels[0]
        temb_dim = ch0 * 4
        groups, eps = cfg.norm_groups, cfg.norm_eps

        def resnet(cin: int, cout: int) -> ResnetBlock2D:
            return ResnetBlock2D(cin, cout, temb_dim, groups, eps, ChannelsLastGroupNorm,
                                 channels_last=True)

        def transformer(c: int) -> Transformer2D:
            return Transformer2D(c, cfg.cross_attention_dim, cfg.num_heads, groups)

        self.time_proj = TimestepProjection(ch0)
        self.time_embedding = TimestepEmbedding(ch0, temb_dim)
        self.conv_in = nn.Conv2d(cfg.in_channels, ch0, 3, padding=1)

        skip_channels: List[int] = [ch0]
        self.down_blocks = nn.ModuleList()
        cin = ch0
        n = len(cfg.block_out_channels)
        for i, (cout, attn) in enumerate(zip(cfg.block_out_channels, cfg.down_attention)):
            block = UNetBlock()
            for _ in range(cfg.layers_per_block):
                block.resnets.append(resnet(cin, cout))
                if attn:
                    block.attentions.append(transformer(cout))
                skip_channels.append(cout)
                cin = cout
            if i < n - 1:
                block.samplers.append(Downsample2D(cout))
                skip_channels.append(cout)
            self.down_blocks.append(block)

        self.mid_block = UNetBlock()
        self.mid_block.resnets.extend([resnet(cin, cin), resnet(cin, cin)])
        self.mid_block.attentions.append(transformer(cin))

        self.up_blocks = nn.ModuleList()
        for i, (cout, attn) in enumerate(zip(reversed(cfg.block_out_channels),
                                             reversed(cfg.down_attention))):
            block = UNetBlock()
            for _ in range(cfg.layers_per_block + 1):
                block.resnets.append(resnet(cin + skip_channels.pop(), cout))
                if attn:
                    block.attentions.append(transformer(cout))
                cin = cout
            if i < n - 1:
                block.samplers.append(UpsampleToSkip(cout))
            self.up_blocks.append(block)
        assert not skip_channels

        self.conv_norm_out = ChannelsLastGroupNorm(groups, ch0, eps=eps)
        self.conv_out = nn.Conv2d(ch0, cfg.out_channels, 3, padding=1)

    def forward(self, sample: torch.Tensor, timestep: torch.Tensor,
                encoder_hidden_states: torch.Tensor) -> torch.Tensor:
        temb = self.time_embedding(self.time_proj(timestep, sample))
        x = self.conv_in(sample)
        skips = [x]
        for block in self.down_blocks:
            for i, res in enumerate(block.resnets):
                x = res(x, temb)
                if len(block.attentions) > 0:
                    x = block.attentions[i](x, encoder_hidden_states)
                skips.append(x)
            for down in block.samplers:
                x = down(x)
                skips.append(x)

        mid = self.mid_block
        x = mid.resnets[0](x, temb)
        x = mid.attentions[0](x, encoder_hidden_states)
        x = mid.resnets[1](x, temb)

        for block in self.up_blocks:
            for i, res in enumerate(block.resnets):
                x = res(torch.cat([x, skips.pop()], dim=1), temb)
                if len(block.attentions) > 0:
                    x = block.attentions[i](x, encoder_hidden_states)
            for up in block.samplers:
                x = up(x, skips[-1])
        return self.conv_out(self.conv_norm_out(x, silu=True))
