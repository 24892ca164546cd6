"""The components of a diffusers HiDreamImagePipeline folder that are HiDream's own, as qpool's
trace-clean modules ready to trace, in the style of flux_components.py: text_encoder_4 (a
LlamaForCausalLM or LlamaModel, rebuilt as llm_encoder.LlmEncoder) and the transformer
(HiDreamImageTransformer2DModel, rebuilt as hidream_transformer.HiDreamTransformer). Each is
loaded with transformers / diffusers (a bitsandbytes checkpoint: built from its config with the
dequantized weights), loaded strictly into qpool's module and checked against the original on
random inputs; the Built carries trace and check inputs of other shapes. The CLIPs, T5 and the
VAE are the other builders'.
"""

from __future__ import annotations

import os
from typing import Optional, Tuple

import torch

from .diffusers_components import Built, _check_same, _mirror, _open_original, read_json
from .hidream_experts import group_experts
from .hidream_transformer import HiDreamTransformer, HiDreamTransformerConfig, fuse_projections
from .import_error import ImportFailure
from .llm_encoder import LlmEncoder, LlmEncoderConfig


def _decoder(model: torch.nn.Module) -> torch.nn.Module:
    """The LlamaModel of a LlamaForCausalLM (HiDream ships the causal LM), or the model itself."""
    return getattr(model, "model", model)


def build_llm_encoder(where: str, max_length: int, gen: torch.Generator,
                      variant: Optional[str] = None,
                      streamed: bool = False) -> Tuple[Built, LlmEncoderConfig]:
    """text_encoder_4 as HiDreamImagePipeline runs it, from the folder `where` (a pipeline's
    text_encoder_4/, or a Llama folder of its own): token ids padded on the right to
    `max_length` with their attention mask; every layer's hidden states."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config_path = os.path.join(where, "config.json")
    LlmEncoderConfig.from_llama(read_json(config_path), config_path)  # before anything is built
    original, prequantized, source = _open_original(
        where, lambda: LlamaForCausalLM.from_pretrained(where, variant=variant),
        lambda config: LlamaForCausalLM(LlamaConfig.from_dict(config)), streamed, variant)
    decoder = _decoder(original).eval()
    cfg = LlmEncoderConfig.from_llama(decoder.config.to_dict(), config_path)
    # A LlamaForCausalLM checkpoint names the decoder's tensors model.*; its lm_head is unread.
    mirror, stream = _mirror(lambda: LlmEncoder(cfg, max_length), decoder.state_dict, source,
                             where, candidates=lambda key: ("model." + key, key),
                             ignored=lambda key: key.startswith("lm_head."))
    # The whole rotary table against transformers' own module (Note [Rotary tables]).
    probe = torch.zeros(1, max_length, cfg.hidden_size)
    cos, sin = decoder.rotary_emb(probe, torch.arange(max_length)[None])
    if not (torch.equal(cos[0], mirror.rotary_cos) and torch.equal(sin[0], mirror.rotary_sin)):
        raise ImportFailure(f"{config_path}: qpool's rotary tables differ from transformers'; "
                            f"this Llama is not supported")

    def inputs(batch: int, length: int) -> Tuple[torch.Tensor, torch.Tensor]:
        length = min(length, max_length)
        ids = torch.randint(0, cfg.vocab_size, (batch, length), generator=gen)
        mask = torch.ones(batch, length, dtype=torch.long)
        mask[-1, max(1, length // 2):] = 0  # right padding on the last prompt
        return ids, mask

    compared = inputs(2, 19)
    diff = None  # Note [Streaming import]: a streamed encoder has no weights here to compare
    if stream is None:
        with torch.no_grad():
            want = torch.stack(decoder(*compared, output_hidden_states=True).hidden_states[1:])
            diff = _check_same(where, want, mirror(*compared))
    return Built("text_encoder_4", mirror, inputs(2, 12), inputs(3, 17), diff,
                 prequantized, stream=stream), cfg


def build_hidream_transformer(src: str, t5: Tuple[int, int], llama: Tuple[int, int, int],
                              pooled_dim: int, gen: torch.Generator,
                              variant: Optional[str] = None,
                              streamed: bool = False) -> Tuple[Built, HiDreamTransformerConfig]:
    """`t5` is (tokens, width) of text_encoder_3's hidden states, `llama` (layers, tokens, width)
    of text_encoder_4's, `pooled_dim` the width of the two CLIPs' pooled projections together."""
    from diffusers import HiDreamImageTransformer2DModel

    where = os.path.join(src, "transformer")
    config_path = os.path.join(where, "config.json")
    t5_tokens, t5_width = t5
    layers, llama_tokens, llama_width = llama

    def check(cfg: HiDreamTransformerConfig) -> HiDreamTransformerConfig:
        for field, have, want in (("caption_channels[0]", cfg.caption_channels[0], t5_width),
                                  ("caption_channels[1]", cfg.caption_channels[1], llama_width),
                                  ("text_emb_dim", cfg.text_emb_dim, pooled_dim)):
            if have != want:
                raise ImportFailure(f"{config_path}: field '{field}' is {have}; the text "
                                    f"encoders give {want}")
        if max(cfg.llama_layers) >= layers:
            raise ImportFailure(f"{config_path}: field 'llama_layers' names layer "
                                f"{max(cfg.llama_layers)}; text_encoder_4 has {layers}")
        return cfg

    # The config file first, before anything is built; then the loaded model's config.
    check(HiDreamTransformerConfig.from_diffusers(
        {k: v for k, v in read_json(config_path).items() if k != "quantization_config"},
        config_path))
    original, prequantized, source = _open_original(
        where, lambda: HiDreamImageTransformer2DModel.from_pretrained(where, variant=variant),
        HiDreamImageTransformer2DModel.from_config, streamed, variant)
    cfg = check(HiDreamTransformerConfig.from_diffusers(dict(original.config), config_path))
    # A bitsandbytes checkpoint's layers keep their names; the others' projections are fused
    # (Note [Fused projections]) and their experts grouped (Note [Routed experts]), each
    # streamed block as it arrives, before --quantize quantizes them.
    def fuse(module: torch.nn.Module) -> None:
        if not prequantized:
            fuse_projections(module)
            group_experts(module)
    mirror, stream = _mirror(lambda: HiDreamTransformer(cfg), original.state_dict, source, where,
                             fuse)

    def inputs(batch: int, rows: int, cols: int, tokens: int, llama_len: int,
               padding: int = 0) -> Tuple[torch.Tensor, ...]:
        """rows x cols patches, `padding` more tokens masked (Note [Padded images])."""
        mask = torch.ones(batch, rows * cols + padding)
        mask[:, rows * cols:] = 0
        return (torch.randn(batch, cfg.in_channels, rows * cfg.patch_size,
                            cols * cfg.patch_size, generator=gen),
                torch.rand(batch, generator=gen) * 1000,
                torch.randn(batch, min(tokens, t5_tokens), t5_width, generator=gen),
                torch.randn(layers, batch, min(llama_len, llama_tokens), llama_width,
                            generator=gen),
                torch.randn(batch, pooled_dim, generator=gen), mask)

    compared = inputs(1, 3, 3, 5, 4)
    diff = None  # Note [Streaming import]: a streamed transformer has no weights to compare
    if stream is None:
        with torch.no_grad():
            latents, t, t5_states, llama_states, pooled, _ = compared
            want = original(hidden_states=latents, timesteps=t,
                            encoder_hidden_states_t5=t5_states,
                            encoder_hidden_states_llama3=llama_states, pooled_embeds=pooled,
                            return_dict=False)[0]
            diff = _check_same(where, want, mirror(*compared))
    # Traced square; checked on a padded non-square latent, which the same trace serves.
    return Built("transformer", mirror, inputs(2, 2, 2, 4, 3), inputs(1, 4, 2, 6, 5, 3), diff,
                 prequantized, stream=stream), cfg
