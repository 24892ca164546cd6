"""The tensor layouts of single-file checkpoints, mapped to the names diffusers and transformers
give the same tensors: the original Stable Diffusion layout (CompVis' LDM, which AUTOMATIC1111,
ComfyUI and civitai files keep: model.diffusion_model.*, first_stage_model.*, cond_stage_model.*
or conditioner.embedders.N.*), OpenCLIP's text tower, and Black Forest Labs' FLUX layout
(double_blocks.N.*, single_blocks.N.*). Each mapping reads a file's tensor names alone; a
component's tensors then come through MappedTensors, which the streaming import reads as it reads
a diffusers folder (Note [Streaming import] in stream_import.py).

Note [Single-file layouts]
A layout is a rule from the file's names to diffusers' names, and some tensors are cut or
reshaped on the way: the fused qkv projections of OpenCLIP and FLUX become three (FLUX's single
blocks four: q, k, v and the MLP's input), the VAE's 1x1 attention convolutions become linear
weights, OpenCLIP's text projection is transposed and FLUX's final modulation has its two halves
swapped (the original is shift then scale, diffusers' scale then shift). Every tensor of a
component's part of the file must be mapped or be one the kind never reads (the VAE's encoder,
the text encoders' position ids, OpenCLIP's layers past the penultimate where the config drops
them): a name no rule knows refuses the import, naming the first ones, rather than dropping
weights. The per-tensor scales of ComfyUI's "scaled fp8" files multiply their weight as it is
read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from .import_error import ImportFailure

# How many unmapped names a refusal lists.
SHOWN = 5


@dataclass(frozen=True)
class Piece:
    """One of diffusers' tensors as read from the file's tensor `key`: rows [start, start + rows)
    of it when rows is set, transposed, its two halves along dim 0 swapped, or reshaped."""
    key: str
    start: int = 0
    rows: Optional[int] = None
    transpose: bool = False
    swap: bool = False
    shape: Optional[Tuple[int, ...]] = None


class MappedTensors:
    """SourceTensors' interface (stream_import.py) over one component's part of a single file:
    its tensors under diffusers' names, each read from the file's own (Note [Single-file
    layouts]); `scales` names the scale of each weight stored as scaled fp8."""

    def __init__(self, reader, pieces: Dict[str, Piece], scales: Dict[str, str]):
        self.where = reader.path
        self._reader = reader
        self._pieces = pieces
        self._scales = scales

    def keys(self) -> List[str]:
        return list(self._pieces)

    def __contains__(self, key: str) -> bool:
        return key in self._pieces

    def file_of(self, key: str) -> str:
        return self._reader.path

    def shape(self, key: str) -> Tuple[int, ...]:
        piece = self._pieces[key]
        shape = tuple(self._reader.shape(piece.key))
        if piece.rows is not None:
            shape = (piece.rows,) + shape[1:]
        if piece.transpose:
            shape = shape[::-1]
        return piece.shape or shape

    def read(self, key: str) -> torch.Tensor:
        piece = self._pieces[key]
        t = source = self._reader.read(piece.key)
        if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            t = t.to(torch.float32)  # ComfyUI's fp8 files; cut and scaled in float32
        if piece.key in self._scales:
            scale = self._reader.read(self._scales[piece.key]).to(torch.float32)
            t = t.to(torch.float32) * scale.reshape(scale.shape + (1,) * (t.dim() - scale.dim()))
        if piece.rows is not None:
            t = t[piece.start:piece.start + piece.rows]
        if piece.transpose:
            t = t.t()
        if piece.swap:
            a, b = t.chunk(2, dim=0)
            t = torch.cat([b, a], dim=0)
        if piece.shape is not None:
            t = t.reshape(piece.shape)
        t = t.contiguous()
        if t.untyped_storage().data_ptr() == source.untyped_storage().data_ptr():
            t = t.clone()  # still the file's memory (itself or a view of it): a copy of its own
        return t


# A rule: the file's name (its component prefix removed) -> diffusers' names and pieces; [] for a
# tensor the kind never reads; None for a name the rule does not know.
Rule = Callable[[str], Optional[List[Tuple[str, Piece]]]]


def mapped(reader, prefix: str, rule: Rule, scales: Dict[str, str], what: str
           ) -> MappedTensors:
    """The tensors of `reader` under `prefix` through `rule`; ImportFailure naming the file and
    the first names no rule maps (Note [Single-file layouts])."""
    pieces: Dict[str, Piece] = {}
    unmapped: List[str] = []
    for key in reader.keys():
        if not key.startswith(prefix) or key in scales.values():
            continue
        out = rule(key[len(prefix):])
        if out is None:
            unmapped.append(key)
            continue
        for name, piece in out:
            pieces[name] = Piece(prefix + piece.key, piece.start, piece.rows, piece.transpose,
                                 piece.swap, piece.shape)
    if unmapped:
        raise ImportFailure(f"{reader.path}: {len(unmapped)} tensor(s) of the {what} that qpool "
                            f"cannot map, the first: {', '.join(unmapped[:SHOWN])}")
    return MappedTensors(reader, pieces, scales)


def _same(key: str) -> List[Tuple[str, Piece]]:
    return [(key, Piece(key))]


def _renamed(key: str, pairs: Sequence[Tuple[str, str]]) -> Optional[str]:
    """`key` with the first matching (old, new) prefix renamed, or None."""
    for old, new in pairs:
        if key.startswith(old):
            return new + key[len(old):]
    return None


# LDM's ResBlock -> diffusers' ResnetBlock2D.
_RESNET = (("in_layers.0.", "norm1."), ("in_layers.2.", "conv1."), ("emb_layers.1.",
           "time_emb_proj."), ("out_layers.0.", "norm2."), ("out_layers.3.", "conv2."),
           ("skip_connection.", "conv_shortcut."))
_UNET_TOP = (("time_embed.0.", "time_embedding.linear_1."),
             ("time_embed.2.", "time_embedding.linear_2."),
             ("label_emb.0.0.", "add_embedding.linear_1."),
             ("label_emb.0.2.", "add_embedding.linear_2."),
             ("input_blocks.0.0.", "conv_in."), ("out.0.", "conv_norm_out."),
             ("out.2.", "conv_out."))


def unet_rule(layers_per_block: int) -> Rule:
    """LDM's UNetModel (model.diffusion_model.*) -> UNet2DConditionModel, for SD 1.x, 2.x and
    SDXL: input block n is down block (n - 1) // (L + 1), its resnet (and attention) (n - 1) %
    (L + 1), or its downsampler at L; output block n is up block n // (L + 1), resnet n % (L +
    1), with the upsampler after the attention."""
    step = layers_per_block + 1

    def resnet(at: str, rest: str) -> Optional[List[Tuple[str, Piece]]]:
        renamed = _renamed(rest, _RESNET)
        return None if renamed is None else [(at + renamed, Piece(rest))]

    def rule(key: str) -> Optional[List[Tuple[str, Piece]]]:
        top = _renamed(key, _UNET_TOP)
        if top is not None:
            return [(top, Piece(key))]
        m = re.fullmatch(r"middle_block\.([012])\.(.+)", key)
        if m:
            part, rest = int(m.group(1)), m.group(2)
            if part == 1:
                return [("mid_block.attentions.0." + rest, Piece(key))]
            out = resnet(f"mid_block.resnets.{part // 2}.", rest)
            return None if out is None else [(name, Piece(key)) for name, _ in out]
        m = re.fullmatch(r"(input_blocks|output_blocks)\.(\d+)\.(\d+)\.(.+)", key)
        if m is None:
            return None
        where, n, part, rest = m.group(1), int(m.group(2)), int(m.group(3)), m.group(4)
        here = f"{where}.{n}.{part}."
        if where == "input_blocks":
            block, j = (n - 1) // step, (n - 1) % step
            if j == layers_per_block:
                ok = part == 0 and rest.startswith("op.")
                return [(f"down_blocks.{block}.downsamplers.0.conv.{rest[3:]}",
                         Piece(here + rest))] if ok else None
            if part == 1:
                return [(f"down_blocks.{block}.attentions.{j}.{rest}", Piece(here + rest))]
            out = resnet(f"down_blocks.{block}.resnets.{j}.", rest) if part == 0 else None
        else:
            block, j = n // step, n % step
            if part > 0 and rest.startswith("conv."):  # the upsampler, after any attention
                return [(f"up_blocks.{block}.upsamplers.0.conv.{rest[5:]}", Piece(here + rest))]
            if part == 1:
                return [(f"up_blocks.{block}.attentions.{j}.{rest}", Piece(here + rest))]
            out = resnet(f"up_blocks.{block}.resnets.{j}.", rest) if part == 0 else None
        return None if out is None else [(name, Piece(here + p.key)) for name, p in out]

    return rule


_VAE_RESNET = (("norm1.", "norm1."), ("conv1.", "conv1."), ("norm2.", "norm2."),
               ("conv2.", "conv2."), ("nin_shortcut.", "conv_shortcut."))
_VAE_ATTENTION = (("norm.", "group_norm."), ("q.", "to_q."), ("k.", "to_k."), ("v.", "to_v."),
                  ("proj_out.", "to_out.0."))


def vae_rule(levels: int, shapes: Callable[[str], Tuple[int, ...]]) -> Rule:
    """LDM's AutoencoderKL (first_stage_model.*, or a VAE file of its own) -> diffusers'
    AutoencoderKL, decoder and post_quant_conv only (the encoder is never read): LDM numbers the
    decoder's levels from the lowest resolution up, diffusers from the first it runs, and keeps
    the mid attention's projections as 1x1 convolutions. A VAE file already in diffusers' names
    maps to itself."""

    def rule(key: str) -> Optional[List[Tuple[str, Piece]]]:
        if key.startswith(("encoder.", "quant_conv.")):
            return []
        if key.startswith(("decoder.up_blocks.", "decoder.mid_block.")) or \
                key.startswith(("decoder.conv_in.", "decoder.conv_out.", "decoder.conv_norm_out.",
                                "post_quant_conv.")):
            return _same(key)
        if key.startswith("decoder.norm_out."):
            return [("decoder.conv_norm_out." + key[len("decoder.norm_out."):], Piece(key))]
        m = re.fullmatch(r"decoder\.mid\.block_([12])\.(.+)", key)
        if m:
            renamed = _renamed(m.group(2), _VAE_RESNET)
            return None if renamed is None else [
                (f"decoder.mid_block.resnets.{int(m.group(1)) - 1}.{renamed}", Piece(key))]
        m = re.fullmatch(r"decoder\.mid\.attn_1\.(.+)", key)
        if m:
            renamed = _renamed(m.group(1), _VAE_ATTENTION)
            if renamed is None:
                return None
            shape = shapes(key)
            flat = shape[:2] if len(shape) == 4 and shape[2:] == (1, 1) else None
            return [(f"decoder.mid_block.attentions.0.{renamed}", Piece(key, shape=flat))]
        m = re.fullmatch(r"decoder\.up\.(\d+)\.(block\.(\d+)|upsample)\.(.+)", key)
        if m:
            level = levels - 1 - int(m.group(1))
            if m.group(3) is None:
                return [(f"decoder.up_blocks.{level}.upsamplers.0.{m.group(4)}", Piece(key))] \
                    if m.group(4).startswith("conv.") else None
            renamed = _renamed(m.group(4), _VAE_RESNET)
            return None if renamed is None else [
                (f"decoder.up_blocks.{level}.resnets.{m.group(3)}.{renamed}", Piece(key))]
        return None

    return rule


def clip_rule() -> Rule:
    """transformers' CLIPTextModel as the file holds it (SD 1.x's cond_stage_model.transformer.*,
    SDXL's first embedder, a CLIP-L file): its own names, text_model.* (older files name the
    text model's tensors without it); the position ids are computed, never read."""

    def rule(key: str) -> Optional[List[Tuple[str, Piece]]]:
        if key.endswith("position_ids") or key == "logit_scale":
            return []
        if key.startswith("text_model.") or key == "text_projection.weight":
            return _same(key)
        if key.startswith(("embeddings.", "encoder.", "final_layer_norm.")):
            return [("text_model." + key, Piece(key))]
        return None

    return rule


_OPEN_CLIP_LAYER = (("ln_1.", "layer_norm1."), ("ln_2.", "layer_norm2."),
                    ("mlp.c_fc.", "mlp.fc1."), ("mlp.c_proj.", "mlp.fc2."),
                    ("attn.out_proj.", "self_attn.out_proj."))


def open_clip_rule(layers: int, width: int, projection: bool) -> Rule:
    """OpenCLIP's text tower (SD 2.x's cond_stage_model.model.*, SDXL's second embedder) ->
    CLIPTextModel(WithProjection): its fused in_proj cut into q, k and v of `width` rows each,
    layers from `layers` on (SD 2.x's text encoder stops at the penultimate) never read, the
    projection transposed where the model has one."""

    def rule(key: str) -> Optional[List[Tuple[str, Piece]]]:
        if key in ("logit_scale", "attn_mask") or key.startswith("visual."):
            return []
        if key == "token_embedding.weight":
            return [("text_model.embeddings.token_embedding.weight", Piece(key))]
        if key == "positional_embedding":
            return [("text_model.embeddings.position_embedding.weight", Piece(key))]
        if key.startswith("ln_final."):
            return [("text_model.final_layer_norm." + key[len("ln_final."):], Piece(key))]
        if key == "text_projection":
            return [("text_projection.weight", Piece(key, transpose=True))] if projection else []
        m = re.fullmatch(r"transformer\.resblocks\.(\d+)\.(.+)", key)
        if m is None:
            return None
        n, rest = int(m.group(1)), m.group(2)
        if n >= layers:
            return []
        at = f"text_model.encoder.layers.{n}."
        m = re.fullmatch(r"attn\.in_proj_(weight|bias)", rest)
        if m:
            return [(f"{at}self_attn.{p}_proj.{m.group(1)}", Piece(key, i * width, width))
                    for i, p in enumerate("qkv")]
        renamed = _renamed(rest, _OPEN_CLIP_LAYER)
        return None if renamed is None else [(at + renamed, Piece(key))]

    return rule


def t5_rule() -> Rule:
    """transformers' T5EncoderModel as T5-XXL files hold it: its own names (the decoder and the
    LM head of a full T5 are never read)."""

    def rule(key: str) -> Optional[List[Tuple[str, Piece]]]:
        if key.startswith(("encoder.", "shared.")):
            return _same(key)
        if key.startswith(("decoder.", "lm_head.")):
            return []
        return None

    return rule


_FLUX_TOP = (("img_in.", "x_embedder."), ("txt_in.", "context_embedder."),
             ("time_in.in_layer.", "time_text_embed.timestep_embedder.linear_1."),
             ("time_in.out_layer.", "time_text_embed.timestep_embedder.linear_2."),
             ("vector_in.in_layer.", "time_text_embed.text_embedder.linear_1."),
             ("vector_in.out_layer.", "time_text_embed.text_embedder.linear_2."),
             ("guidance_in.in_layer.", "time_text_embed.guidance_embedder.linear_1."),
             ("guidance_in.out_layer.", "time_text_embed.guidance_embedder.linear_2."),
             ("final_layer.linear.", "proj_out."))
_FLUX_DOUBLE = (("img_mod.lin.", "norm1.linear."), ("txt_mod.lin.", "norm1_context.linear."),
                ("img_attn.norm.query_norm.scale", "attn.norm_q.weight"),
                ("img_attn.norm.key_norm.scale", "attn.norm_k.weight"),
                ("txt_attn.norm.query_norm.scale", "attn.norm_added_q.weight"),
                ("txt_attn.norm.key_norm.scale", "attn.norm_added_k.weight"),
                ("img_attn.proj.", "attn.to_out.0."), ("txt_attn.proj.", "attn.to_add_out."),
                ("img_mlp.0.", "ff.net.0.proj."), ("img_mlp.2.", "ff.net.2."),
                ("txt_mlp.0.", "ff_context.net.0.proj."), ("txt_mlp.2.", "ff_context.net.2."))
_FLUX_SINGLE = (("modulation.lin.", "norm.linear."), ("linear2.", "proj_out."),
                ("norm.query_norm.scale", "attn.norm_q.weight"),
                ("norm.key_norm.scale", "attn.norm_k.weight"))


def flux_rule(width: int, shapes: Callable[[str], Tuple[int, ...]]) -> Rule:
    """Black Forest Labs' Flux (double_blocks.N.*, single_blocks.N.*) -> FluxTransformer2DModel:
    each fused qkv cut into q, k and v of `width` rows (the single blocks' linear1 also gives the
    MLP's input, the rows after them), the final modulation's halves swapped."""

    def rule(key: str) -> Optional[List[Tuple[str, Piece]]]:
        if key.startswith("final_layer.adaLN_modulation.1."):
            return [("norm_out.linear." + key.rpartition(".")[2], Piece(key, swap=True))]
        top = _renamed(key, _FLUX_TOP)
        if top is not None:
            return [(top, Piece(key))]
        m = re.fullmatch(r"(double|single)_blocks\.(\d+)\.(.+)", key)
        if m is None:
            return None
        double, rest = m.group(1) == "double", m.group(3)
        at = f"{'transformer_blocks' if double else 'single_transformer_blocks'}.{m.group(2)}."
        m = re.fullmatch(r"(img|txt)_attn\.qkv\.(weight|bias)", rest) if double else \
            re.fullmatch(r"linear1\.(weight|bias)", rest)
        if m:
            leaf = m.group(m.lastindex)
            names = ("to_q", "to_k", "to_v") if not double or m.group(1) == "img" else \
                ("add_q_proj", "add_k_proj", "add_v_proj")
            out = [(f"{at}attn.{n}.{leaf}", Piece(key, i * width, width))
                   for i, n in enumerate(names)]
            if not double:
                out.append((f"{at}proj_mlp.{leaf}",
                            Piece(key, 3 * width, shapes(key)[0] - 3 * width)))
            return out
        renamed = _renamed(rest, _FLUX_DOUBLE if double else _FLUX_SINGLE)
        return None if renamed is None else [(at + renamed, Piece(key))]

    return rule
