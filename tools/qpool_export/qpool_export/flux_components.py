"""The FLUX components of a diffusers FluxPipeline folder as qpool's trace-clean modules, ready to
trace, in the style of diffusers_components.py: the transformer (FluxTransformer2DModel, rebuilt
as flux_transformer.FluxTransformer) and text_encoder_2 (T5EncoderModel, rebuilt as
t5_encoder.T5Encoder). Each is loaded with diffusers / transformers (or, for a bitsandbytes
checkpoint, built from its config and given the dequantized weights), loaded strictly into
qpool's module and checked against the original on random inputs; the Built it returns carries
example inputs for the trace and for the second-shape check, each of another shape (B, S and L
all differ), so a size baked into the trace fails the export. The CLIP text encoder and the VAE
are diffusers_components' builders.
"""

from __future__ import annotations

import os
from typing import Dict, Optional, Tuple

import torch

from .diffusers_components import Built, _check_same, _mirror, _open_original, read_json
from .flux_transformer import (FluxSingleTransformerBlock, FluxTransformer, FluxTransformerBlock,
                               FluxTransformerConfig, image_ids, text_ids)
from .import_error import ImportFailure
from .stream_import import SourceTensors
from .t5_encoder import MaskedT5Encoder, T5Encoder, T5EncoderConfig


def build_flux_transformer(src: str, context: Tuple[int, int], pooled_dim: int,
                           gen: torch.Generator, variant: Optional[str] = None,
                           serving_side: int = 2, streamed: bool = False,
                           source: Optional[SourceTensors] = None
                           ) -> Tuple[Built, FluxTransformerConfig]:
    """`context` is (tokens, width) of text_encoder_2's (T5's) hidden states; `pooled_dim` the
    width of text_encoder's (CLIP's) pooled text_embeds; `serving_side` the packed latent's side
    (in 2x2 patches) at the pipeline's default size, which a compiled forward is compiled at
    (Note [Compile at the serving size])."""
    from diffusers import FluxTransformer2DModel

    where = os.path.join(src, "transformer")
    config_path = os.path.join(where, "config.json")
    # Checked before diffusers builds the model: a field it does not know would fail there with
    # a message about its arguments rather than the field.
    FluxTransformerConfig.from_diffusers(
        {k: v for k, v in read_json(config_path).items() if k != "quantization_config"},
        config_path)
    original, prequantized, source = _open_original(
        where, lambda: FluxTransformer2DModel.from_pretrained(where, variant=variant),
        FluxTransformer2DModel.from_config, streamed, variant, source)
    cfg = FluxTransformerConfig.from_diffusers(dict(original.config), config_path)
    length, width = context
    if width != cfg.joint_attention_dim:
        raise ImportFailure(f"{config_path}: field 'joint_attention_dim' is "
                            f"{cfg.joint_attention_dim}; text_encoder_2 gives {width}")
    if pooled_dim != cfg.pooled_projection_dim:
        raise ImportFailure(f"{config_path}: field 'pooled_projection_dim' is "
                            f"{cfg.pooled_projection_dim}; text_encoder's pooled text_embeds "
                            f"are {pooled_dim} wide")
    # A bitsandbytes checkpoint's layers keep their names; the others' projections are fused
    # (Note [Fused projections]), block by block where the import streams.
    mirror, stream = _mirror(
        lambda: FluxTransformer(cfg), original.state_dict, source, where,
        (lambda m: None) if prequantized else (lambda m: m.fuse_projections()),
        block_transform=_fuse_flux_blocks)

    def inputs(batch: int, rows: int, cols: int, tokens: int) -> Tuple[torch.Tensor, ...]:
        """FluxPipeline's transformer inputs for a packed latent of rows x cols tokens."""
        return (torch.randn(batch, rows * cols, cfg.in_channels, generator=gen),
                torch.randn(batch, tokens, width, generator=gen),
                torch.randn(batch, pooled_dim, generator=gen),
                torch.rand(batch, generator=gen),  # the sigma, FluxPipeline's t / 1000
                image_ids(rows, cols), text_ids(tokens),
                torch.rand(batch, generator=gen) * 4 + 1)  # a guidance scale

    def diffusers_transformer(args: Tuple[torch.Tensor, ...]) -> torch.Tensor:
        x, encoded, pooled, timestep, img, txt, guidance = args
        return original(hidden_states=x, encoder_hidden_states=encoded,
                        pooled_projections=pooled, timestep=timestep, img_ids=img, txt_ids=txt,
                        guidance=guidance if cfg.guidance_embeds else None,
                        return_dict=False)[0]

    tokens = max(1, min(length, 5))
    compared = inputs(1, 2, 3, tokens)
    diff = None  # Note [Streaming import]: a streamed transformer has no weights to compare
    if stream is None:
        with torch.no_grad():
            diff = _check_same(where, diffusers_transformer(compared), mirror(*compared))
    trace_inputs = inputs(2, 3, 2, max(1, min(length, 4)))
    check_inputs = inputs(3, 2, 2, max(1, min(length, 7)))
    # A compiled forward keeps the text tokens fixed: the manifest's T5 length.
    compile_inputs = inputs(2, serving_side, serving_side, length)
    return Built("transformer", mirror, trace_inputs, check_inputs, diff, prequantized,
                 compile_inputs=compile_inputs, stream=stream), cfg


def _fuse_flux_blocks(module: torch.nn.Module) -> int:
    """FluxTransformer.fuse_projections on the blocks in `module` (a block streamed alone)."""
    return sum(m.fuse() for m in list(module.modules())
               if isinstance(m, (FluxTransformerBlock, FluxSingleTransformerBlock)))


def _tie_t5_embeddings(module: torch.nn.Module, state: Dict[str, torch.Tensor], prefix: str,
                       *_: object) -> None:
    """A load_state_dict pre-hook for a T5EncoderModel built from its config (bitsandbytes
    checkpoints): the checkpoint stores the tied token embedding once, as shared.weight (or
    encoder.embed_tokens.weight); the other name gets the same tensor."""
    names = (prefix + "shared.weight", prefix + "encoder.embed_tokens.weight")
    for have, want in (names, names[::-1]):
        if have in state and want not in state:
            state[want] = state[have]


def build_t5_encoder(src: str, max_length: int, gen: torch.Generator,
                     variant: Optional[str] = None, name: str = "text_encoder_2",
                     masked: bool = False, streamed: bool = False,
                     source: Optional[SourceTensors] = None) -> Built:
    """text_encoder_2 (T5EncoderModel) as FluxPipeline runs it: token ids padded to
    `max_length` (its max_sequence_length), no attention mask, last_hidden_state. `masked`: with
    the attention mask as well, as HiDreamImagePipeline runs its text_encoder_3 (`name`)."""
    from transformers import T5Config, T5EncoderModel

    where = os.path.join(src, name)
    config_path = os.path.join(where, "config.json")

    def from_config(config: Dict[str, object]) -> torch.nn.Module:
        model = T5EncoderModel(T5Config.from_dict(config))
        model.register_load_state_dict_pre_hook(_tie_t5_embeddings)
        return model

    original, prequantized, source = _open_original(
        where, lambda: T5EncoderModel.from_pretrained(where, variant=variant), from_config,
        streamed, variant, source)
    cfg = T5EncoderConfig.from_transformers(original.config.to_dict(), config_path)
    mirror, stream = _mirror(lambda: (MaskedT5Encoder if masked else T5Encoder)(cfg, max_length),
                             original.state_dict, source, where, candidates=_t5_candidates)
    # The whole bucket table against transformers' own function (Note [Relative position
    # buckets] in t5_encoder.py); the random ids below reach only short distances.
    attention = original.encoder.block[0].layer[0].SelfAttention
    bucket = getattr(attention, "_relative_position_bucket", None)
    if bucket is not None:
        positions = torch.arange(max_length)
        want = bucket(positions[None, :] - positions[:, None], bidirectional=True,
                      num_buckets=cfg.relative_attention_num_buckets,
                      max_distance=cfg.relative_attention_max_distance)
        if not torch.equal(want, mirror.encoder.relative_position_buckets):
            raise ImportFailure(f"{where}: qpool's relative position buckets differ from "
                                f"transformers'; this T5 is not supported")

    def ids(batch: int, length: int) -> Tuple[torch.Tensor, ...]:
        length = min(length, max_length)
        tokens = torch.randint(0, cfg.vocab_size, (batch, length), generator=gen)
        if not masked:
            return (tokens,)
        mask = torch.ones(batch, length, dtype=torch.long)
        mask[0, max(1, length // 2):] = 0  # right padding on the first prompt
        return tokens, mask

    compared = ids(2, 19)
    diff = None  # Note [Streaming import]: a streamed encoder has no weights here to compare
    if stream is None:
        with torch.no_grad():
            want = original(compared[0], attention_mask=compared[1] if masked else None)
            diff = _check_same(where, want.last_hidden_state, mirror(*compared))
    return Built(name, mirror, ids(2, 12), ids(1, 17), diff, prequantized, stream=stream)


# T5's token embedding is tied: a checkpoint holds it as shared.weight, encoder.embed_tokens.weight
# or both.
_T5_TIED = ("shared.weight", "encoder.embed_tokens.weight")


def _t5_candidates(key: str) -> Tuple[str, ...]:
    return (key, _T5_TIED[1] if key == _T5_TIED[0] else _T5_TIED[0]) if key in _T5_TIED \
        else (key,)
