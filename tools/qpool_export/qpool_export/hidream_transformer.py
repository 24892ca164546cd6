"""A trace-clean HiDreamImageTransformer2DModel: diffusers' HiDream-I1 transformer (full, dev and
fast share it) rebuilt from its config with the same parameter names, so a diffusers state dict
loads into it strictly (Note [Importing through qpool's modules] in sd_unet.py).

forward(latents [B, C, H, W], timesteps [B] float32, t5 [B, Lt, caption_channels[0]],
        llama [layers, B, Ll, caption_channels[1]], pooled [B, text_emb_dim],
        image_mask [B, S]) -> [B, C_out, H, W]
The inputs are what HiDreamImagePipeline passes its transformer: the VAE latents, the scheduler's
timestep (not scaled here), T5's last hidden state, the Llama's every-layer hidden states
(llm_encoder.py's output; config.llama_layers picks the one each block reads) and the two CLIPs'
pooled projections side by side, and image_mask (Note [Padded images]). The output is the
transformer's own, which the pipeline negates before the scheduler step.

Note [Padded images]
diffusers pads a non-square latent's (H/p)(W/p) patches with zeros to max_seq tokens (the
patches of max_resolution) before the patch embedding, gives the padding positions (0, 0, 0),
zeroes its keys in every attention (after the q/k norms) and drops it at the end; a square latent
is not padded. Here image_mask [B, S] says which: S >= (H/p)(W/p) tokens, 1 for the patches and 0
for the padding after them; the keys are multiplied by it as diffusers multiplies them (by ones
for a square image: exact). The padding's length comes from the shapes, so one trace serves
square and padded images.

Note [HiDream streams]
Each double-stream block reads the image tokens and a text sequence of T5's tokens, the last
selected Llama layer's and its own Llama layer's, and keeps the first two of them for the next
block; the single-stream blocks run on the image tokens followed by those, each appending its own
Llama layer and dropping it again. Every token has a rotary position: the image's (0, row, col)
of the 2x2 patch grid, the text's all zero (no rotation). The angles are computed in float64 and
the rotation in float32, as diffusers does, so the result does not depend on the export dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from .blocks import fused_linear
from .flux_transformer import _gated, _norm_modulate
from .hidream_experts import MoeSwiGlu, SwiGlu
from .import_error import ImportFailure
from .unet import TimestepEmbedding, TimestepProjection

THETA = 10000.0  # diffusers' HiDreamImageEmbedND theta
TIME_CHANNELS = 256
NORM_EPS = 1e-6  # the blocks' layer norms
QK_NORM_EPS = 1e-5  # the attention's q / k RMS norms


@dataclass(frozen=True)
class HiDreamTransformerConfig:
    patch_size: int
    in_channels: int
    out_channels: int
    num_layers: int
    num_single_layers: int
    attention_head_dim: int
    num_attention_heads: int
    caption_channels: Tuple[int, int]  # (T5's width, the Llama's)
    text_emb_dim: int
    num_routed_experts: int
    num_activated_experts: int
    axes_dims_rope: Tuple[int, ...]
    llama_layers: Tuple[int, ...]

    @property
    def inner_dim(self) -> int:
        return self.num_attention_heads * self.attention_head_dim

    @staticmethod
    def from_diffusers(config: Dict[str, object], where: str) -> "HiDreamTransformerConfig":
        """`config` is the transformer's config.json; `where` names it in errors."""

        def fail(field: str, expected: str) -> ImportFailure:
            return ImportFailure(f"{where}: field '{field}' is {config.get(field)!r}; {expected}")

        def number(field: str, default=None, minimum: int = 1) -> int:
            value = config.get(field, default)
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise fail(field, f"expected an int >= {minimum}")
            return value

        def ints(field: str, default=None) -> Tuple[int, ...]:
            value = config.get(field, default)
            if not isinstance(value, (list, tuple)) or not value or any(
                    isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in value):
                raise fail(field, "expected a list of ints >= 0")
            return tuple(value)

        in_channels = number("in_channels", 64)
        head_dim = number("attention_head_dim", 128)
        layers, single = number("num_layers", 16, 0), number("num_single_layers", 32, 0)
        if layers + single == 0:
            raise fail("num_layers", "a transformer needs at least one block")
        captions = ints("caption_channels")
        if len(captions) != 2 or 0 in captions:
            raise fail("caption_channels", "expected [T5's width, the Llama's width]")
        routed = number("num_routed_experts", 4, 0)
        activated = number("num_activated_experts", 2)
        if routed and activated > routed:
            raise fail("num_activated_experts", f"it must not exceed num_routed_experts ({routed})")
        axes = ints("axes_dims_rope", (32, 32))
        if any(a == 0 or a % 2 for a in axes) or sum(axes) not in (head_dim, head_dim // 2):
            raise fail("axes_dims_rope", f"expected even axes whose sum is attention_head_dim "
                                         f"({head_dim}) or half of it")
        if len(axes) != 3:
            raise fail("axes_dims_rope", "expected three axes (the ids' columns)")
        llama_layers = ints("llama_layers")
        if len(llama_layers) != layers + single:
            raise fail("llama_layers", f"expected one Llama layer per block ({layers + single})")
        if config.get("patch_size") is None:
            raise fail("patch_size", "expected an int >= 1")
        return HiDreamTransformerConfig(
            patch_size=number("patch_size"), in_channels=in_channels,
            out_channels=number("out_channels", in_channels) if config.get("out_channels")
            else in_channels,
            num_layers=layers, num_single_layers=single, attention_head_dim=head_dim,
            num_attention_heads=number("num_attention_heads", 20), caption_channels=captions,
            text_emb_dim=number("text_emb_dim", 2048), num_routed_experts=routed,
            num_activated_experts=activated, axes_dims_rope=axes, llama_layers=llama_layers)


def rotary(ids: torch.Tensor, axes: Sequence[int]) -> Tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, float32 [N, sum(axes) / 2], of N ids [N, 3]: per column i the angles
    id[:, i] * theta^(-2j / axes[i]), in float64 as diffusers' rope() computes them."""
    angles = []
    for i, dim in enumerate(axes):
        # 0, 2, 4, ... from the ids, not torch.arange(device=...), which a trace bakes in.
        scale = (ids.new_ones(dim // 2, dtype=torch.float64).cumsum(0) - 1) * 2 / dim
        omega = 1.0 / (THETA ** scale)
        angles.append(ids[:, i].to(torch.float64)[:, None] * omega[None, :])
    joined = torch.cat(angles, dim=-1)
    return torch.cos(joined).float(), torch.sin(joined).float()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """diffusers' apply_rope of x [B, N, H, 2P] with cos / sin [N, P]: each channel pair (a, b)
    becomes (cos a - sin b, sin a + cos b), in float32, cast back to x's dtype. The float32 copy
    is of a view (apply_rope in flux_transformer.py says why)."""
    pairs = x.unflatten(-1, (-1, 2)).float()  # [B, N, H, P, 2]
    a, b = pairs[..., 0], pairs[..., 1]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.stack([c * a + (-s) * b, s * a + c * b], dim=-1).flatten(-2).type_as(x)


class HiDreamAttention(nn.Module):
    def __init__(self, dim: int, heads: int, head_dim: int, single: bool, rotated: int):
        """`rotated`: the channels of each head that rotate (sum(axes_dims_rope))."""
        super().__init__()
        inner = heads * head_dim
        self.heads = heads
        self.single = single
        self.whole_head = rotated == head_dim  # a config fact, not the trace's
        self.to_q, self.to_k = nn.Linear(dim, inner), nn.Linear(inner, inner)
        self.to_v, self.to_out = nn.Linear(inner, inner), nn.Linear(inner, dim)
        self.q_rms_norm = nn.RMSNorm(inner, QK_NORM_EPS)
        self.k_rms_norm = nn.RMSNorm(inner, QK_NORM_EPS)
        if not single:
            self.to_q_t, self.to_k_t = nn.Linear(dim, inner), nn.Linear(inner, inner)
            self.to_v_t, self.to_out_t = nn.Linear(inner, inner), nn.Linear(inner, dim)
            self.q_rms_norm_t = nn.RMSNorm(inner, QK_NORM_EPS)
            self.k_rms_norm_t = nn.RMSNorm(inner, QK_NORM_EPS)

    def fuse(self) -> bool:
        """Each stream's to_q / to_k / to_v as one linear, to_qkv (and to_qkv_t) (Note [Fused
        projections] in blocks.py; all three read the normed stream); False, changing nothing,
        where they are not plain linears."""
        qkv = fused_linear([self.to_q, self.to_k, self.to_v])
        text = None if self.single else fused_linear([self.to_q_t, self.to_k_t, self.to_v_t])
        if qkv is None or (not self.single and text is None):
            return False
        del self.to_q, self.to_k, self.to_v
        self.to_qkv = qkv
        if not self.single:
            del self.to_q_t, self.to_k_t, self.to_v_t
            self.to_qkv_t = text
        return True

    def _heads(self, t: torch.Tensor) -> torch.Tensor:
        return t.unflatten(-1, (self.heads, -1))  # [B, N, H, head_dim]

    def _qkv(self, x: torch.Tensor, suffix: str, q_norm: nn.RMSNorm,
             k_norm: nn.RMSNorm) -> List[torch.Tensor]:
        """The stream's q, k (RMS-normed over all heads, as diffusers) and v, [B, N, H, D]."""
        fused = "to_qkv" + suffix
        if hasattr(self, fused):
            q, k, v = getattr(self, fused)(x).chunk(3, dim=-1)
        else:
            q, k, v = (getattr(self, name + suffix)(x) for name in ("to_q", "to_k", "to_v"))
        return [self._heads(q_norm(q)), self._heads(k_norm(k)), self._heads(v)]

    def _attend(self, q, k, v, cos, sin) -> torch.Tensor:
        """`cos`, `sin`: float32 [N, pairs], the rotary tables (rotary())."""
        pairs = cos.shape[-1]
        if self.whole_head:  # one qpool::rope each (Note [Rotary embedding op] in rope_op.h)
            cos2 = torch.stack([cos, cos], dim=-1).flatten(-2)[None, :, None, :]
            sin2 = torch.stack([sin, sin], dim=-1).flatten(-2)[None, :, None, :]
            q, k = torch.ops.qpool.rope(q, cos2, sin2), torch.ops.qpool.rope(k, cos2, sin2)
        else:  # the first half of each head rotates, the second does not
            q = torch.cat([rotate(q[..., :2 * pairs], cos, sin), q[..., 2 * pairs:]], dim=-1)
            k = torch.cat([rotate(k[..., :2 * pairs], cos, sin), k[..., 2 * pairs:]], dim=-1)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return y.transpose(1, 2).flatten(2)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                keep: torch.Tensor) -> torch.Tensor:
        """`keep` [B, N]: the keys' factors (Note [Padded images])."""
        q, k, v = self._qkv(x, "", self.q_rms_norm, self.k_rms_norm)
        return self.to_out(self._attend(q, k * keep[:, :, None, None], v, cos, sin))

    def joint(self, x: torch.Tensor, text: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
              keep: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """`keep` [B, image tokens]: the image keys' factors (Note [Padded images])."""
        qi, ki, vi = self._qkv(x, "", self.q_rms_norm, self.k_rms_norm)
        ki = ki * keep[:, :, None, None]
        qt, kt, vt = self._qkv(text, "_t", self.q_rms_norm_t, self.k_rms_norm_t)
        y = self._attend(torch.cat([qi, qt], 1), torch.cat([ki, kt], 1), torch.cat([vi, vt], 1),
                         cos, sin)
        image = x.shape[1]
        return self.to_out(y[:, :image]), self.to_out_t(y[:, image:])


class HiDreamBlockBase(nn.Module):
    def __init__(self, cfg: HiDreamTransformerConfig, chunks: int, single: bool):
        super().__init__()
        dim = cfg.inner_dim
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(dim, chunks * dim))
        self.norm1_i = nn.LayerNorm(dim, eps=NORM_EPS, elementwise_affine=False)
        self.attn1 = HiDreamAttention(dim, cfg.num_attention_heads, cfg.attention_head_dim, single,
                                      sum(cfg.axes_dims_rope))
        self.norm3_i = nn.LayerNorm(dim, eps=NORM_EPS, elementwise_affine=False)
        if cfg.num_routed_experts > 0:
            self.ff_i = MoeSwiGlu(dim, 4 * dim, cfg.num_routed_experts, cfg.num_activated_experts)
        else:
            self.ff_i = SwiGlu(dim, 4 * dim)
        self.chunks = chunks


class HiDreamSingleBlock(HiDreamBlockBase):
    def __init__(self, cfg: HiDreamTransformerConfig):
        super().__init__(cfg, 6, single=True)

    def forward(self, x: torch.Tensor, temb: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                keep: torch.Tensor) -> torch.Tensor:
        shift_a, scale_a, gate_a, shift_f, scale_f, gate_f = self.adaLN_modulation(
            temb).chunk(6, dim=-1)
        x = _gated(x, gate_a, self.attn1(_norm_modulate(self.norm1_i, x, shift_a, scale_a), cos,
                                         sin, keep))
        return _gated(x, gate_f, self.ff_i(_norm_modulate(self.norm3_i, x, shift_f, scale_f)))


class HiDreamDoubleBlock(HiDreamBlockBase):
    def __init__(self, cfg: HiDreamTransformerConfig):
        super().__init__(cfg, 12, single=False)
        dim = cfg.inner_dim
        self.norm1_t = nn.LayerNorm(dim, eps=NORM_EPS, elementwise_affine=False)
        self.norm3_t = nn.LayerNorm(dim, eps=NORM_EPS, elementwise_affine=False)
        self.ff_t = SwiGlu(dim, 4 * dim)

    def forward(self, x: torch.Tensor, text: torch.Tensor, temb: torch.Tensor, cos: torch.Tensor,
                sin: torch.Tensor, keep: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        (shift_a, scale_a, gate_a, shift_f, scale_f, gate_f, shift_at, scale_at, gate_at,
         shift_ft, scale_ft, gate_ft) = self.adaLN_modulation(temb).chunk(12, dim=-1)
        out_i, out_t = self.attn1.joint(_norm_modulate(self.norm1_i, x, shift_a, scale_a),
                                        _norm_modulate(self.norm1_t, text, shift_at, scale_at),
                                        cos, sin, keep)
        x = _gated(x, gate_a, out_i)
        text = _gated(text, gate_at, out_t)
        x = _gated(x, gate_f, self.ff_i(_norm_modulate(self.norm3_i, x, shift_f, scale_f)))
        return x, _gated(text, gate_ft,
                         self.ff_t(_norm_modulate(self.norm3_t, text, shift_ft, scale_ft)))


class BlockHolder(nn.Module):
    """diffusers' HiDreamBlock: a block under the name `block`."""

    def __init__(self, block: nn.Module):
        super().__init__()
        self.block = block


class TextProjection(nn.Module):
    def __init__(self, in_features: int, dim: int):
        super().__init__()
        self.linear = nn.Linear(in_features, dim, bias=False)


class PatchEmbed(nn.Module):
    def __init__(self, in_features: int, dim: int):
        super().__init__()
        self.proj = nn.Linear(in_features, dim)


class TimestepEmbed(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.time_proj = TimestepProjection(TIME_CHANNELS)
        self.timestep_embedder = TimestepEmbedding(TIME_CHANNELS, dim)


class PooledEmbed(nn.Module):
    def __init__(self, in_dim: int, dim: int):
        super().__init__()
        self.pooled_embedder = TimestepEmbedding(in_dim, dim)


class OutEmbed(nn.Module):
    def __init__(self, dim: int, out_features: int):
        super().__init__()
        self.norm_final = nn.LayerNorm(dim, eps=NORM_EPS, elementwise_affine=False)
        self.linear = nn.Linear(dim, out_features)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(dim, 2 * dim))

    def forward(self, x: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        shift, scale = self.adaLN_modulation(temb).chunk(2, dim=1)
        return self.linear(_norm_modulate(self.norm_final, x, shift, scale))


def fuse_projections(module: nn.Module) -> int:
    """Fuses the linears that read one input in every attention and SwiGLU of `module` (the
    transformer, or one of its blocks streamed alone; Note [Fused projections] in blocks.py);
    returns how many were fused (those whose linears are all plain)."""
    return sum(m.fuse() for m in list(module.modules()) if isinstance(m, (HiDreamAttention,
                                                                          SwiGlu)))


class HiDreamTransformer(nn.Module):
    def __init__(self, cfg: HiDreamTransformerConfig):
        super().__init__()
        self.config = cfg
        dim = cfg.inner_dim
        p = cfg.patch_size
        self.t_embedder = TimestepEmbed(dim)
        self.p_embedder = PooledEmbed(cfg.text_emb_dim, dim)
        self.x_embedder = PatchEmbed(cfg.in_channels * p * p, dim)
        self.double_stream_blocks = nn.ModuleList(
            BlockHolder(HiDreamDoubleBlock(cfg)) for _ in range(cfg.num_layers))
        self.single_stream_blocks = nn.ModuleList(
            BlockHolder(HiDreamSingleBlock(cfg)) for _ in range(cfg.num_single_layers))
        self.final_layer = OutEmbed(dim, p * p * cfg.out_channels)
        t5_width, llama_width = cfg.caption_channels
        self.caption_projection = nn.ModuleList(
            [TextProjection(llama_width, dim) for _ in range(cfg.num_layers +
                                                             cfg.num_single_layers)]
            + [TextProjection(t5_width, dim)])

    def forward(self, latents: torch.Tensor, timesteps: torch.Tensor, t5: torch.Tensor,
                llama: torch.Tensor, pooled: torch.Tensor,
                image_mask: torch.Tensor) -> torch.Tensor:
        cfg = self.config
        p = cfg.patch_size
        batch, channels, height, width = latents.shape
        rows, cols = height // p, width // p
        tokens = rows * cols
        padding = image_mask.shape[1] - tokens  # Note [Padded images]
        # Patches: [B, rows * cols, p * p * C], each patch's (row-in-patch, col-in-patch, C).
        x = latents.reshape(batch, channels, rows, p, cols, p).permute(0, 2, 4, 3, 5, 1)
        x = F.pad(x.reshape(batch, tokens, p * p * channels), (0, 0, 0, padding))
        x = self.x_embedder.proj(x)
        temb = self.t_embedder.timestep_embedder(self.t_embedder.time_proj(timesteps, x))
        temb = temb + self.p_embedder.pooled_embedder(pooled)
        texts = [self.caption_projection[i].linear(llama[k])
                 for i, k in enumerate(cfg.llama_layers)]
        t5_text = self.caption_projection[-1].linear(t5)
        # Positions (Note [HiDream streams]): (0, row, col) per patch, zeros per text token.
        # Counted on the latents' device (torch.arange(device=...) would be baked by a trace).
        grid_rows = (latents.new_ones(rows, dtype=torch.long).cumsum(0) - 1)[:, None].expand(
            rows, cols)
        grid_cols = (latents.new_ones(cols, dtype=torch.long).cumsum(0) - 1)[None, :].expand(
            rows, cols)
        image_ids = torch.stack([torch.zeros_like(grid_rows), grid_rows, grid_cols],
                                dim=-1).reshape(tokens, 3)
        text_tokens = t5_text.shape[1] + 2 * texts[0].shape[1]
        ids = torch.cat([image_ids, image_ids.new_zeros(padding + text_tokens, 3)], dim=0)
        cos, sin = rotary(ids, cfg.axes_dims_rope)
        keep = image_mask.type_as(x)
        carried = torch.cat([t5_text, texts[-1]], dim=1)
        kept = carried.shape[1]
        for i, holder in enumerate(self.double_stream_blocks):
            x, text = holder.block(x, torch.cat([carried, texts[i]], dim=1), temb, cos, sin,
                                   keep)
            carried = text[:, :kept]
        x = torch.cat([x, carried], dim=1)
        joint = x.shape[1]
        keep = torch.cat([keep, keep.new_ones(batch, joint - keep.shape[1] + texts[0].shape[1])],
                         dim=1)
        for j, holder in enumerate(self.single_stream_blocks):
            x = torch.cat([x, texts[cfg.num_layers + j]], dim=1)
            x = holder.block(x, temb, cos, sin, keep)[:, :joint]
        out = self.final_layer(x[:, :tokens], temb)
        # Back to the latent grid: [B, C, rows * p, cols * p].
        out = out.reshape(batch, rows, cols, p, p, cfg.out_channels).permute(0, 5, 1, 3, 2, 4)
        return out.reshape(batch, cfg.out_channels, rows * p, cols * p)
