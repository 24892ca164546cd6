"""A trace-clean decoder-only LLM text encoder with transformers' parameter names (LlamaModel:
embed_tokens, layers.N.{self_attn.{q,k,v,o}_proj, mlp.{gate,up,down}_proj, input_layernorm,
post_attention_layernorm}, norm), as diffusion pipelines run their LLM text encoders
(HiDreamImagePipeline's text_encoder_4: Llama-3.1-8B), Note [Importing through qpool's modules] in
sd_unet.py.

forward(input_ids int64 [B, L], attention_mask int64 [B, L]) -> hidden states [layers, B, L, D]
Every layer's output, as HiDreamImagePipeline stacks transformers' hidden_states[1:]: the outputs
of layers 0 .. n-2, then the last layer's output after the final norm (transformers puts the
normed one in place of the last layer's own). The attention is causal and masked by
attention_mask (1: a token, 0: padding), which pipelines pad on the right: padding attends to the
tokens before it, no token attends to padding. L may be anything up to the `max_length` the module
was built for (the size of its rotary tables).

Note [LLM encoder family]
Llama, Qwen2/2.5 and Qwen3 decoders differ in a few switches, which LlmEncoderConfig carries so
that their blocks are one module: bias terms on the q/k/v projections (Qwen2) and on o (Llama's
attention_bias sets all four), an RMS norm of each head's q and k before the rotation (Qwen3),
the rotary frequencies (Llama 3's "llama3" scaling, or none) and grouped-query attention (k and v
heads shared by groups of q heads, repeated to the q heads before the product). This module
builds what a Llama config describes; the Qwen configs' readers come with their kinds.

Note [Rotary tables]
The rotary embedding's cos and sin depend on the positions only, so they are computed once, at
construction, in float32 with transformers' operations (inverse frequencies, Llama 3's scaling of
the long wavelengths, positions times frequencies, each half repeated) into the buffers
rotary_cos and rotary_sin [max_length, head_dim], which forward slices to [:L]. transformers casts
them to the activations' dtype before use; a component's buffers are cast to its dtype, so the
same rounding happens once at export. The importer compares them with transformers' own rotary
module over the whole table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from .import_error import ImportFailure
from .t5_encoder import T5LayerNorm as RmsNorm  # the same norm: mean square in float32, no bias


@dataclass(frozen=True)
class RopeScaling:
    """Llama 3's scaling of the rotary frequencies ("rope_type": "llama3")."""
    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True)
class LlmEncoderConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: Optional[RopeScaling]
    qkv_bias: bool = False  # Note [LLM encoder family]
    o_bias: bool = False
    qk_norm: bool = False

    @staticmethod
    def from_llama(config: Dict[str, object], where: str) -> "LlmEncoderConfig":
        """`config` is a LlamaConfig's to_dict() (transformers 4's rope_scaling and rope_theta or
        5's rope_parameters); `where` names its file in errors."""

        def fail(field: str, value: object, expected: str) -> ImportFailure:
            return ImportFailure(f"{where}: field '{field}' is {value!r}; {expected}")

        def number(field: str, default=None, minimum: int = 1) -> int:
            value = config.get(field, default)
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise fail(field, value, f"expected an int >= {minimum}")
            return value

        def positive(field: str, value: object) -> float:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise fail(field, value, "expected a positive number")
            return float(value)

        act = config.get("hidden_act", "silu")
        if act != "silu":
            raise fail("hidden_act", act, "qpool imports 'silu' (SwiGLU)")
        if config.get("mlp_bias", False) is not False:
            raise fail("mlp_bias", config.get("mlp_bias"), "qpool imports Llama MLPs without bias")
        bias = config.get("attention_bias", False)
        if not isinstance(bias, bool):
            raise fail("attention_bias", bias, "expected true or false")
        if config.get("pretraining_tp", 1) not in (1, None):
            raise fail("pretraining_tp", config.get("pretraining_tp"), "expected 1")
        hidden = number("hidden_size")
        heads = number("num_attention_heads")
        kv_heads = number("num_key_value_heads", heads)
        if heads % kv_heads:
            raise fail("num_key_value_heads", kv_heads,
                       f"it must divide num_attention_heads ({heads})")
        head_dim = config.get("head_dim") or None
        if head_dim is None:
            if hidden % heads:
                raise fail("hidden_size", hidden, f"it must be a multiple of the {heads} heads")
            head_dim = hidden // heads
        head_dim = number("head_dim", head_dim)
        if head_dim % 2:
            raise fail("head_dim", head_dim, "the rotary embedding needs an even head_dim")
        rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
        if not isinstance(rope, dict):
            raise fail("rope_parameters", rope, "expected an object")
        theta = positive("rope_theta", rope.get("rope_theta", config.get("rope_theta", 10000.0)))
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        scaling = None
        if rope_type == "llama3":
            scaling = RopeScaling(
                factor=positive("rope_parameters.factor", rope.get("factor")),
                low_freq_factor=positive("rope_parameters.low_freq_factor",
                                         rope.get("low_freq_factor")),
                high_freq_factor=positive("rope_parameters.high_freq_factor",
                                          rope.get("high_freq_factor")),
                original_max_position_embeddings=int(positive(
                    "rope_parameters.original_max_position_embeddings",
                    rope.get("original_max_position_embeddings"))))
            if not scaling.high_freq_factor > scaling.low_freq_factor:
                raise fail("rope_parameters.high_freq_factor", scaling.high_freq_factor,
                           f"it must exceed low_freq_factor ({scaling.low_freq_factor})")
        elif rope_type != "default":
            raise fail("rope_parameters.rope_type", rope_type,
                       "qpool imports 'default' and 'llama3'")
        return LlmEncoderConfig(
            vocab_size=number("vocab_size"), hidden_size=hidden,
            intermediate_size=number("intermediate_size"),
            num_layers=number("num_hidden_layers"), num_heads=heads, num_kv_heads=kv_heads,
            head_dim=head_dim, rms_norm_eps=positive("rms_norm_eps",
                                                     config.get("rms_norm_eps", 1e-6)),
            rope_theta=theta, rope_scaling=scaling, qkv_bias=bias, o_bias=bias)


def rotary_inverse_frequencies(cfg: LlmEncoderConfig) -> torch.Tensor:
    """float32 [head_dim / 2], with transformers' operations (Note [Rotary tables])."""
    exponents = torch.arange(0, cfg.head_dim, 2, dtype=torch.int64).float() / cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** exponents)
    s = cfg.rope_scaling
    if s is None:
        return inv_freq
    low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
    high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
    smooth = ((s.original_max_position_embeddings / wavelen - s.low_freq_factor)
              / (s.high_freq_factor - s.low_freq_factor))
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def rotary_tables(cfg: LlmEncoderConfig, length: int):
    """(cos, sin), each float32 [length, head_dim]."""
    inv_freq = rotary_inverse_frequencies(cfg)
    positions = torch.arange(length, dtype=torch.float32)
    freqs = positions[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class LlmAttention(nn.Module):
    def __init__(self, cfg: LlmEncoderConfig):
        super().__init__()
        self.heads = cfg.num_heads
        self.groups = cfg.num_heads // cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim,
                                bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim,
                                bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=cfg.o_bias)
        if cfg.qk_norm:
            self.q_norm = RmsNorm(cfg.head_dim, cfg.rms_norm_eps)
            self.k_norm = RmsNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.qk_norm = cfg.qk_norm

    def _heads(self, t: torch.Tensor) -> torch.Tensor:
        return t.unflatten(-1, (-1, self.head_dim))  # [B, L, heads, head_dim]

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                allowed: torch.Tensor) -> torch.Tensor:
        q, k, v = self._heads(self.q_proj(x)), self._heads(self.k_proj(x)), self._heads(
            self.v_proj(x))
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, heads, L, d]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if self.groups > 1:  # grouped-query attention: each k/v head serves `groups` q heads
            k = k.repeat_interleave(self.groups, dim=1)
            v = v.repeat_interleave(self.groups, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
        return self.o_proj(y.transpose(1, 2).flatten(2))


class LlmMlp(nn.Module):
    """SwiGLU: down(silu(gate x) * up x)."""

    def __init__(self, cfg: LlmEncoderConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlmDecoderLayer(nn.Module):
    def __init__(self, cfg: LlmEncoderConfig):
        super().__init__()
        self.self_attn = LlmAttention(cfg)
        self.mlp = LlmMlp(cfg)
        self.input_layernorm = RmsNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RmsNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                allowed: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, allowed)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlmEncoder(nn.Module):
    ROTARY = ("rotary_cos", "rotary_sin")  # the computed buffers (Note [Rotary tables])

    def __init__(self, cfg: LlmEncoderConfig, max_length: int):
        super().__init__()
        if max_length < 1:
            raise ImportFailure(f"LLM encoder max_length {max_length} must be positive")
        self.config = cfg
        self.max_length = max_length
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(LlmDecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RmsNorm(cfg.hidden_size, cfg.rms_norm_eps)
        cos, sin = rotary_tables(cfg, max_length)
        self.register_buffer("rotary_cos", cos)
        self.register_buffer("rotary_sin", sin)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        length = input_ids.shape[1]
        x = self.embed_tokens(input_ids)
        cos = self.rotary_cos[:length]
        sin = self.rotary_sin[:length]
        # Causal, and no query attends to padding: [B, 1, L, L], True where it may attend.
        # From the ids, not torch.arange(device=...): a trace bakes a device argument in.
        positions = torch.ones_like(input_ids[0]).cumsum(0)
        causal = positions[None, :] <= positions[:, None]
        allowed = causal[None, None] & (attention_mask[:, None, None, :] != 0)
        states = []
        for layer in self.layers:
            x = layer(x, cos, sin, allowed)
            states.append(x)
        states[-1] = self.norm(x)
        return torch.stack(states, dim=0)
