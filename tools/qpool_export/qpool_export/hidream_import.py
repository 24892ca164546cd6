"""Imports a diffusers HiDreamImagePipeline folder as a qpool pipeline of kind `hidream`: CLIP-L
and CLIP-G text_encoder/ and text_encoder_2/ (CLIPTextModelWithProjection, their text_embeds
concatenated into the pooled embedding), T5 text_encoder_3/ (with its attention mask), the Llama
text_encoder_4/ (LlamaForCausalLM, every layer's hidden states), transformer/
(HiDreamImageTransformer2DModel), the 16-channel vae/ and a flow-matching scheduler/. The
published HiDream-I1 folders leave text_encoder_4 and tokenizer_4 out (model_index.json lists them
as null) and name Llama-3.1-8B-Instruct instead: `--text-encoder-4 DIR` gives that folder (its
config.json, weights and tokenizer.json). from_diffusers.import_pipeline calls
build_hidream_components and build_hidream_manifest; the component builders are
hidream_components.py's, flux_components.py's (T5) and diffusers_components.py's (CLIP, VAE).

Note [HiDream prompts]
HiDreamImagePipeline runs every encoder on max_sequence_length = 128 tokens (CLIP: at most 218,
so 128; T5 and the Llama: at most their tokenizer's model_max_length): the manifest's four
tokenizer sections say 128 (or less), each padded to it. Each CLIP gives its projected pooled
embedding (text_embeds); T5 gets the attention mask of its padding, the Llama too (padded on the
right with its eos token when tokenizer_config.json names no pad token, as the pipeline sets
it), and its hidden states after each layer, stacked [layers, B, L, width], go to the
transformer, which picks its llama_layers from them. With classifier-free guidance (guidance
scale > 1), the negative prompt's rows come first; the transformer's output is negated before
guidance. A FlowMatchEulerDiscreteScheduler with use_dynamic_shifting gets mu from the
transformer's max_seq, not from the image (calculate_shift with its defaults): the manifest
records that mu as both base_shift and max_shift, whose line is then flat at mu for every image.
The pipeline passes the scheduler no sigmas (the server's FlowSigmas::kScheduler).
"""

from __future__ import annotations

import os
import shutil
from typing import Dict, List, Optional, Tuple

import torch

from . import manifest as manifest_io
from .diffusers_components import build_text_encoder, build_vae_decoder, read_json
from .hidream_components import build_hidream_transformer, build_llm_encoder
from .import_error import ImportFailure
from .import_steps import (DTYPES, ImportOptions, Tokenizer, copy_clip_tokenizer,
                           copy_sentencepiece, save_component, streams)
from .sd_vae import SdVaeConfig

COMPONENTS = {
    "text_encoder": ("transformers", "CLIPTextModelWithProjection"),
    "tokenizer": ("transformers", "CLIPTokenizer"),
    "text_encoder_2": ("transformers", "CLIPTextModelWithProjection"),
    "tokenizer_2": ("transformers", "CLIPTokenizer"),
    "text_encoder_3": ("transformers", "T5EncoderModel"),
    "tokenizer_3": ("transformers", ("T5TokenizerFast", "T5Tokenizer")),
    "transformer": ("diffusers", "HiDreamImageTransformer2DModel"),
    "vae": ("diffusers", "AutoencoderKL"),
}
# In the folder, or given by --text-encoder-4 (module docstring).
LLAMA_COMPONENTS = {
    "text_encoder_4": ("transformers", ("LlamaForCausalLM", "LlamaModel")),
    # Any class that reads tokenizer.json (transformers 5 saves TokenizersBackend).
    "tokenizer_4": ("transformers", ("PreTrainedTokenizerFast", "TokenizersBackend",
                                     "LlamaTokenizerFast", "AutoTokenizer")),
}
FILES = ("text_encoder", "text_encoder_2", "text_encoder_3", "text_encoder_4", "transformer",
         "vae_decoder")
MAX_SEQUENCE_LENGTH = 128  # HiDreamImagePipeline's default max_sequence_length
CLIP_MAX_LENGTH = 218  # the most CLIP tokens it uses
DEFAULT_SAMPLE_SIZE = 128  # latent pixels of the default image (HiDreamImagePipeline)
DEFAULT_STEPS, DEFAULT_GUIDANCE = 50, 5.0  # HiDreamImagePipeline.__call__'s defaults
LLAMA_MAX_LENGTH = 1024  # the largest max_length a manifest's tokenizer section holds
MAX_PADDED_TOKENS = 1 << 16  # the most conditioning.padded_image_tokens a manifest holds


def calculate_mu(image_seq_len: int) -> float:
    """diffusers' calculate_shift with its defaults, as HiDreamImagePipeline calls it."""
    base_seq_len, max_seq_len, base_shift, max_shift = 256, 4096, 0.5, 1.15
    m = (max_shift - base_shift) / (max_seq_len - base_seq_len)
    return image_seq_len * m + base_shift - m * base_seq_len


def fixed_mu_schedule(section: Dict[str, object], max_seq: int) -> Dict[str, object]:
    """The scheduler section whose dynamic shift, if any, is HiDream's fixed mu for every image
    (Note [HiDream prompts])."""
    if not section.get("use_dynamic_shifting"):
        return section
    mu = calculate_mu(max_seq)
    return {**section, "base_shift": mu, "max_shift": mu}


def llama_folder(src: str, given: Optional[str]) -> str:
    """The Llama's folder: --text-encoder-4's, else the pipeline's text_encoder_4/."""
    if given is not None:
        if not os.path.isdir(given):
            raise ImportFailure(f"--text-encoder-4 {given}: not a directory")
        return given
    inside = os.path.join(src, "text_encoder_4")
    if not os.path.isfile(os.path.join(inside, "config.json")):
        raise ImportFailure(f"{inside}: missing; HiDream folders name their Llama apart: pass "
                            f"--text-encoder-4 DIR, the folder of the LlamaForCausalLM "
                            f"(Llama-3.1-8B-Instruct for HiDream-I1) with its tokenizer.json")
    return inside


def tokenizer_folder(src: str, llama: str, given: Optional[str]) -> str:
    """Where tokenizer_4's files are: the pipeline's tokenizer_4/, else beside the Llama."""
    inside = os.path.join(src, "tokenizer_4")
    if given is None and os.path.isdir(inside):
        return inside
    return llama


def copy_tokenizer_json(folder: str, stage: str, name: str = "tokenizer_4") -> Tokenizer:
    """Copies folder/tokenizer.json to stage/NAME/; the tokens per prompt (at most
    MAX_SEQUENCE_LENGTH) and the pad token (tokenizer_config.json's pad_token, else its
    eos_token) come with it."""
    path = os.path.join(folder, "tokenizer.json")
    if not os.path.isfile(path):
        raise ImportFailure(f"{path}: missing (the Llama's byte-level BPE tokenizer)")
    config_path = os.path.join(folder, "tokenizer_config.json")
    config = read_json(config_path) if os.path.isfile(config_path) else {}
    tokens = read_json(path)
    vocab = (tokens.get("model") or {}).get("vocab")
    added = {t.get("content") for t in tokens.get("added_tokens") or () if isinstance(t, dict)}
    if not isinstance(vocab, dict):
        raise ImportFailure(f"{path}: field 'model.vocab' is required")

    def content(token: object) -> object:
        return token.get("content") if isinstance(token, dict) else token

    pad = content(config.get("pad_token")) or content(config.get("eos_token"))
    if not isinstance(pad, str) or (pad not in vocab and pad not in added):
        raise ImportFailure(f"{config_path}: fields 'pad_token' and 'eos_token' give {pad!r}, "
                            f"which {path} does not hold")
    length = config.get("model_max_length", MAX_SEQUENCE_LENGTH)
    length = length if isinstance(length, int) and length >= 2 else MAX_SEQUENCE_LENGTH
    dest = os.path.join(stage, name)
    os.makedirs(dest)
    shutil.copyfile(path, os.path.join(dest, "tokenizer.json"))
    return Tokenizer(name, min(MAX_SEQUENCE_LENGTH, length, LLAMA_MAX_LENGTH), pad)


def build_hidream_components(src: str, llama: Optional[str], stage: str, opts: ImportOptions,
                             gen: torch.Generator
                             ) -> Tuple[List[Dict[str, object]], Dict[str, object], SdVaeConfig,
                                        int]:
    """Builds, checks and saves every component into `stage`, one at a time; returns the save
    reports, the manifest's four tokenizer sections, the VAE's config and the transformer's
    max_seq (image tokens of its max_resolution)."""
    where = llama_folder(src, llama)
    clip_length = min(MAX_SEQUENCE_LENGTH, CLIP_MAX_LENGTH)
    clips = [Tokenizer(name, clip_length, copy_clip_tokenizer(src, stage, name)[1])
             for name in ("tokenizer", "tokenizer_2")]
    t5_length = min(MAX_SEQUENCE_LENGTH, copy_sentencepiece(src, stage, "tokenizer_3"))
    llama_tokenizer = copy_tokenizer_json(tokenizer_folder(src, where, llama), stage)
    reports: List[Dict[str, object]] = []
    pooled_dim = 0
    for clip in ("text_encoder", "text_encoder_2"):
        built = build_text_encoder(src, clip, "hidream", clip_length, 0, gen, opts.variant,
                                   streams(opts, clip))
        pooled_dim += built.module.config.projection_dim
        reports.append(save_component(built, opts, stage))
        del built
    from .flux_components import build_t5_encoder

    t5 = build_t5_encoder(src, t5_length, gen, opts.variant, name="text_encoder_3", masked=True,
                          streamed=streams(opts, "text_encoder_3"))
    t5_width = t5.module.config.d_model
    reports.append(save_component(t5, opts, stage))
    del t5
    encoder, llama_cfg = build_llm_encoder(where, llama_tokenizer.max_length, gen, opts.variant,
                                           streams(opts, "text_encoder_4"))
    reports.append(save_component(encoder, opts, stage))
    del encoder
    transformer, transformer_cfg = build_hidream_transformer(
        src, (t5_length, t5_width),
        (llama_cfg.num_layers, llama_tokenizer.max_length, llama_cfg.hidden_size), pooled_dim,
        gen, opts.variant, streams(opts, "transformer"))
    reports.append(save_component(transformer, opts, stage))
    del transformer
    vae, vae_cfg = build_vae_decoder(src, "hidream", gen, opts.variant, DTYPES[opts.dtype],
                                     streams(opts, "vae_decoder"))
    if vae_cfg.latent_channels != transformer_cfg.in_channels:
        raise ImportFailure(f"{src}/vae/config.json: field 'latent_channels' is "
                            f"{vae_cfg.latent_channels}; the transformer takes "
                            f"{transformer_cfg.in_channels} channels")
    reports.append(save_component(vae, opts, stage))
    tokenizers = {t.name: t.section() for t in clips}
    tokenizers["tokenizer_3"] = {"model": "tokenizer_3/spiece.model", "max_length": t5_length}
    tokenizers["tokenizer_4"] = {"json": "tokenizer_4/tokenizer.json",
                                 "max_length": llama_tokenizer.max_length,
                                 "pad_token": llama_tokenizer.pad_token}
    resolution = read_json(os.path.join(src, "transformer", "config.json")).get(
        "max_resolution", (DEFAULT_SAMPLE_SIZE, DEFAULT_SAMPLE_SIZE))
    if (not isinstance(resolution, (list, tuple)) or len(resolution) != 2
            or not all(isinstance(r, int) and 0 < r <= 1 << 14 for r in resolution)):
        raise ImportFailure(f"{src}/transformer/config.json: field 'max_resolution' is "
                            f"{resolution!r}; expected two positive integers")
    max_seq = resolution[0] * resolution[1] // transformer_cfg.patch_size ** 2
    if max_seq > MAX_PADDED_TOKENS:
        raise ImportFailure(f"{src}/transformer/config.json: field 'max_resolution' is "
                            f"{resolution!r}: {max_seq} patches; qpool pads images to at most "
                            f"{MAX_PADDED_TOKENS}")
    return reports, tokenizers, vae_cfg, max_seq


def build_hidream_manifest(scheduler: Dict[str, object], vae: SdVaeConfig, max_seq: int,
                           tokenizers: Dict[str, object], quant: Dict[str, Dict[str, object]],
                           dtype: str, sampler: str = "euler") -> Dict[str, object]:
    """The manifest of kind hidream (docs/model-repository.md); a bfloat16 import runs in
    bfloat16 wherever it is placed (T5 and the Llama overflow in float16)."""
    components: Dict[str, object] = {}
    for name in FILES:
        entry = manifest_io.component_entry(name)
        if name in quant:
            entry["quantization"] = quant[name]
        components[name] = entry
    size = DEFAULT_SAMPLE_SIZE * vae.downscale
    return {
        "kind": "hidream", "components": components, **tokenizers,
        # Non-square images' patches are padded to max_seq (Note [Padded images]).
        "conditioning": {"padded_image_tokens": max_seq},
        "scheduler": fixed_mu_schedule(scheduler, max_seq),
        "latent": {"channels": vae.latent_channels, "downscale": vae.downscale,
                   "scaling_factor": vae.scaling_factor, "shift_factor": vae.shift_factor},
        "defaults": {"steps": DEFAULT_STEPS, "guidance_scale": DEFAULT_GUIDANCE,
                     "width": size, "height": size, "scheduler": sampler},
        "limits": {"max_width": max(2048, size), "max_height": max(2048, size)},
        "placement": {"device": "auto",
                      "dtype": "bfloat16" if dtype in ("bfloat16", "bf16") else "auto"},
    }
