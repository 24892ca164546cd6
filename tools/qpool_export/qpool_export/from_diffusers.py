"""Imports a diffusers-format
Stable Diffusion 1.x / 2.x folder (model_index.json, text_encoder/, tokenizer/, unet/, vae/,
scheduler/) as a qpool pipeline folder of kind `sd`, an SDXL folder (StableDiffusionXLPipeline:
also text_encoder_2/ and tokenizer_2/) as one of kind `sdxl`, and a FLUX.1 folder (FluxPipeline:
CLIP text_encoder/, T5 text_encoder_2/ with its SentencePiece tokenizer_2/, transformer/, vae/,
a flow-matching scheduler/) as one of kind `flux` (import_pipeline; the command line,
`python -m qpool_export from-diffusers SRC --out REPO/NAME`, is from_diffusers_cli.py).

Each component is loaded with diffusers / transformers (the only place qpool uses them), its
weights are loaded into qpool's trace-clean modules of the same architecture (Note [Importing
through qpool's modules] in sd_unet.py), which are checked against the originals on random inputs
(diffusers_components.py), optionally quantized, traced and saved. The tokenizer files are copied
and the scheduler config is translated into the manifest. Everything is written to a staging
folder and renamed into place at the end (Note [Export is all-or-nothing] in export.py): a failed
import leaves the repository as it was.
"""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import shutil
import tempfile
import time
from typing import Dict, List, Sequence, Tuple

import torch

from . import compile as aot
from . import manifest as manifest_io
from . import hidream_import, lora_fuse, scheduler_import
from .diffusers_components import (build_text_encoder, build_unet, build_vae_decoder,
                                   read_json)
from .export import _install, _make_stage, validate_name
from .import_error import ImportFailure
# The shared steps; DTYPES, ImportOptions and Tokenizer are the command line's and benches' too.
from .import_steps import (DTYPES, ImportOptions, Tokenizer, copy_clip_tokenizer,  # noqa: F401
                           copy_sentencepiece, save_component, streams)
from .sd_unet import SdUNetConfig
from .sd_vae import SdVaeConfig

PIPELINE_CLASSES = {"StableDiffusionPipeline": "sd", "StableDiffusionXLPipeline": "sdxl",
                    "FluxPipeline": "flux", "HiDreamImagePipeline": "hidream"}
# model_index.json entry -> (library, class) qpool imports, per kind.
SD_COMPONENTS = {
    "text_encoder": ("transformers", "CLIPTextModel"),
    "tokenizer": ("transformers", "CLIPTokenizer"),
    "unet": ("diffusers", "UNet2DConditionModel"),
    "vae": ("diffusers", "AutoencoderKL"),
}
SDXL_COMPONENTS = {
    **SD_COMPONENTS,
    "text_encoder_2": ("transformers", "CLIPTextModelWithProjection"),
    "tokenizer_2": ("transformers", "CLIPTokenizer"),
}
FLUX_COMPONENTS = {
    "text_encoder": ("transformers", "CLIPTextModel"),
    "tokenizer": ("transformers", "CLIPTokenizer"),
    "text_encoder_2": ("transformers", "T5EncoderModel"),
    "tokenizer_2": ("transformers", ("T5TokenizerFast", "T5Tokenizer")),
    "transformer": ("diffusers", "FluxTransformer2DModel"),
    "vae": ("diffusers", "AutoencoderKL"),
}
KIND_COMPONENTS = {"sd": SD_COMPONENTS, "sdxl": SDXL_COMPONENTS, "flux": FLUX_COMPONENTS,
                   "hidream": hidream_import.COMPONENTS}
OPTIONAL = ("safety_checker", "feature_extractor", "image_encoder", "requires_safety_checker",
            "scheduler", "force_zeros_for_empty_prompt")
# The saved components of each kind, in manifest order (all of them quantizable).
KIND_FILES = {"sd": ("text_encoder", "unet", "vae_decoder"),
              "sdxl": ("text_encoder", "text_encoder_2", "unet", "vae_decoder"),
              "flux": ("text_encoder", "text_encoder_2", "transformer", "vae_decoder"),
              "hidream": hidream_import.FILES}
QUANT_COMPONENTS = ("text_encoder", "text_encoder_2", "text_encoder_3", "text_encoder_4", "unet",
                    "transformer", "vae_decoder")
# diffusers' default guidance_scale of each pipeline class.
DEFAULT_GUIDANCE = {"sd": 7.5, "sdxl": 5.0, "flux": 3.5, "hidream": hidream_import.DEFAULT_GUIDANCE}
# Kinds whose T5 (and Llama) overflow in float16: imported in bfloat16 unless --dtype says.
BFLOAT16_KINDS = ("flux", "hidream")
FLUX_DEFAULT_SIZE = 1024  # FluxPipeline's default image side


def check_links(src: str) -> None:
    """ImportFailure naming the first symbolic link under `src` whose target lies outside it: the
    importer would read the target and copy it into the output (a vocab.json linked to
    /etc/shadow, say). A Hugging Face cache snapshot (<repo>/snapshots/<revision>/, whose files
    link to <repo>/blobs/) may link into its repository's blobs."""
    root = os.path.realpath(src)
    allowed = [root]
    parent = os.path.dirname(root)
    if os.path.basename(parent) == "snapshots":
        allowed.append(os.path.join(os.path.dirname(parent), "blobs"))
    for folder, dirs, files in os.walk(src):
        for name in dirs + files:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                continue
            target = os.path.realpath(path)
            if not any(target == a or target.startswith(a + os.sep) for a in allowed):
                raise ImportFailure(f"{path}: a symbolic link to {target}, outside the source "
                                    f"folder; qpool imports only what is in it")


def check_model_index(src: str) -> Tuple[str, Dict[str, object]]:
    """The qpool kind of the pipeline at `src` and its model_index.json; ImportFailure naming the
    file and field of anything else."""
    path = os.path.join(src, "model_index.json")
    index = read_json(path)
    cls = index.get("_class_name")
    if not isinstance(cls, str) or cls not in PIPELINE_CLASSES:
        raise ImportFailure(f"{path}: field '_class_name' is {cls!r}; qpool imports "
                            f"{', '.join(sorted(PIPELINE_CLASSES))}")
    kind = PIPELINE_CLASSES[cls]
    for name, (library, class_name) in KIND_COMPONENTS[kind].items():
        entry = index.get(name)
        if not isinstance(entry, list) or len(entry) != 2:
            first = class_name[0] if isinstance(class_name, tuple) else class_name
            raise ImportFailure(f"{path}: field '{name}' is {entry!r}; expected "
                                f"[\"{library}\", \"{first}\"]")
        accepted = class_name if isinstance(class_name, tuple) else (class_name,)
        if entry[1] not in accepted:
            raise ImportFailure(f"{path}: field '{name}' names class {entry[1]!r}; qpool imports "
                                f"{' or '.join(accepted)}")
        if not os.path.isdir(os.path.join(src, name)):
            raise ImportFailure(f"{os.path.join(src, name)}: missing (model_index.json lists "
                                f"component '{name}')")
    if kind == "hidream":
        for name, (library, class_name) in hidream_import.LLAMA_COMPONENTS.items():
            entry = index.get(name)
            if entry is None or entry == [None, None]:
                continue  # named apart (--text-encoder-4)
            if not isinstance(entry, list) or len(entry) != 2 or entry[1] not in class_name:
                raise ImportFailure(f"{path}: field '{name}' is {entry!r}; expected "
                                    f"[\"{library}\", \"{class_name[0]}\"] or null")
    zeros = index.get("force_zeros_for_empty_prompt", True)
    if kind == "sdxl" and not isinstance(zeros, bool):
        raise ImportFailure(f"{path}: field 'force_zeros_for_empty_prompt' is {zeros!r}; "
                            f"expected true or false")
    return kind, index


def build_manifest(kind: str, scheduler: Dict[str, object], sampler: str, unet: SdUNetConfig,
                   vae: SdVaeConfig, tokenizers: Sequence[Tokenizer],
                   quant: Dict[str, Dict[str, object]], dtypes: Dict[str, str],
                   force_zeros_for_empty_prompt: bool = True) -> Dict[str, object]:
    """The manifest of kind `kind` (docs/model-repository.md); `dtypes` names the components
    saved in another dtype than the pipeline's (an SDXL VAE kept in float32)."""
    size = unet.sample_size * vae.downscale
    components: Dict[str, object] = {}
    for name in KIND_FILES[kind]:
        entry = manifest_io.component_entry(name)
        if name in dtypes:
            entry["dtype"] = dtypes[name]
        if name in quant:
            entry["quantization"] = quant[name]
        components[name] = entry
    limit = max(1024, 2 * size)
    manifest: Dict[str, object] = {"kind": kind, "components": components}
    for tokenizer in tokenizers:
        manifest[tokenizer.name] = tokenizer.section()
    if kind == "sdxl":
        manifest["conditioning"] = {"force_zeros_for_empty_prompt": force_zeros_for_empty_prompt}
    manifest.update({
        "scheduler": scheduler,
        "latent": {"channels": unet.in_channels, "downscale": vae.downscale,
                   "scaling_factor": vae.scaling_factor},
        "defaults": {"steps": 30, "guidance_scale": DEFAULT_GUIDANCE[kind], "width": size,
                     "height": size, "scheduler": sampler},
        "limits": {"max_width": limit, "max_height": limit},
        "placement": {"device": "auto", "dtype": "auto"},
    })
    return manifest


def _checkquantize_built(kind: str, quantize: Dict[str, str]) -> None:
    for name in quantize:
        if name not in KIND_FILES[kind]:
            raise ImportFailure(f"--quantize {name}=...: kind {kind} has no component '{name}' "
                                f"(it has {', '.join(KIND_FILES[kind])})")


def _build_components(kind: str, src: str, stage: str, opts: ImportOptions, gen: torch.Generator
                      ) -> Tuple[List[Dict[str, object]], List[Tokenizer], SdUNetConfig,
                                 SdVaeConfig]:
    """Builds, checks and saves every component of the pipeline into `stage`, one at a time (a
    built component is dropped once saved); returns the save reports, the tokenizers, and the
    UNet's and VAE's configs."""
    encoders = [n for n in KIND_FILES[kind] if n.startswith("text_encoder")]
    tokenizers = []
    for encoder in encoders:
        name = encoder.replace("text_encoder", "tokenizer")
        tokenizers.append(Tokenizer(name, *copy_clip_tokenizer(src, stage, name)))
    max_length = tokenizers[0].max_length
    for t in tokenizers[1:]:
        if t.max_length != max_length:
            raise ImportFailure(f"{src}/{t.name}/tokenizer_config.json: field "
                                f"'model_max_length' is {t.max_length}; tokenizer's is "
                                f"{max_length} (the text encoders' hidden states are "
                                f"concatenated token by token)")
    reports: List[Dict[str, object]] = []
    width, pooled = 0, 0
    for encoder in encoders:
        text = build_text_encoder(src, encoder, kind, max_length, opts.clip_skip, gen,
                                  opts.variant, streams(opts, encoder), opts.sources.get(encoder))
        width += text.module.config.hidden_size
        if text.module.pooled:
            pooled = text.module.config.projection_dim
        reports.append(save_component(text, opts, stage))
        del text
    unet = build_unet(src, kind, (max_length, width), pooled, gen, opts.variant,
                      streams(opts, "unet"), opts.sources.get("unet"))
    unet_cfg = unet.module.config
    unet.compile_side = unet_cfg.sample_size
    reports.append(save_component(unet, opts, stage))
    del unet
    vae, vae_cfg = build_vae_decoder(src, kind, gen, opts.variant, DTYPES[opts.dtype],
                                     streams(opts, "vae_decoder"), opts.sources.get("vae"))
    if vae_cfg.latent_channels != unet_cfg.in_channels:
        raise ImportFailure(f"{src}/vae/config.json: field 'latent_channels' is "
                            f"{vae_cfg.latent_channels}; the UNet takes "
                            f"{unet_cfg.in_channels} channels")
    vae.compile_side = unet_cfg.sample_size
    reports.append(save_component(vae, opts, stage))
    return reports, tokenizers, unet_cfg, vae_cfg


def _build_flux_components(src: str, stage: str, opts: ImportOptions, gen: torch.Generator
                           ) -> Tuple[List[Dict[str, object]], Tokenizer, int, SdVaeConfig]:
    """Builds, checks and saves the components of a FluxPipeline folder into `stage`, one at a
    time; returns the save reports, the CLIP tokenizer, T5's tokens per prompt and the VAE's
    config."""
    from .flux_components import build_flux_transformer, build_t5_encoder

    clip_tokenizer = Tokenizer("tokenizer", *copy_clip_tokenizer(src, stage, "tokenizer"))
    t5_length = copy_sentencepiece(src, stage)
    reports: List[Dict[str, object]] = []
    clip = build_text_encoder(src, "text_encoder", "flux", clip_tokenizer.max_length,
                              opts.clip_skip, gen, opts.variant, streams(opts, "text_encoder"),
                              opts.sources.get("text_encoder"))
    pooled_dim = clip.module.config.hidden_size
    reports.append(save_component(clip, opts, stage))
    del clip
    t5 = build_t5_encoder(src, t5_length, gen, opts.variant,
                          streamed=streams(opts, "text_encoder_2"),
                          source=opts.sources.get("text_encoder_2"))
    context = (t5_length, t5.module.config.d_model)
    reports.append(save_component(t5, opts, stage))
    del t5
    # Note [Compile at the serving size]: the latent of the default image, within the compiled
    # signature's limits.
    vae_levels = len(read_json(os.path.join(src, "vae", "config.json")).get(
        "block_out_channels", (0, 0, 0, 0)))
    latent_side = min(FLUX_DEFAULT_SIZE // 2 ** max(vae_levels - 1, 0), aot.MAX_SIDE)
    transformer, transformer_cfg = build_flux_transformer(src, context, pooled_dim, gen,
                                                          opts.variant, latent_side // 2,
                                                          streams(opts, "transformer"),
                                                          opts.sources.get("transformer"))
    reports.append(save_component(transformer, opts, stage))
    del transformer
    vae, vae_cfg = build_vae_decoder(src, "flux", gen, opts.variant, DTYPES[opts.dtype],
                                     streams(opts, "vae_decoder"), opts.sources.get("vae"))
    if 4 * vae_cfg.latent_channels != transformer_cfg.in_channels:
        raise ImportFailure(f"{src}/vae/config.json: field 'latent_channels' is "
                            f"{vae_cfg.latent_channels}; the transformer takes 2x2 patches of "
                            f"{transformer_cfg.in_channels // 4} channels")
    vae.compile_side = latent_side
    reports.append(save_component(vae, opts, stage))
    return reports, clip_tokenizer, t5_length, vae_cfg


def build_flux_manifest(scheduler: Dict[str, object], vae: SdVaeConfig, clip: Tokenizer,
                        t5_length: int, quant: Dict[str, Dict[str, object]],
                        dtype: str, sampler: str = "euler") -> Dict[str, object]:
    """The manifest of kind flux (docs/model-repository.md). FLUX's T5 overflows in float16:
    a bfloat16 import runs in bfloat16 wherever it is placed."""
    components: Dict[str, object] = {}
    for name in KIND_FILES["flux"]:
        entry = manifest_io.component_entry(name)
        if name in quant:
            entry["quantization"] = quant[name]
        components[name] = entry
    return {
        "kind": "flux", "components": components,
        "tokenizer": clip.section(),
        "tokenizer_2": {"model": "tokenizer_2/spiece.model", "max_length": t5_length},
        "scheduler": scheduler,
        "latent": {"channels": vae.latent_channels, "downscale": vae.downscale,
                   "scaling_factor": vae.scaling_factor, "shift_factor": vae.shift_factor},
        "defaults": {"steps": 28, "guidance_scale": DEFAULT_GUIDANCE["flux"],
                     "width": FLUX_DEFAULT_SIZE, "height": FLUX_DEFAULT_SIZE,
                     "scheduler": sampler},
        "limits": {"max_width": 2048, "max_height": 2048},
        "placement": {"device": "auto",
                      "dtype": "bfloat16" if dtype in ("bfloat16", "bf16") else "auto"},
    }


def import_pipeline(opts: ImportOptions) -> Dict[str, object]:
    """Writes opts.out from opts.src; raises ImportFailure / tracing.ExportError / OSError."""
    start = time.monotonic()
    src = os.path.abspath(opts.src)
    out = os.path.abspath(opts.out)
    validate_name(os.path.basename(out))
    if opts.dtype is not None and opts.dtype not in DTYPES:
        raise ImportFailure(f"--dtype {opts.dtype!r}: choose from float32, float16, bfloat16")
    if not os.path.isdir(src):
        raise ImportFailure(f"{src}: not a directory")
    check_links(src)
    if os.path.isfile(out) or (os.path.isdir(out) and os.listdir(out) and
                               not os.path.exists(os.path.join(out, "pipeline.yaml"))):
        raise ImportFailure(f"{out} exists and is not a pipeline folder; refusing to replace it")
    kind, index = check_model_index(src)
    if opts.dtype is None:
        opts = dataclasses.replace(opts,
                                   dtype="bfloat16" if kind in BFLOAT16_KINDS else "float16")
    if kind in BFLOAT16_KINDS and opts.dtype in ("bfloat16", "bf16"):  # the manifest's placement
        opts = dataclasses.replace(opts, compile_dtype="bfloat16")
    if kind != "hidream" and opts.text_encoder_4 is not None:
        raise ImportFailure(f"--text-encoder-4: kind {kind} has no text_encoder_4")
    if kind == "hidream" and (opts.loras or opts.compile):
        raise ImportFailure(f"--{'lora' if opts.loras else 'compile'}: kind hidream imports "
                            f"neither fused LoRAs nor compiled packages yet")
    _checkquantize_built(kind, opts.quantize)
    for name in opts.compile:
        if name not in KIND_FILES[kind] or name not in aot.COMPILABLE:
            raise ImportFailure(f"--compile {name}: kind {kind} has no compilable component "
                                f"'{name}' (it has "
                                f"{', '.join(c for c in KIND_FILES[kind] if c in aot.COMPILABLE)})")
    if opts.import_device == "cuda" and not torch.cuda.is_available():
        raise ImportFailure("--import-device cuda needs a GPU on the importing machine")
    if opts.compile_device == "cuda" and opts.compile and not torch.cuda.is_available():
        raise ImportFailure("--compile-device cuda needs a GPU on the importing machine")
    sched_path = os.path.join(src, "scheduler", "scheduler_config.json")
    notes = [n for n in (scheduler_import.sampler_note(read_json(sched_path)),
                         safety_checker_note(index)) if n]
    if kind in BFLOAT16_KINDS:
        scheduler, sampler = scheduler_import.translate_flow(read_json(sched_path), sched_path,
                                                             kind)
    else:
        scheduler, sampler = scheduler_import.translate(read_json(sched_path), sched_path,
                                                        kind)

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a folder on disk; never the network
    origin, lora_work, fused = src, None, []
    stage = _make_stage(out)
    try:
        if opts.loras:
            lora_work = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.lora-",
                                         dir=os.path.dirname(out))
            fused = lora_fuse.fused_source(src, kind, opts.loras, lora_work, opts.variant)
            src = lora_work
        gen = torch.Generator().manual_seed(0)
        if kind == "flux":
            reports, clip, t5_length, vae_cfg = _build_flux_components(src, stage, opts, gen)
        elif kind == "hidream":
            reports, tokenizers, vae_cfg, max_seq = hidream_import.build_hidream_components(
                src, opts.text_encoder_4, stage, opts, gen)
        else:
            reports, tokenizers, unet_cfg, vae_cfg = _build_components(kind, src, stage, opts,
                                                                       gen)
        stays_float = {r["name"] for r in reports if r["stays_float"]}
        quant = {c: manifest_io.quantization_section(f, opts.blocksize, opts.double_quant,
                                                     min_weights=opts.min_weights)
                 for c, f in opts.quantize.items() if f != "none" and c not in stays_float}
        for r in reports:  # bitsandbytes checkpoints: the format their bytes were converted to
            if r["converted_formats"] and r["name"] not in quant:
                quant[r["name"]] = {"format": r["converted_formats"][0]}
        if kind == "flux":
            manifest = build_flux_manifest(scheduler, vae_cfg, clip, t5_length, quant,
                                           opts.dtype, sampler)
        elif kind == "hidream":
            manifest = hidream_import.build_hidream_manifest(scheduler, vae_cfg, max_seq,
                                                             tokenizers, quant, opts.dtype,
                                                             sampler)
        else:
            dtypes = {r["name"]: r["dtype"] for r in reports if r["dtype"]}
            manifest = build_manifest(kind, scheduler, sampler, unet_cfg, vae_cfg, tokenizers,
                                      quant, dtypes,
                                      bool(index.get("force_zeros_for_empty_prompt", True)))
        import diffusers
        import transformers

        header = ((opts.origin or f"imported by qpool_export from-diffusers from {origin}") + "\n"
                  f"(diffusers {diffusers.__version__}, transformers {transformers.__version__}; "
                  f"dtype {opts.dtype}"
                  + (f", quantized {', '.join(f'{c}={f}' for c, f in opts.quantize.items())}"
                     if opts.quantize else "") + ")"
                  + (f"\n{lora_fuse.describe(opts.loras)} into {', '.join(fused)}"
                     if opts.loras else "")
                  + "".join(f"\n{n}" for n in notes))
        for c in opts.compile:
            manifest["components"][c]["compiled"] = aot.manifest_entry(stage, c,
                                                                       opts.compile_device)
        if opts.warmup:
            manifest["execution"] = {"warmup": True}
        with open(os.path.join(stage, "pipeline.yaml"), "w", encoding="utf-8") as f:
            f.write(manifest_io.dump_manifest(manifest_io.record_digests(manifest, stage), header))
        _install(stage, out)
        if opts.layer_error:
            with open(opts.layer_error, "w", encoding="utf-8") as f:
                json.dump({r["name"]: r["layer_errors"] for r in reports if r["layer_errors"]},
                          f, indent=1)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    finally:
        if lora_work is not None:
            shutil.rmtree(lora_work, ignore_errors=True)
    return {"out": out, "components": reports, "seconds": time.monotonic() - start,
            "lora_components": fused, "notes": notes,
            "bytes": sum(r["bytes"] for r in reports),
            # ru_maxrss is in KiB on Linux: the importing process's peak so far.
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def safety_checker_note(index: Dict[str, object]) -> str:
    """What the import says of a safety checker the folder ships ('' without one)."""
    entry = index.get("safety_checker")
    if not isinstance(entry, list) or not entry or entry[0] is None:
        return ""
    return ("safety_checker: not imported; qpool serves the pipeline's images without "
            "diffusers' safety checker (its NSFW filter)")
