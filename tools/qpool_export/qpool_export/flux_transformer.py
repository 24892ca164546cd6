"""A trace-clean FluxTransformer2DModel: diffusers' FLUX.1 transformer (FLUX.1-dev, FLUX.1-schnell
and configs of the same shape) rebuilt from its config with the same parameter names, so a
diffusers state dict loads into it strictly (Note [Importing through qpool's modules] in
sd_unet.py).

forward(hidden_states [B, S, in_channels], encoder_hidden_states [B, L, joint_attention_dim],
        pooled_projections [B, pooled_projection_dim], timestep [B] float32,
        img_ids [S, 3] float32, txt_ids [L, 3] float32, guidance [B] float32)
  -> [B, S, out_channels]
The inputs are what diffusers' FluxPipeline passes its transformer: the packed latents (2x2
patches of the VAE latent, S = (h / 2) * (w / 2)), T5's last hidden state, CLIP's pooled
text_embeds, timestep = t / 1000 (the sigma, in [0, 1]), the position ids (txt_ids zeros; img_ids
(0, row, col) of the packed latent grid) and guidance = the guidance scale. Like diffusers, the
module multiplies timestep and guidance by 1000 itself. hidden_states, encoder_hidden_states and
pooled_projections are in the weights' dtype; timestep, guidance and the ids are float32 whatever
that dtype. Without guidance_embeds (FLUX.1-schnell) guidance is accepted and ignored (Note [The
unused guidance input]). B, S and L are read from the tensors at run time.

Note [Float32 tables]
The sinusoidal timestep embedding and the rotary position embedding are computed from float32
buffers named `freqs` (time_text_embed.time_proj.freqs, pos_embed.axes.N.freqs), which the export
keeps float32 whatever its dtype (quant.FLOAT32_BUFFERS) and the importer fills from the module
itself (diffusers computes them in forward). The timestep embedding follows diffusers step by
step: the timestep is cast to the activations' dtype and multiplied by 1000 there (as diffusers and
Black Forest Labs' reference do; in bfloat16 that rounds it), then the sinusoids are computed in
float32 and cast to the activations' dtype. The rotary cos / sin stay float32 and the rotation of
q and k is computed in float32 and cast back, as diffusers' apply_rotary_emb (use_real,
unbind_dim -1) does. diffusers computes the rotary angles in float64 on CPU and CUDA; here they
are float32 products of the ids and float32 frequencies (computed in float64, then rounded), which
is within a few float32 ulps of the angle for FLUX's positions.

Note [The unused guidance input]
The C++ server calls every FLUX transformer with the seven inputs. torch.jit.trace keeps each
example input as an input of the traced forward whether the graph reads it or not, so a
transformer without guidance_embeds keeps `guidance` in its schema at no cost: no operation reads
it (tests/python/test_flux_modules.py checks the saved module's schema).

Note [Single-stream blocks on one joint sequence]
diffusers' single-stream block concatenates the text and image tokens on entry and splits them on
exit, in every one of the 38 blocks. The concatenation and the split are exact, so this module
concatenates once after the double-stream blocks, runs the single-stream blocks on the joint
sequence and takes the image tokens once at the end: the same numbers without 76 copies.

Note [Fused modulation]
The adaptive layer norms' norm and modulation norm(x) * (1 + scale) + shift are one
qpool::ada_norm (Note [Modulated norm op] in server/quant/ada_norm_op.h; its reference is a
LayerNorm and a torch.addcmul) and the gated residuals x + gate * y single torch.addcmul kernels
here (diffusers runs a multiply and an add), and silu(temb), which every block's modulation
reads, is computed once. In float32 the results are those of diffusers up to rounding; in half
precision addcmul rounds once instead of twice.

Note [Fused projections] (blocks.py) applies to the transformer: each attention's q / k / v, the
text stream's add_q / add_k / add_v, and a single-stream block's q / k / v together with proj_mlp
(3 x 3072 + 12288 outputs for FLUX.1) run as one linear each.

Half precision: diffusers clips float16 activations to +-65504 after each block; that depends on
the dtype, which is chosen after the trace, so it is not reproduced (FLUX runs in bfloat16).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import ops
from .blocks import fused_linear
from .import_error import ImportFailure
from .unet import TimestepEmbedding, TimestepProjection

THETA = 10000.0  # diffusers' FluxPosEmbed theta
TIME_CHANNELS = 256  # width of the sinusoidal timestep / guidance embedding
NORM_EPS = 1e-6  # the blocks' layer norms and q / k RMS norms
MLP_RATIO = 4


def _int_field(config: Dict[str, object], field: str, default: Optional[int], where: str,
               minimum: int = 1) -> int:
    value = config.get(field, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ImportFailure(f"{where}: field '{field}' is {value!r}; expected an int >= "
                            f"{minimum}")
    return value


@dataclass(frozen=True)
class FluxTransformerConfig:
    in_channels: int
    out_channels: int
    num_layers: int  # double-stream blocks (transformer_blocks)
    num_single_layers: int  # single-stream blocks (single_transformer_blocks)
    attention_head_dim: int
    num_attention_heads: int
    joint_attention_dim: int
    pooled_projection_dim: int
    guidance_embeds: bool
    axes_dims_rope: Tuple[int, ...]

    # FluxTransformer2DModel's config fields and their defaults; patch_size is reproduced at 1
    # only (FluxPipeline packs 2x2 latent patches itself and passes patch_size 1 configs).
    DEFAULTS = {
        "patch_size": 1, "in_channels": 64, "out_channels": None, "num_layers": 19,
        "num_single_layers": 38, "attention_head_dim": 128, "num_attention_heads": 24,
        "joint_attention_dim": 4096, "pooled_projection_dim": 768, "guidance_embeds": False,
        "axes_dims_rope": (16, 56, 56),
    }

    @property
    def inner_dim(self) -> int:
        return self.num_attention_heads * self.attention_head_dim

    @staticmethod
    def from_diffusers(config: Dict[str, object], where: str) -> "FluxTransformerConfig":
        """`config` is the transformer's config.json as a dict; `where` names that file in
        errors. Fields starting with '_' (diffusers' bookkeeping) are ignored; any other field
        this module does not reproduce is refused, naming it."""
        d = FluxTransformerConfig.DEFAULTS
        for field in config:
            if not field.startswith("_") and field not in d:
                raise ImportFailure(f"{where}: field '{field}' is not one of "
                                    f"FluxTransformer2DModel's that qpool reproduces")
        patch = config.get("patch_size", 1)
        if patch != 1 or isinstance(patch, bool):
            raise ImportFailure(f"{where}: field 'patch_size' is {patch!r}; qpool imports 1 only")
        ints = {f: _int_field(config, f, d[f], where)
                for f in ("in_channels", "attention_head_dim", "num_attention_heads",
                          "joint_attention_dim", "pooled_projection_dim")}
        for f in ("num_layers", "num_single_layers"):
            ints[f] = _int_field(config, f, d[f], where, minimum=0)
        out = config.get("out_channels")
        out = ints["in_channels"] if out is None else _int_field(config, "out_channels", None,
                                                                 where)
        guidance = config.get("guidance_embeds", False)
        if not isinstance(guidance, bool):
            raise ImportFailure(f"{where}: field 'guidance_embeds' is {guidance!r}; expected "
                                f"true or false")
        axes = config.get("axes_dims_rope", d["axes_dims_rope"])
        head = ints["attention_head_dim"]
        if (not isinstance(axes, (list, tuple)) or len(axes) != 3
                or any(isinstance(a, bool) or not isinstance(a, int) or a <= 0 or a % 2
                       for a in axes)
                or sum(axes) != head):
            raise ImportFailure(f"{where}: field 'axes_dims_rope' is {axes!r}; qpool imports 3 "
                                f"positive even ints (one per id column) summing to "
                                f"attention_head_dim {head}")
        return FluxTransformerConfig(out_channels=out, guidance_embeds=guidance,
                                     axes_dims_rope=tuple(axes), **ints)


class RopeAxis(nn.Module):
    """One id column's rotary frequencies theta^(-2i/dim), each repeated twice (the pairs of
    channels it rotates), float32 [dim] (Note [Float32 tables])."""

    def __init__(self, dim: int, theta: float = THETA):
        super().__init__()
        freqs = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
        self.register_buffer("freqs", freqs.repeat_interleave(2).to(torch.float32))


class FluxPosEmbed(nn.Module):
    """cos and sin, float32 [N, head_dim], of the rotary angles of N ids [N, 3]: per column i the
    angles id[:, i] * freqs_i, interleaved per pair as diffusers' get_1d_rotary_pos_embed
    (repeat_interleave_real) gives them, the columns' blocks side by side."""

    def __init__(self, axes_dims: Sequence[int]):
        super().__init__()
        self.axes = nn.ModuleList(RopeAxis(d) for d in axes_dims)

    def forward(self, ids: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        pos = ids.type_as(self.axes[0].freqs)
        angles = torch.cat([pos[:, i:i + 1] * axis.freqs[None, :]
                            for i, axis in enumerate(self.axes)], dim=-1)
        return torch.cos(angles), torch.sin(angles)


# qpool::rope's schema, byte-identical to kRopeSchema in server/quant/rope_op.h (a unit test
# compares them).
ROPE_SCHEMA = "rope(Tensor x, Tensor cos, Tensor sin) -> Tensor"


def _rope_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """diffusers' apply_rotary_emb (use_real, unbind_dim -1) of x [B, N, H, D] with cos / sin
    [1, N, 1, D]: each channel pair (a, b) becomes (a cos - b sin, b cos + a sin), in float32,
    cast back to x's dtype: qpool::rope's reference (the server's CPU kernel is the same ATen
    operations, its CUDA kernel the same float32 arithmetic in one pass).

    The float32 copy is taken of a view, never of x itself: in a float32 trace x.float() returns
    x, and the tracer then records every later use of x as that conversion's output, so the final
    cast to x's dtype would become a cast to float32 in a bfloat16 export."""
    pairs = x.unflatten(-1, (-1, 2)).float()  # [B, N, H, D / 2, 2]
    real, imag = pairs.unbind(-1)
    rotated = torch.stack([-imag, real], dim=-1).flatten(3)
    return (pairs.flatten(3) * cos + rotated * sin).to(x.dtype)


_LIB = ops.register(ROPE_SCHEMA, _rope_ref, lambda x, cos, sin: torch.empty_like(x))


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The rotary embedding of q or k as one qpool::rope call in the traced graph (Note [Rotary
    embedding op] in server/quant/rope_op.h): the server runs it as one CUDA kernel."""
    return torch.ops.qpool.rope(x, cos, sin)


# qpool::rms_rope's schema, byte-identical to kRmsRopeSchema in server/quant/rope_op.h (a unit
# test compares them).
RMS_ROPE_SCHEMA = \
    "rms_rope(Tensor[] xs, Tensor[] weights, float eps, Tensor cos, Tensor sin) -> Tensor"


def _rms_rope_ref(xs: List[torch.Tensor], weights: List[torch.Tensor], eps: float,
                  cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Each part [B, N_i, H, D] RMS-normed per head with its weight (torch.nn.RMSNorm's
    operation), the parts joined along the tokens, then rotated: qpool::rms_rope's reference, the
    same ATen operations as the server's CPU kernel (Note [Normed rotary embedding op])."""
    normed = [F.rms_norm(x, (x.shape[-1],), w, eps) for x, w in zip(xs, weights)]
    return _rope_ref(normed[0] if len(normed) == 1 else torch.cat(normed, dim=1), cos, sin)


def _rms_rope_fake(xs: List[torch.Tensor], weights: List[torch.Tensor], eps: float,
                   cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return xs[0].new_empty((xs[0].shape[0], cos.shape[1], xs[0].shape[2], xs[0].shape[3]))


_RMS_LIB = ops.register(RMS_ROPE_SCHEMA, _rms_rope_ref, _rms_rope_fake)

# qpool::cat_gelu's schema, byte-identical to kCatGeluSchema in server/quant/cat_gelu_op.h (a unit
# test compares them).
CAT_GELU_SCHEMA = "cat_gelu(Tensor a, Tensor b) -> Tensor"


def _cat_gelu_ref(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a, then the tanh-approximated GELU of b, joined along the last dimension: qpool::cat_gelu's
    reference, the server's CPU kernel's operations (Note [Joined GELU op] in
    server/quant/cat_gelu_op.h)."""
    return torch.cat([a, F.gelu(b, approximate="tanh")], dim=-1)


def _cat_gelu_fake(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a.new_empty((*a.shape[:-1], a.shape[-1] + b.shape[-1]))


_CAT_GELU_LIB = ops.register(CAT_GELU_SCHEMA, _cat_gelu_ref, _cat_gelu_fake)


# qpool::ada_norm's schema, byte-identical to kAdaNormSchema in server/quant/ada_norm_op.h (a unit
# test compares them).
ADA_NORM_SCHEMA = "ada_norm(Tensor x, Tensor shift, Tensor scale, float eps) -> Tensor"


def _ada_norm_ref(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor,
                  eps: float) -> torch.Tensor:
    """LayerNorm of x [B, N, D] without affine parameters, times 1 + scale, plus shift (scale and
    shift [B, D] broadcast over the tokens): qpool::ada_norm's reference, the server's CPU
    kernel's operations (Note [Modulated norm op] in server/quant/ada_norm_op.h)."""
    normed = F.layer_norm(x, (x.shape[-1],), eps=eps)
    return torch.addcmul(shift[:, None], normed, 1 + scale[:, None])


_ADA_NORM_LIB = ops.register(ADA_NORM_SCHEMA, _ada_norm_ref,
                             lambda x, shift, scale, eps: torch.empty_like(x))


def _norm_modulate(norm: nn.LayerNorm, x: torch.Tensor, shift: torch.Tensor,
                   scale: torch.Tensor) -> torch.Tensor:
    """norm(x) * (1 + scale) + shift, one qpool::ada_norm (Note [Modulated norm op])."""
    return torch.ops.qpool.ada_norm(x, shift, scale, norm.eps)


def _gated(x: torch.Tensor, gate: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """x + gate * y, gate [B, D] broadcast over the tokens."""
    return torch.addcmul(x, gate[:, None], y)


class AdaNorm(nn.Module):
    """diffusers' AdaLayerNormZero (`chunks` 6), AdaLayerNormZeroSingle (3) and
    AdaLayerNormContinuous (2): a linear of silu(temb) giving `chunks` modulation vectors, and a
    LayerNorm without affine parameters. The caller passes silu(temb) and applies them."""

    def __init__(self, dim: int, chunks: int):
        super().__init__()
        self.chunks = chunks
        self.linear = nn.Linear(dim, chunks * dim)
        self.norm = nn.LayerNorm(dim, elementwise_affine=False, eps=NORM_EPS)

    def forward(self, temb_act: torch.Tensor) -> List[torch.Tensor]:
        return list(self.linear(temb_act).chunk(self.chunks, dim=1))


class GeluProjection(nn.Module):
    """diffusers' GELU activation module: a linear, then tanh-approximated GELU."""

    def __init__(self, dim: int, inner: int):
        super().__init__()
        self.proj = nn.Linear(dim, inner)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.proj(x), approximate="tanh")


class FeedForward(nn.Module):
    """diffusers' FeedForward with activation_fn 'gelu-approximate': net.0 (linear + GELU),
    net.1 (dropout, nothing at inference), net.2 (linear)."""

    def __init__(self, dim: int):
        super().__init__()
        self.net = nn.ModuleList([GeluProjection(dim, dim * MLP_RATIO), nn.Identity(),
                                  nn.Linear(dim * MLP_RATIO, dim)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net[2](self.net[0](x))


class FluxAttention(nn.Module):
    """diffusers' FluxAttention with FluxAttnProcessor: q / k / v projections with RMS-normed q
    and k per head; with `context` the text stream's add_*_proj and RMS norms, attention over
    [text, image] and separate output projections (double-stream blocks); without it, one stream
    and no output projection (single-stream blocks, pre_only). The q / k norms are
    torch.nn.RMSNorm with eps 1e-6, as in diffusers: aten::rms_norm computes in float32 and casts
    back to the activations' dtype."""

    def __init__(self, dim: int, heads: int, head_dim: int, context: bool):
        super().__init__()
        inner = heads * head_dim
        self.heads = heads
        self.norm_q = nn.RMSNorm(head_dim, eps=NORM_EPS)
        self.norm_k = nn.RMSNorm(head_dim, eps=NORM_EPS)
        self.to_q = nn.Linear(dim, inner)
        self.to_k = nn.Linear(dim, inner)
        self.to_v = nn.Linear(dim, inner)
        if context:
            self.to_out = nn.ModuleList([nn.Linear(inner, dim)])
            self.norm_added_q = nn.RMSNorm(head_dim, eps=NORM_EPS)
            self.norm_added_k = nn.RMSNorm(head_dim, eps=NORM_EPS)
            self.add_q_proj = nn.Linear(dim, inner)
            self.add_k_proj = nn.Linear(dim, inner)
            self.add_v_proj = nn.Linear(dim, inner)
            self.to_add_out = nn.Linear(inner, dim)

    def fuse(self) -> bool:
        """to_q / to_k / to_v as one to_qkv, add_*_proj as one add_qkv (Note [Fused
        projections]); False, changing nothing, where they are not plain linears."""
        context = hasattr(self, "add_q_proj")
        qkv = fused_linear([self.to_q, self.to_k, self.to_v])
        add = fused_linear([self.add_q_proj, self.add_k_proj, self.add_v_proj]) if context \
            else None
        if qkv is None or (context and add is None):
            return False
        del self.to_q, self.to_k, self.to_v
        self.to_qkv = qkv
        if context:
            del self.add_q_proj, self.add_k_proj, self.add_v_proj
            self.add_qkv = add
        return True

    def _heads(self, t: torch.Tensor) -> torch.Tensor:
        return t.unflatten(-1, (self.heads, -1))  # [B, N, H * D] -> [B, N, H, D]

    def _project(self, x: torch.Tensor, fused: str,
                 parts: Tuple[str, str, str]) -> Tuple[torch.Tensor, ...]:
        """q, k, v of x through the fused linear `fused` where there is one, else `parts`."""
        if hasattr(self, fused):
            return getattr(self, fused)(x).chunk(3, dim=-1)
        return tuple(getattr(self, name)(x) for name in parts)

    def _norm_rope(self, streams: List[Tuple[torch.Tensor, nn.RMSNorm]], cos: torch.Tensor,
                   sin: torch.Tensor) -> torch.Tensor:
        """q (or k) of each stream [B, N_i, H * D] with the stream's RMS norm -> [B, N, H, D]:
        normed per head, joined along the tokens and rotated, one qpool::rms_rope (Note [Normed
        rotary embedding op] in server/quant/rope_op.h)."""
        return torch.ops.qpool.rms_rope([self._heads(t) for t, _ in streams],
                                        [norm.weight for _, norm in streams], NORM_EPS, cos, sin)

    def attend(self, q: List[Tuple[torch.Tensor, nn.RMSNorm]],
               k: List[Tuple[torch.Tensor, nn.RMSNorm]], v: torch.Tensor, cos: torch.Tensor,
               sin: torch.Tensor) -> torch.Tensor:
        """q and k of each stream with its norm, v of all streams joined [B, N, H * D] ->
        [B, N, H * D]."""
        y = F.scaled_dot_product_attention(self._norm_rope(q, cos, sin).transpose(1, 2),
                                           self._norm_rope(k, cos, sin).transpose(1, 2),
                                           self._heads(v).transpose(1, 2))
        return y.transpose(1, 2).flatten(2)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Single stream: x [B, N, dim] -> [B, N, inner] (no output projection)."""
        q, k, v = self._project(x, "to_qkv", ("to_q", "to_k", "to_v"))
        return self.attend([(q, self.norm_q)], [(k, self.norm_k)], v, cos, sin)

    def joint(self, x: torch.Tensor, context: torch.Tensor, cos: torch.Tensor,
              sin: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Double stream: image x [B, S, dim] and text context [B, L, dim] attend together
        (text first, as the rotary tables are laid out); returns (image, text) outputs."""
        q, k, v = self._project(x, "to_qkv", ("to_q", "to_k", "to_v"))
        cq, ck, cv = self._project(context, "add_qkv", ("add_q_proj", "add_k_proj", "add_v_proj"))
        y = self.attend([(cq, self.norm_added_q), (q, self.norm_q)],
                        [(ck, self.norm_added_k), (k, self.norm_k)], torch.cat([cv, v], dim=1),
                        cos, sin)
        text = context.shape[1]
        return self.to_out[0](y[:, text:]), self.to_add_out(y[:, :text])


class FluxTransformerBlock(nn.Module):
    """diffusers' FluxTransformerBlock (double stream): image and text tokens keep their own
    weights and attend jointly."""

    def __init__(self, dim: int, heads: int, head_dim: int):
        super().__init__()
        self.norm1 = AdaNorm(dim, 6)
        self.norm1_context = AdaNorm(dim, 6)
        self.attn = FluxAttention(dim, heads, head_dim, context=True)
        self.norm2 = nn.LayerNorm(dim, elementwise_affine=False, eps=NORM_EPS)
        self.ff = FeedForward(dim)
        self.norm2_context = nn.LayerNorm(dim, elementwise_affine=False, eps=NORM_EPS)
        self.ff_context = FeedForward(dim)

    def fuse(self) -> bool:
        """The attention's projections fused (Note [Fused projections])."""
        return self.attn.fuse()

    def forward(self, x: torch.Tensor, context: torch.Tensor, temb_act: torch.Tensor,
                cos: torch.Tensor, sin: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        shift, scale, gate, shift_mlp, scale_mlp, gate_mlp = self.norm1(temb_act)
        c_shift, c_scale, c_gate, c_shift_mlp, c_scale_mlp, c_gate_mlp = \
            self.norm1_context(temb_act)
        attn, context_attn = self.attn.joint(_norm_modulate(self.norm1.norm, x, shift, scale),
                                             _norm_modulate(self.norm1_context.norm, context,
                                                       c_shift, c_scale), cos, sin)
        x = _gated(x, gate, attn)
        x = _gated(x, gate_mlp, self.ff(_norm_modulate(self.norm2, x, shift_mlp, scale_mlp)))
        context = _gated(context, c_gate, context_attn)
        ff = self.ff_context(_norm_modulate(self.norm2_context, context, c_shift_mlp,
                                            c_scale_mlp))
        return x, _gated(context, c_gate_mlp, ff)


class FluxSingleTransformerBlock(nn.Module):
    """diffusers' FluxSingleTransformerBlock on the joint [text, image] sequence (Note
    [Single-stream blocks on one joint sequence]): attention and MLP in parallel from one
    modulated norm, one output projection of both."""

    def __init__(self, dim: int, heads: int, head_dim: int):
        super().__init__()
        self.norm = AdaNorm(dim, 3)
        self.proj_mlp = nn.Linear(dim, dim * MLP_RATIO)
        self.proj_out = nn.Linear(dim + dim * MLP_RATIO, dim)
        self.attn = FluxAttention(dim, heads, head_dim, context=False)

    def fuse(self) -> bool:
        """The attention's q / k / v and proj_mlp as one to_qkv_mlp (Note [Fused
        projections]); False, changing nothing, where they are not plain linears."""
        a = self.attn
        fused = fused_linear([a.to_q, a.to_k, a.to_v, self.proj_mlp])
        if fused is None:
            return False
        self.fused_widths = [a.to_q.out_features, a.to_k.out_features, a.to_v.out_features,
                             self.proj_mlp.out_features]
        del a.to_q, a.to_k, a.to_v, self.proj_mlp
        self.to_qkv_mlp = fused
        return True

    def forward(self, h: torch.Tensor, temb_act: torch.Tensor, cos: torch.Tensor,
                sin: torch.Tensor) -> torch.Tensor:
        shift, scale, gate = self.norm(temb_act)
        n = _norm_modulate(self.norm.norm, h, shift, scale)
        if hasattr(self, "to_qkv_mlp"):
            q, k, v, mlp = self.to_qkv_mlp(n).split(self.fused_widths, dim=-1)
            attn = self.attn.attend([(q, self.attn.norm_q)], [(k, self.attn.norm_k)], v, cos, sin)
        else:
            mlp, attn = self.proj_mlp(n), self.attn(n, cos, sin)
        # Note [Joined GELU op]: one pass joins them.
        out = self.proj_out(torch.ops.qpool.cat_gelu(attn, mlp))
        return _gated(h, gate, out)


class TimeTextEmbed(nn.Module):
    """diffusers' CombinedTimestepGuidanceTextProjEmbeddings (with guidance) or
    CombinedTimestepTextProjEmbeddings: sinusoidal embeddings of 1000 * timestep (and of 1000 *
    guidance) through their MLPs, plus the pooled text through text_embedder (Note [Float32
    tables])."""

    def __init__(self, dim: int, pooled_dim: int, guidance: bool):
        super().__init__()
        self.guidance = guidance
        self.time_proj = TimestepProjection(TIME_CHANNELS)
        self.timestep_embedder = TimestepEmbedding(TIME_CHANNELS, dim)
        if guidance:
            self.guidance_embedder = TimestepEmbedding(TIME_CHANNELS, dim)
        # PixArtAlphaTextProjection with silu: linear_1, silu, linear_2, as TimestepEmbedding.
        self.text_embedder = TimestepEmbedding(pooled_dim, dim)

    def _embed(self, value: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        # diffusers: value.to(hidden_states.dtype) * 1000, then the sinusoids in float32.
        scaled = torch.ops.aten.mul.Scalar(value.type_as(like), 1000)
        return self.time_proj(scaled, like)

    def forward(self, timestep: torch.Tensor, guidance: torch.Tensor, pooled: torch.Tensor,
                like: torch.Tensor) -> torch.Tensor:
        temb = self.timestep_embedder(self._embed(timestep, like))
        if self.guidance:
            temb = temb + self.guidance_embedder(self._embed(guidance, like))
        return temb + self.text_embedder(pooled)


class FluxTransformer(nn.Module):
    def __init__(self, cfg: FluxTransformerConfig):
        super().__init__()
        self.config = cfg
        dim, heads, head_dim = cfg.inner_dim, cfg.num_attention_heads, cfg.attention_head_dim
        self.pos_embed = FluxPosEmbed(cfg.axes_dims_rope)
        self.time_text_embed = TimeTextEmbed(dim, cfg.pooled_projection_dim, cfg.guidance_embeds)
        self.context_embedder = nn.Linear(cfg.joint_attention_dim, dim)
        self.x_embedder = nn.Linear(cfg.in_channels, dim)
        self.transformer_blocks = nn.ModuleList(
            FluxTransformerBlock(dim, heads, head_dim) for _ in range(cfg.num_layers))
        self.single_transformer_blocks = nn.ModuleList(
            FluxSingleTransformerBlock(dim, heads, head_dim)
            for _ in range(cfg.num_single_layers))
        self.norm_out = AdaNorm(dim, 2)
        self.proj_out = nn.Linear(dim, cfg.out_channels)

    def fuse_projections(self) -> int:
        """Fuses the projections that read one input in every block (Note [Fused
        projections]); returns how many blocks were fused (those whose linears are all plain)."""
        return sum(block.fuse() for block in list(self.transformer_blocks) +
                   list(self.single_transformer_blocks))

    def forward(self, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor,
                pooled_projections: torch.Tensor, timestep: torch.Tensor, img_ids: torch.Tensor,
                txt_ids: torch.Tensor, guidance: torch.Tensor) -> torch.Tensor:
        x = self.x_embedder(hidden_states)
        temb = self.time_text_embed(timestep, guidance, pooled_projections, x)
        temb_act = F.silu(temb)  # every modulation reads silu(temb) (Note [Fused modulation])
        context = self.context_embedder(encoder_hidden_states)
        cos, sin = self.pos_embed(torch.cat([txt_ids, img_ids], dim=0))
        cos, sin = cos[None, :, None, :], sin[None, :, None, :]
        for block in self.transformer_blocks:
            x, context = block(x, context, temb_act, cos, sin)
        h = torch.cat([context, x], dim=1)
        for single in self.single_transformer_blocks:
            h = single(h, temb_act, cos, sin)
        x = h[:, encoder_hidden_states.shape[1]:]
        scale, shift = self.norm_out(temb_act)  # AdaLayerNormContinuous: scale first
        return self.proj_out(_norm_modulate(self.norm_out.norm, x, shift, scale))


def image_ids(rows: int, cols: int) -> torch.Tensor:
    """The img_ids FluxPipeline builds for a packed latent of rows x cols tokens: (0, row, col)
    per token in row-major order, float32 [rows * cols, 3]."""
    r = torch.arange(rows, dtype=torch.float32)[:, None].expand(rows, cols)
    c = torch.arange(cols, dtype=torch.float32)[None, :].expand(rows, cols)
    return torch.stack([torch.zeros_like(r), r, c], dim=-1).reshape(rows * cols, 3)


def text_ids(length: int) -> torch.Tensor:
    """FluxPipeline's txt_ids: zeros [length, 3]."""
    return torch.zeros(length, 3)

