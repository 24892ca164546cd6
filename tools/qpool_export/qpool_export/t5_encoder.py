"""A trace-clean T5 encoder with transformers' parameter names (T5EncoderModel: shared,
encoder.embed_tokens tied to it, encoder.block.N.layer.{0,1}, encoder.final_layer_norm), as
FluxPipeline runs its text_encoder_2 (Note [Importing through qpool's modules] in sd_unet.py).

forward(input_ids int64 [B, L]) -> last_hidden_state [B, L, d_model]
No attention mask: FluxPipeline pads the prompt to max_sequence_length and passes none, so every
token, padding included, attends to every other. Built `masked` (HiDreamImagePipeline's
text_encoder_3), forward(input_ids, attention_mask int64 [B, L]): keys where the mask is 0 get
a score of -inf, where transformers adds the dtype's minimum to the position bias: the same
softmax, since every prompt keeps its </s> (padding rows are still computed; no query sees a
padding key). L may be anything up to the `max_length` the
module was built for (the relative position table's size, Note [Relative position buckets]).

Accepted feed-forwards: "gated-gelu" (T5 v1.1 / T5-XXL: gelu_new(wi_0 x) * wi_1 x, then wo) and
"relu" (original T5: relu(wi x), then wo). gelu_new is the tanh approximation of GELU, computed
here by F.gelu(approximate="tanh"): the same function in one kernel (in half precision it rounds
once where transformers' formula rounds at each of its steps).

Note [Relative position buckets]
T5 adds to the attention scores a learned bias per head and relative-position bucket (block 0's
relative_attention_bias, shared by every layer), and does not scale q.k by 1/sqrt(d_kv). The
bucket of each (query, key) pair depends only on the positions, so it is computed once at
construction with transformers' formula (bidirectional: half the buckets per direction, exact
buckets for small distances, logarithmic ones up to relative_attention_max_distance) into the
int64 buffer encoder.relative_position_buckets [max_length, max_length], which forward slices to
[:L, :L]. The importer fills that buffer from the module itself (it is no checkpoint tensor) and
compares it with transformers' own bucket function over the whole table.

Half precision: transformers clamps float16 activations to the float16 range after each layer and
keeps `wo` in float32 when it loads T5 in float16; both depend on the dtype, which is chosen after
the trace, so neither is reproduced (export T5 in bfloat16 or float32, as FLUX runs it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from .import_error import ImportFailure

# feed_forward_proj -> the dense_act_fn transformers derives from it.
FEED_FORWARDS = {"gated-gelu": "gelu_new", "relu": "relu"}
BUCKETS = "relative_position_buckets"  # the computed buffer's leaf name


@dataclass(frozen=True)
class T5EncoderConfig:
    vocab_size: int
    d_model: int
    d_kv: int
    d_ff: int
    num_layers: int
    num_heads: int
    relative_attention_num_buckets: int
    relative_attention_max_distance: int
    layer_norm_epsilon: float
    feed_forward_proj: str  # gated-gelu | relu

    @property
    def gated(self) -> bool:
        return self.feed_forward_proj == "gated-gelu"

    @staticmethod
    def from_transformers(config: Dict[str, object], where: str) -> "T5EncoderConfig":
        """`config` is text_encoder_2's config (T5Config.to_dict()); `where` names its file in
        errors."""
        ff = config.get("feed_forward_proj", "relu")
        if ff not in FEED_FORWARDS:
            raise ImportFailure(f"{where}: field 'feed_forward_proj' is {ff!r}; qpool imports "
                                f"{' or '.join(repr(f) for f in FEED_FORWARDS)}")
        act = config.get("dense_act_fn", FEED_FORWARDS[ff])
        if act != FEED_FORWARDS[ff]:
            raise ImportFailure(f"{where}: field 'dense_act_fn' is {act!r}; qpool imports "
                                f"{FEED_FORWARDS[ff]!r} with feed_forward_proj {ff!r}")
        gated = config.get("is_gated_act", ff == "gated-gelu")
        if gated != (ff == "gated-gelu"):
            raise ImportFailure(f"{where}: field 'is_gated_act' is {gated!r}; feed_forward_proj "
                                f"{ff!r} implies {ff == 'gated-gelu'}")
        if config.get("is_decoder", False) is not False:
            raise ImportFailure(f"{where}: field 'is_decoder' is {config.get('is_decoder')!r}; "
                                f"qpool imports T5 encoders (false)")

        def number(field: str, default=None, minimum: int = 1) -> int:
            value = config.get(field, default)
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ImportFailure(f"{where}: field '{field}' is {value!r}; expected an int >= "
                                    f"{minimum}")
            return value

        eps = config.get("layer_norm_epsilon", 1e-6)
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
            raise ImportFailure(f"{where}: field 'layer_norm_epsilon' is {eps!r}; expected a "
                                f"positive number")
        # Bidirectional buckets: half per direction, of which half exact (max_exact >= 1).
        buckets = number("relative_attention_num_buckets", 32, minimum=4)
        distance = number("relative_attention_max_distance", 128)
        if distance <= buckets // 4:
            raise ImportFailure(f"{where}: field 'relative_attention_max_distance' is {distance}; "
                                f"it must exceed the {buckets // 4} exact buckets per direction")
        return T5EncoderConfig(
            vocab_size=number("vocab_size"), d_model=number("d_model"), d_kv=number("d_kv"),
            d_ff=number("d_ff"), num_layers=number("num_layers"),
            num_heads=number("num_heads"), relative_attention_num_buckets=buckets,
            relative_attention_max_distance=distance, layer_norm_epsilon=float(eps),
            feed_forward_proj=ff)


def relative_position_buckets(length: int, num_buckets: int, max_distance: int) -> torch.Tensor:
    """int64 [length, length]: the bidirectional bucket of key position j relative to query
    position i, with transformers' operations (so the float32 logarithm rounds the same way)."""
    positions = torch.arange(length, dtype=torch.long)
    relative = positions[None, :] - positions[:, None]
    half = num_buckets // 2
    buckets = (relative > 0).to(torch.long) * half
    distance = relative.abs()
    max_exact = half // 2
    large = max_exact + (torch.log(distance.float() / max_exact)
                         / math.log(max_distance / max_exact)
                         * (half - max_exact)).to(torch.long)
    large = torch.min(large, torch.full_like(large, half - 1))
    return buckets + torch.where(distance < max_exact, distance, large)


class T5LayerNorm(nn.Module):
    """RMS norm without bias: the mean square in float32, the normalized value cast to the
    weight's dtype, then scaled (transformers' T5LayerNorm). F.rms_norm without a weight is that
    normalization, computed in float32 and cast to the input's dtype (the weight's: a component
    has one dtype), in one kernel. (x.float() would also alias x in a float32 trace, turning the
    caller's residual into float32 in a half-precision export; see apply_rope in
    flux_transformer.py.)"""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.dim = dim
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * F.rms_norm(x, (self.dim,), None, self.eps)


class T5Attention(nn.Module):
    def __init__(self, cfg: T5EncoderConfig, has_bias: bool):
        super().__init__()
        inner = cfg.num_heads * cfg.d_kv
        self.heads = cfg.num_heads
        self.q = nn.Linear(cfg.d_model, inner, bias=False)
        self.k = nn.Linear(cfg.d_model, inner, bias=False)
        self.v = nn.Linear(cfg.d_model, inner, bias=False)
        self.o = nn.Linear(inner, cfg.d_model, bias=False)
        if has_bias:
            self.relative_attention_bias = nn.Embedding(cfg.relative_attention_num_buckets,
                                                        cfg.num_heads)

    def position_bias(self, buckets: torch.Tensor) -> torch.Tensor:
        """[1, H, L, L] in the weight's dtype from the buckets [L, L]; indexing the transposed
        table gives the heads-first layout directly, contiguous as attention kernels want it."""
        return self.relative_attention_bias.weight.t()[:, buckets][None]

    def _heads(self, t: torch.Tensor) -> torch.Tensor:
        return t.unflatten(-1, (self.heads, -1)).transpose(1, 2)  # [B, H, L, d_kv]

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        y = F.scaled_dot_product_attention(self._heads(self.q(x)), self._heads(self.k(x)),
                                           self._heads(self.v(x)), attn_mask=bias, scale=1.0)
        return self.o(y.transpose(1, 2).flatten(2))


class T5LayerSelfAttention(nn.Module):
    def __init__(self, cfg: T5EncoderConfig, has_bias: bool):
        super().__init__()
        self.SelfAttention = T5Attention(cfg, has_bias)
        self.layer_norm = T5LayerNorm(cfg.d_model, cfg.layer_norm_epsilon)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return x + self.SelfAttention(self.layer_norm(x), bias)


class T5DenseGatedGelu(nn.Module):
    """T5DenseGatedActDense with gelu_new."""

    def __init__(self, cfg: T5EncoderConfig):
        super().__init__()
        self.wi_0 = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.wi_1 = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.wo = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.wo(F.gelu(self.wi_0(x), approximate="tanh") * self.wi_1(x))


class T5DenseRelu(nn.Module):
    """T5DenseActDense with relu."""

    def __init__(self, cfg: T5EncoderConfig):
        super().__init__()
        self.wi = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.wo = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.wo(F.relu(self.wi(x)))


class T5LayerFF(nn.Module):
    def __init__(self, cfg: T5EncoderConfig):
        super().__init__()
        self.DenseReluDense = T5DenseGatedGelu(cfg) if cfg.gated else T5DenseRelu(cfg)
        self.layer_norm = T5LayerNorm(cfg.d_model, cfg.layer_norm_epsilon)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.DenseReluDense(self.layer_norm(x))


class T5Block(nn.Module):
    def __init__(self, cfg: T5EncoderConfig, has_bias: bool):
        super().__init__()
        self.layer = nn.ModuleList([T5LayerSelfAttention(cfg, has_bias), T5LayerFF(cfg)])

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return self.layer[1](self.layer[0](x, bias))


class T5Stack(nn.Module):
    def __init__(self, cfg: T5EncoderConfig, max_length: int):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.block = nn.ModuleList(T5Block(cfg, i == 0) for i in range(cfg.num_layers))
        self.final_layer_norm = T5LayerNorm(cfg.d_model, cfg.layer_norm_epsilon)
        self.register_buffer(BUCKETS, relative_position_buckets(
            max_length, cfg.relative_attention_num_buckets, cfg.relative_attention_max_distance))

    def forward(self, input_ids: torch.Tensor,
                attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        length = input_ids.shape[1]
        buckets = self.relative_position_buckets[:length, :length]
        bias = self.block[0].layer[0].SelfAttention.position_bias(buckets)
        if attention_mask is not None:  # [1, H, L, L] -> [B, H, L, L]
            keep = attention_mask[:, None, None, :] != 0
            # -inf, not the dtype's minimum: the graph is traced in float32 and runs in
            # bfloat16, where float32's minimum overflows.
            bias = bias.masked_fill(~keep, float("-inf"))
        for block in self.block:
            x = block(x, bias)
        return self.final_layer_norm(x)


class T5Encoder(nn.Module):
    def __init__(self, cfg: T5EncoderConfig, max_length: int):
        super().__init__()
        if max_length < 1:
            raise ImportFailure(f"T5 max_length {max_length} must be positive")
        self.config = cfg
        self.max_length = max_length
        self.shared = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.encoder = T5Stack(cfg, max_length)
        self.encoder.embed_tokens.weight = self.shared.weight  # tied, as in T5EncoderModel

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.encoder(input_ids)


class MaskedT5Encoder(T5Encoder):
    """T5Encoder whose forward takes the attention mask (module docstring)."""

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.encoder(input_ids, attention_mask)
