"""`python -m qpool_export from-diffusers SRC --out REPO/NAME`: imports a diffusers-format
Stable Diffusion 1.x / 2.x folder (model_index.json, text_encoder/, tokenizer/, unet/, vae/,
scheduler/) as a qpool pipeline folder of kind `sd`.

Each component is loaded with diffusers / transformers (the only place qpool uses them), its
weights are loaded into qpool's trace-clean modules of the same architecture (Note [Importing
through qpool's modules] in sd_unet.py), which are checked against the originals on random inputs,
optionally quantized, traced and saved. The tokenizer files are copied and the scheduler config is
translated into the manifest. Everything is written to a staging folder and renamed into place
at the end (Note [Export is all-or-nothing] in export.py): a failed import leaves the repository
as it was.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from . import bnb_import
from . import manifest as manifest_io
from . import scheduler_import, tracing
from .clip_text import ClipTextConfig, ClipTextEncoder
from .export import _install, _make_stage, _tensor_bytes, validate_name
from .import_error import ImportFailure
from .sd_unet import SdUNet, SdUNetConfig
from .sd_vae import SdVaeConfig, SdVaeDecoder

PIPELINE_CLASSES = {"StableDiffusionPipeline": "sd"}
# model_index.json entry -> (library, class) qpool imports.
SD_COMPONENTS = {
    "text_encoder": ("transformers", "CLIPTextModel"),
    "tokenizer": ("transformers", "CLIPTokenizer"),
    "unet": ("diffusers", "UNet2DConditionModel"),
    "vae": ("diffusers", "AutoencoderKL"),
}
OPTIONAL = ("safety_checker", "feature_extractor", "image_encoder", "requires_safety_checker",
            "scheduler")
DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16,
          "fp16": torch.float16, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
QUANT_COMPONENTS = ("text_encoder", "unet", "vae_decoder")


@dataclass
class ImportOptions:
    src: str
    out: str
    dtype: str = "float16"
    quantize: Dict[str, str] = field(default_factory=dict)  # component -> int8 | nf4
    blocksize: int = 64
    double_quant: bool = False
    clip_skip: int = 0
    variant: Optional[str] = None  # e.g. "fp16": read *.fp16.safetensors weight files
    verbose: bool = True


def _read_json(path: str) -> Dict[str, object]:
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except FileNotFoundError:
        raise ImportFailure(f"{path}: missing") from None
    except (OSError, ValueError) as e:
        raise ImportFailure(f"{path}: cannot be read as JSON: {e}") from None
    if not isinstance(value, dict):
        raise ImportFailure(f"{path}: expected a JSON object")
    return value


def check_model_index(src: str) -> str:
    """The qpool kind of the pipeline at `src`; ImportFailure naming the file and field of
    anything else."""
    path = os.path.join(src, "model_index.json")
    index = _read_json(path)
    cls = index.get("_class_name")
    if cls not in PIPELINE_CLASSES:
        raise ImportFailure(f"{path}: field '_class_name' is {cls!r}; qpool imports "
                            f"{', '.join(sorted(PIPELINE_CLASSES))}")
    for name, (library, class_name) in SD_COMPONENTS.items():
        entry = index.get(name)
        if not isinstance(entry, list) or len(entry) != 2:
            raise ImportFailure(f"{path}: field '{name}' is {entry!r}; expected "
                                f"[\"{library}\", \"{class_name}\"]")
        if entry[1] != class_name:
            raise ImportFailure(f"{path}: field '{name}' names class {entry[1]!r}; qpool imports "
                                f"{class_name}")
        if not os.path.isdir(os.path.join(src, name)):
            raise ImportFailure(f"{os.path.join(src, name)}: missing (model_index.json lists "
                                f"component '{name}')")
    return PIPELINE_CLASSES[cls]


def _load(what: str, loader: Callable[[], torch.nn.Module]) -> torch.nn.Module:
    """Runs a diffusers / transformers loader, turning its errors into ImportFailure naming the
    component folder."""
    try:
        module = loader()
    except ImportFailure:
        raise
    except Exception as e:  # noqa: BLE001 - the libraries raise many types; all mean "cannot load"
        message = str(e).strip().splitlines()
        raise ImportFailure(f"{what}: cannot be loaded: {type(e).__name__}: "
                            f"{message[0] if message else ''}") from None
    return module.eval().float()


def _load_strict(mirror: torch.nn.Module, state: Dict[str, torch.Tensor], where: str) -> None:
    """Loads `state` into `mirror`; every tensor must match, but for the buffers qpool's modules
    compute themselves (the timestep frequencies, which diffusers computes in forward)."""
    own = mirror.state_dict()
    state = dict(state)
    for key in own:
        if key.endswith("time_proj.freqs") and key not in state:
            state[key] = own[key]
    result = mirror.load_state_dict(state, strict=False)
    missing, unexpected = list(result.missing_keys), list(result.unexpected_keys)
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing {', '.join(missing[:5])}" + (" ..." if len(missing) > 5 else ""))
        if unexpected:
            parts.append(f"unexpected {', '.join(unexpected[:5])}"
                         + (" ..." if len(unexpected) > 5 else ""))
        raise ImportFailure(f"{where}: the weights do not match the architecture its config "
                            f"describes: {'; '.join(parts)}")


def _check_same(what: str, want: torch.Tensor, got: torch.Tensor) -> float:
    if got.shape != want.shape:
        raise ImportFailure(f"{what}: qpool's module gives shape {tuple(got.shape)}, diffusers "
                            f"{tuple(want.shape)}")
    diff = (got - want).abs().max().item()
    scale = want.abs().max().item()
    if not diff <= 1e-4 * (1.0 + scale):
        raise ImportFailure(f"{what}: qpool's module differs from the original by {diff:g} "
                            f"(output scale {scale:g}); this architecture is not supported")
    return diff


@dataclass
class Built:
    """One component ready to trace: qpool's module, example inputs for the trace and for the
    second-shape check, what the checks found, and the layers a bitsandbytes checkpoint had
    quantized (installed after the checks, which run on their dequantized weights)."""
    name: str
    module: torch.nn.Module
    trace_inputs: Tuple[torch.Tensor, ...]
    check_inputs: Tuple[torch.Tensor, ...]
    max_diff: float
    prequantized: Dict[str, object] = field(default_factory=dict)


def _load_original(where: str, from_pretrained: Callable[[], torch.nn.Module],
                   from_config: Callable[[Dict[str, object]], torch.nn.Module]
                   ) -> Tuple[torch.nn.Module, Dict[str, object]]:
    """The component as diffusers / transformers build it, and the layers of a bitsandbytes
    checkpoint converted to qpool's formats (Note [bitsandbytes checkpoints] in bnb_import.py):
    then the component is built from its config and gets the dequantized weights, so that the
    checks compare float math with float math."""
    config = _read_json(os.path.join(where, "config.json"))
    if not bnb_import.is_bnb_config(config):
        return _load(where, from_pretrained), {}
    floats, layers = bnb_import.convert(bnb_import.read_state_dict(where), where)
    plain = {k: v for k, v in config.items() if k != "quantization_config"}
    original = _load(where, lambda: from_config(plain))
    own = set(original.state_dict())
    if not set(floats) <= own:  # transformers 4 checkpoints name CLIP's tensors text_model.*
        floats = {k[len("text_model."):] if k.startswith("text_model.") else k: v
                  for k, v in floats.items()}
        layers = {k[len("text_model."):] if k.startswith("text_model.") else k: v
                  for k, v in layers.items()}
    floats = {k: v for k, v in floats.items() if k in own or not k.endswith("position_ids")}
    _load_strict(original, floats, where)
    return original.eval().float(), layers


def build_text_encoder(src: str, max_length: int, clip_skip: int, gen: torch.Generator,
                       variant: Optional[str] = None) -> Built:
    from transformers import CLIPTextConfig, CLIPTextModel

    where = os.path.join(src, "text_encoder")
    original, prequantized = _load_original(
        where, lambda: CLIPTextModel.from_pretrained(where, variant=variant),
        lambda c: CLIPTextModel(CLIPTextConfig.from_dict(c)))
    cfg = ClipTextConfig.from_transformers(original.config.to_dict(),
                                           os.path.join(where, "config.json"))
    if max_length > cfg.max_position_embeddings:
        raise ImportFailure(f"{src}/tokenizer: model_max_length {max_length} exceeds the text "
                            f"encoder's max_position_embeddings {cfg.max_position_embeddings}")
    mirror = ClipTextEncoder(cfg, skip=clip_skip)
    state = {}
    for key, value in original.state_dict().items():
        key = key[len("text_model."):] if key.startswith("text_model.") else key
        if key == "embeddings.position_ids":
            continue
        state[key] = value
    _load_strict(mirror, state, where)
    ids = torch.randint(0, cfg.vocab_size, (2, max_length), generator=gen)
    with torch.no_grad():
        out = original(ids, output_hidden_states=clip_skip > 0)
        final_norm = getattr(original, "text_model", original).final_layer_norm
        want = (out.last_hidden_state if clip_skip == 0 else
                final_norm(out.hidden_states[-(clip_skip + 1)]))
        diff = _check_same(where, want, mirror(ids))
    # Layers past the skipped ones never run: drop their weights.
    del mirror.encoder.layers[len(mirror.encoder.layers) - clip_skip:]
    mirror.skip = 0
    second = (torch.randint(0, cfg.vocab_size, (3, max_length), generator=gen),)
    return Built("text_encoder", mirror, (ids,), second, diff, prequantized)


def build_unet(src: str, context: Tuple[int, int], gen: torch.Generator,
               variant: Optional[str] = None) -> Built:
    from diffusers import UNet2DConditionModel

    where = os.path.join(src, "unet")
    original, prequantized = _load_original(
        where, lambda: UNet2DConditionModel.from_pretrained(where, variant=variant),
        UNet2DConditionModel.from_config)
    cfg = SdUNetConfig.from_diffusers(dict(original.config), os.path.join(where, "config.json"))
    mirror = SdUNet(cfg)
    _load_strict(mirror, original.state_dict(), where)
    length, width = context
    if width != cfg.cross_attention_dim:
        raise ImportFailure(f"{where}/config.json: field 'cross_attention_dim' is "
                            f"{cfg.cross_attention_dim}; the text encoder gives {width}")
    levels = 2 ** (len(cfg.block_out_channels) - 1)

    def inputs(batch: int, h: int, w: int) -> Tuple[torch.Tensor, ...]:
        return (torch.randn(batch, cfg.in_channels, h, w, generator=gen),
                torch.randint(0, 1000, (batch,), generator=gen).float(),
                torch.randn(batch, length, width, generator=gen))

    # A latent that is not a multiple of the UNet's downscale: the upsamplers then take their
    # skip's size, which covers every size (Note [Shapes are not baked] in tracing.py).
    side = levels * 2 + 1
    trace_inputs = inputs(2, side, side + levels)
    with torch.no_grad():
        diff = _check_same(where, original(*trace_inputs).sample, mirror(*trace_inputs))
        even = inputs(1, levels * 2, levels * 2)
        diff = max(diff, _check_same(where, original(*even).sample, mirror(*even)))
    return Built("unet", mirror, trace_inputs, inputs(1, levels * 3, levels * 2 + 3), diff,
                 prequantized)


def build_vae_decoder(src: str, gen: torch.Generator,
                      variant: Optional[str] = None) -> Tuple[Built, SdVaeConfig]:
    from diffusers import AutoencoderKL

    where = os.path.join(src, "vae")
    original, prequantized = _load_original(
        where, lambda: AutoencoderKL.from_pretrained(where, variant=variant),
        AutoencoderKL.from_config)
    cfg = SdVaeConfig.from_diffusers(dict(original.config), os.path.join(where, "config.json"))
    if cfg.shift_factor != 0.0:
        raise ImportFailure(f"{where}/config.json: field 'shift_factor' is {cfg.shift_factor}; "
                            f"kind sd imports VAEs without one")
    mirror = SdVaeDecoder(cfg)
    state = {k: v for k, v in original.state_dict().items()
             if k.startswith("decoder.") or k.startswith("post_quant_conv.")}
    _load_strict(mirror, state, where)
    z = torch.randn(1, cfg.latent_channels, 6, 5, generator=gen)
    with torch.no_grad():
        diff = _check_same(where, original.decode(z).sample, mirror(z))
    second = (torch.randn(2, cfg.latent_channels, 4, 7, generator=gen),)
    layers = {k: v for k, v in prequantized.items() if k.startswith("decoder.")
              or k.startswith("post_quant_conv.")}
    return Built("vae_decoder", mirror, (z,), second, diff, layers), cfg


def _quantize(built: Built, opts: ImportOptions) -> int:
    fmt = opts.quantize.get(built.name, "none")
    if fmt == "none":
        return 0
    from . import quant

    return quant.quantize_module(built.module, fmt, blocksize=opts.blocksize,
                                 double_quant=opts.double_quant, prequantize=True)


def _to_dtype(traced: torch.jit.ScriptModule, dtype: torch.dtype) -> None:
    """Floating weights and buffers to `dtype`; the quant state (absmax, code, ...) of quantized
    layers keeps float32, as the server expects."""
    from .quant import STATE_NAMES

    for name, t in list(traced.named_parameters()) + list(traced.named_buffers()):
        if name.rpartition(".")[2] in STATE_NAMES:
            continue
        if t.dtype == torch.float32 and dtype != torch.float32:
            t.data = t.data.to(dtype)


def _save(built: Built, opts: ImportOptions, stage: str) -> Dict[str, object]:
    converted = bnb_import.install(built.module, built.prequantized, built.name)
    quantized = _quantize(built, opts) + converted
    traced = tracing.trace(built.module, built.trace_inputs)
    tracing.check_no_tensor_constants(built.name, traced)
    tracing.check_matches_eager(built.name, built.module, traced, built.check_inputs)
    _to_dtype(traced, DTYPES[opts.dtype])
    path = os.path.join(stage, f"{built.name}.pt")
    with tracing.quiet_torchscript():
        torch.jit.save(traced, path)
    formats = sorted({q["format"] for q in built.prequantized.values()})
    return {"name": built.name, "params": sum(p.numel() for p in traced.parameters()),
            "bytes": _tensor_bytes(traced), "quantized_layers": quantized,
            "converted_layers": converted, "converted_formats": formats,
            "max_diff": built.max_diff}


def _write_bpe_files(tokenizer_json: str, dest: str) -> None:
    """vocab.json and merges.txt from a fast tokenizer's tokenizer.json (a BPE model)."""
    model = _read_json(tokenizer_json).get("model")
    if not isinstance(model, dict) or model.get("type") != "BPE":
        raise ImportFailure(f"{tokenizer_json}: field 'model.type' is "
                            f"{model.get('type') if isinstance(model, dict) else None!r}; "
                            f"qpool's CLIP tokenizer reads a BPE model")
    vocab, merges = model.get("vocab"), model.get("merges")
    if not isinstance(vocab, dict) or not isinstance(merges, list):
        raise ImportFailure(f"{tokenizer_json}: fields 'model.vocab' and 'model.merges' are "
                            f"required")
    with open(os.path.join(dest, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    with open(os.path.join(dest, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n")
        for merge in merges:
            f.write((merge if isinstance(merge, str) else " ".join(merge)) + "\n")


def _copy_tokenizer(src: str, stage: str) -> Tuple[int, str]:
    """Writes stage/tokenizer/{vocab.json,merges.txt}: copied, or converted from tokenizer.json;
    returns the tokens per prompt (tokenizer_config.json's model_max_length, else 77) and the
    pad token."""
    folder = os.path.join(src, "tokenizer")
    dest = os.path.join(stage, "tokenizer")
    os.makedirs(dest)
    files = [os.path.join(folder, n) for n in ("vocab.json", "merges.txt")]
    if all(os.path.isfile(f) for f in files):
        for f in files:
            shutil.copyfile(f, os.path.join(dest, os.path.basename(f)))
    elif os.path.isfile(os.path.join(folder, "tokenizer.json")):
        _write_bpe_files(os.path.join(folder, "tokenizer.json"), dest)
    else:
        raise ImportFailure(f"{folder}: holds neither vocab.json and merges.txt nor "
                            f"tokenizer.json")
    config_path = os.path.join(folder, "tokenizer_config.json")
    config = _read_json(config_path) if os.path.isfile(config_path) else {}
    pad = config.get("pad_token") or "<|endoftext|>"
    pad = pad.get("content") if isinstance(pad, dict) else pad
    vocab = _read_json(os.path.join(dest, "vocab.json"))
    if not isinstance(pad, str) or pad not in vocab:
        raise ImportFailure(f"{config_path}: field 'pad_token' is {pad!r}, which the vocabulary "
                            f"does not hold")
    length = config.get("model_max_length", 77)
    length = length if isinstance(length, int) and 2 <= length <= 1024 else 77
    return length, pad


def build_manifest(kind: str, scheduler: Dict[str, object], sampler: str, unet: SdUNetConfig,
                   vae: SdVaeConfig, max_length: int, pad_token: str,
                   quant: Dict[str, Dict[str, object]]) -> Dict[str, object]:
    size = unet.sample_size * vae.downscale
    components: Dict[str, object] = {}
    for name in QUANT_COMPONENTS:
        entry: Dict[str, object] = {"file": f"{name}.pt"}
        if name in quant:
            entry["quantization"] = quant[name]
        components[name] = entry
    limit = max(1024, 2 * size)
    return {
        "kind": kind,
        "components": components,
        "tokenizer": {"vocab": "tokenizer/vocab.json", "merges": "tokenizer/merges.txt",
                      "max_length": max_length, "pad_token": pad_token},
        "scheduler": scheduler,
        "latent": {"channels": unet.in_channels, "downscale": vae.downscale,
                   "scaling_factor": vae.scaling_factor},
        "defaults": {"steps": 30, "guidance_scale": 7.5, "width": size, "height": size,
                     "scheduler": sampler},
        "limits": {"max_width": limit, "max_height": limit},
        "placement": {"device": "auto", "dtype": "auto"},
    }


def import_pipeline(opts: ImportOptions) -> Dict[str, object]:
    """Writes opts.out from opts.src; raises ImportFailure / tracing.ExportError / OSError."""
    start = time.monotonic()
    src = os.path.abspath(opts.src)
    out = os.path.abspath(opts.out)
    validate_name(os.path.basename(out))
    if opts.dtype not in DTYPES:
        raise ImportFailure(f"--dtype {opts.dtype!r}: choose from float32, float16, bfloat16")
    if not os.path.isdir(src):
        raise ImportFailure(f"{src}: not a directory")
    if os.path.isfile(out) or (os.path.isdir(out) and os.listdir(out) and
                               not os.path.exists(os.path.join(out, "pipeline.yaml"))):
        raise ImportFailure(f"{out} exists and is not a pipeline folder; refusing to replace it")
    kind = check_model_index(src)
    sched_path = os.path.join(src, "scheduler", "scheduler_config.json")
    scheduler, sampler = scheduler_import.translate(_read_json(sched_path), sched_path)

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a folder on disk; never the network
    stage = _make_stage(out)
    try:
        gen = torch.Generator().manual_seed(0)
        max_length, pad_token = _copy_tokenizer(src, stage)
        reports: List[Dict[str, object]] = []
        text = build_text_encoder(src, max_length, opts.clip_skip, gen, opts.variant)
        hidden = text.module.config.hidden_size
        reports.append(_save(text, opts, stage))
        del text
        unet = build_unet(src, (max_length, hidden), gen, opts.variant)
        unet_cfg = unet.module.config
        reports.append(_save(unet, opts, stage))
        del unet
        vae, vae_cfg = build_vae_decoder(src, gen, opts.variant)
        if vae_cfg.latent_channels != unet_cfg.in_channels:
            raise ImportFailure(f"{src}/vae/config.json: field 'latent_channels' is "
                                f"{vae_cfg.latent_channels}; the UNet takes "
                                f"{unet_cfg.in_channels} channels")
        reports.append(_save(vae, opts, stage))
        quant = {c: manifest_io.quantization_section(f, opts.blocksize, opts.double_quant)
                 for c, f in opts.quantize.items() if f != "none"}
        for r in reports:  # bitsandbytes checkpoints: the format their bytes were converted to
            if r["converted_formats"] and r["name"] not in quant:
                quant[r["name"]] = {"format": r["converted_formats"][0]}
        manifest = build_manifest(kind, scheduler, sampler, unet_cfg, vae_cfg, max_length,
                                  pad_token, quant)
        import diffusers
        import transformers

        header = (f"imported by qpool_export from-diffusers from {src}\n"
                  f"(diffusers {diffusers.__version__}, transformers {transformers.__version__}; "
                  f"dtype {opts.dtype}"
                  + (f", quantized {', '.join(f'{c}={f}' for c, f in opts.quantize.items())}"
                     if opts.quantize else "") + ")")
        with open(os.path.join(stage, "pipeline.yaml"), "w", encoding="utf-8") as f:
            f.write(manifest_io.dump_manifest(manifest, header))
        _install(stage, out)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return {"out": out, "components": reports, "seconds": time.monotonic() - start}


def _parse_quantize(text: str, parser: argparse.ArgumentParser) -> Dict[str, str]:
    out: Dict[str, str] = {}
    for item in (s.strip() for s in text.split(",") if s.strip()):
        name, _, fmt = item.partition("=")
        if name not in QUANT_COMPONENTS or fmt not in ("none", "int8", "nf4"):
            parser.error(f"--quantize: '{item}' is not COMPONENT=FORMAT with COMPONENT one of "
                         f"{', '.join(QUANT_COMPONENTS)} and FORMAT one of none, int8, nf4")
        out[name] = fmt
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m qpool_export from-diffusers",
        description="Import a diffusers-format Stable Diffusion 1.x / 2.x folder as a qpool "
                    "pipeline folder (docs/model-repository.md, 'Importing diffusers models').")
    p.add_argument("src", help="the diffusers folder (model_index.json, unet/, vae/, ...)")
    p.add_argument("--out", required=True, help="pipeline folder to write (REPO/NAME)")
    p.add_argument("--dtype", default="float16", choices=sorted(DTYPES),
                   help="dtype of the saved weights (default float16)")
    p.add_argument("--quantize", default="",
                   help="components to quantize, e.g. unet=nf4,text_encoder=int8")
    p.add_argument("--blocksize", type=int, default=64, help="nf4 block size (default 64)")
    p.add_argument("--double-quant", action="store_true", help="nf4: 8-bit absmax of absmax")
    p.add_argument("--clip-skip", type=int, default=0,
                   help="use the text encoder's layer -(N+1) (with its final layer norm), as "
                        "diffusers' clip_skip (default 0: the last layer)")
    p.add_argument("--variant", default=None,
                   help="weight files of this variant, e.g. fp16 (diffusion_pytorch_model.fp16."
                        "safetensors)")
    p.add_argument("-q", "--quiet", action="store_true", help="no per-component summary")
    a = p.parse_args(argv)
    opts = ImportOptions(src=a.src, out=a.out, dtype=a.dtype,
                         quantize=_parse_quantize(a.quantize, p), blocksize=a.blocksize,
                         double_quant=a.double_quant, clip_skip=a.clip_skip, variant=a.variant,
                         verbose=not a.quiet)
    try:
        result = import_pipeline(opts)
    except (ValueError, tracing.ExportError, OSError) as e:  # ImportFailure is a ValueError
        print(f"qpool_export from-diffusers: error: {e}", file=sys.stderr)
        return 1
    if opts.verbose:
        for r in result["components"]:
            extra = f"  ({r['quantized_layers']} layers quantized)" if r["quantized_layers"] else ""
            if r["converted_layers"]:
                extra += (f"  ({r['converted_layers']} bitsandbytes layers converted to "
                          f"{'/'.join(r['converted_formats'])})")
            print(f"{r['name']:<13} params {r['params']:>13,}  bytes {r['bytes']:>15,}  "
                  f"max diff vs diffusers {r['max_diff']:.2g}{extra}", flush=True)
        print(f"wrote {result['out']} in {result['seconds']:.1f} s", flush=True)
    return 0
