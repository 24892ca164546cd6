"""Pipeline presets: model sizes, tokenizer training budget and manifest defaults/limits."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Dict, Optional

import torch.nn as nn

from .text_encoder import TextEncoder, TextEncoderConfig
from .unet import UNet, UNetConfig
from .vae import VaeDecoder, VaeDecoderConfig

COMPONENTS = ("text_encoder", "unet", "vae_decoder")  # execution order, as in the manifest

# Linear layers that --quantize keeps in full precision unless --skip says otherwise. SD 1.x
# needs none; these are the names a user might want to list (name substrings, as in the manifest).
DEFAULT_QUANT_SKIP: Dict[str, tuple] = {"text_encoder": (), "unet": (), "vae_decoder": ()}
SKIPPABLE_LINEAR_NAMES = {
    "text_encoder": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                     "self_attn.out_proj", "mlp.fc1", "mlp.fc2"),
    "unet": ("time_embedding", "time_emb_proj", "attn1", "attn2", "ff.net"),
    "vae_decoder": ("mid_block.attentions",),
}


@dataclass(frozen=True)
class Preset:
    name: str
    text_encoder: TextEncoderConfig
    unet: UNetConfig
    vae_decoder: VaeDecoderConfig
    num_merges: int  # BPE merges to train (the corpus may yield fewer)
    vocab_size: Optional[int]  # text encoder embedding rows; None = the tokenizer's vocab size
    defaults: Dict[str, object] = field(default_factory=dict)
    limits: Dict[str, int] = field(default_factory=dict)
    trace_latent: int = 8  # latent side of the tracing example (tiny: 64x64 image)

    def with_vocab(self, tokenizer_vocab_size: int) -> "Preset":
        """This preset with the text encoder's embedding sized for the trained tokenizer."""
        rows = self.vocab_size or tokenizer_vocab_size
        if rows < tokenizer_vocab_size:
            raise ValueError(f"embedding rows {rows} < tokenizer vocab {tokenizer_vocab_size}")
        return replace(self, text_encoder=replace(self.text_encoder, vocab_size=rows))

    def build(self, component: str) -> nn.Module:
        """A freshly initialised module (uses the global torch RNG and default device)."""
        if component == "text_encoder":
            return TextEncoder(self.text_encoder)
        if component == "unet":
            return UNet(self.unet)
        if component == "vae_decoder":
            return VaeDecoder(self.vae_decoder)
        raise ValueError(f"unknown component '{component}'")


TINY = Preset(
    name="tiny",
    text_encoder=TextEncoderConfig(vocab_size=0, hidden_size=32, num_layers=2, num_heads=2,
                                   intermediate_size=128),
    unet=UNetConfig(block_out_channels=(32, 64), down_attention=(True, True), layers_per_block=1,
                    cross_attention_dim=32, num_heads=2, norm_groups=8),
    vae_decoder=VaeDecoderConfig(block_out_channels=(32, 32, 64, 64), layers_per_block=1,
                                 norm_groups=8),
    num_merges=1000,
    vocab_size=None,
    defaults={"steps": 4, "guidance_scale": 7.5, "width": 64, "height": 64, "scheduler": "ddim"},
    limits={"max_steps": 50, "max_width": 256, "max_height": 256, "max_images": 4,
            "max_prompts": 16},
    trace_latent=8,
)

SD15 = Preset(
    name="sd15",
    text_encoder=TextEncoderConfig(),
    unet=UNetConfig(),
    vae_decoder=VaeDecoderConfig(),
    num_merges=49408 - 514,  # CLIP's budget; the built-in corpus runs out long before
    vocab_size=49408,
    defaults={"steps": 20, "guidance_scale": 7.5, "width": 512, "height": 512,
              "scheduler": "ddim"},
    limits={"max_steps": 150, "max_width": 1024, "max_height": 1024, "max_images": 4,
            "max_prompts": 16},
    trace_latent=8,
)

PRESETS: Dict[str, Preset] = {p.name: p for p in (TINY, SD15)}


def count_parameters(preset: Preset, component: str, vocab_size: int = 49408) -> int:
    """Parameter count of a component, built on the meta device (no memory, no init cost)."""
    import torch

    p = preset.with_vocab(vocab_size)
    with torch.device("meta"):
        module = p.build(component)
    return sum(t.numel() for t in module.parameters())
