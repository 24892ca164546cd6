"""Imports a single-file checkpoint, as AUTOMATIC1111, ComfyUI and civitai distribute them: a
Stable Diffusion 1.x, 2.x or SDXL `.safetensors` in the original layout (UNet, VAE and text
encoders in one file), or a FLUX.1 transformer (Black Forest Labs' layout, in bfloat16, float16
or ComfyUI's float8_e4m3fn, scaled or not) with its CLIP-L, T5-XXL and VAE in files of their own
or in the same file (ComfyUI's full checkpoints). The family is found from the file's tensor
names (detect); the configs a file does not carry come from the family's reference folder
(single_file_configs.py) or from `--config DIR`; the tokenizers, which no checkpoint holds, from
`--config DIR` or `--tokenizers DIR`. The import then runs as from-diffusers' streaming import
does (from_diffusers.import_pipeline), each component reading its part of the file through its
layout (Note [Single-file layouts] in single_file_layouts.py), block by block.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from . import single_file_configs as configs
from . import single_file_layouts as layouts
from .import_error import ImportFailure
from .import_steps import ImportOptions
from .weights_file import SafetensorsReader, WeightsFileError

# The tensors of the original SD layout that no component reads: the training schedule's
# buffers, EMA copies and markers some tools add.
_LDM_IGNORED = ("betas", "alphas_cumprod", "alphas_cumprod_prev", "sqrt_alphas_cumprod",
                "sqrt_one_minus_alphas_cumprod", "log_one_minus_alphas_cumprod",
                "sqrt_recip_alphas_cumprod", "sqrt_recipm1_alphas_cumprod",
                "posterior_variance", "posterior_log_variance_clipped", "posterior_mean_coef1",
                "posterior_mean_coef2", "logvar", "v_pred", "ztsnr", "scaled_fp8")
_IGNORED_PREFIXES = ("model_ema.", "denoiser.")
_UNET = "model.diffusion_model."
_VAE_PREFIXES = ("first_stage_model.", "vae.")
_CLIP_L_PREFIXES = ("cond_stage_model.transformer.", "conditioner.embedders.0.transformer.",
                    "text_encoders.clip_l.transformer.")
_T5_PREFIXES = ("text_encoders.t5xxl.transformer.",)
_FLUX_PREFIXES = (_UNET, "")
_LORA_MARKS = ("lora_up.", "lora_down.", ".lora_A.", ".lora_B.", "lora_unet_", "lora_te")
# bitsandbytes' serialized quant state (Forge's NF4 files).
_BNB_MARKS = (".quant_state.bitsandbytes__nf4", ".quant_state.bitsandbytes__fp4")


@dataclass
class SingleFileOptions:
    checkpoint: str
    out: str
    family: Optional[str] = None  # sd1 | sd2 | sdxl | flux-dev | flux-schnell; None: detected
    config: Optional[str] = None  # a diffusers folder whose configs, tokenizers, scheduler serve
    tokenizers: Optional[str] = None  # a folder with tokenizer/ (and tokenizer_2/)
    clip_l: Optional[str] = None
    t5: Optional[str] = None
    vae: Optional[str] = None
    prediction_type: Optional[str] = None  # epsilon | v_prediction (SD 2.x: v_prediction)
    # The rest of from-diffusers' options (dtype, quantization, block size, device).
    imports: ImportOptions = field(default_factory=lambda: ImportOptions(src="", out=""))


def _open(path: str, what: str) -> SafetensorsReader:
    if not os.path.isfile(path):
        raise ImportFailure(f"{path}: the {what} file is missing")
    try:
        return SafetensorsReader(path)
    except (OSError, WeightsFileError) as e:
        raise ImportFailure(f"{path}: cannot be read as safetensors: {e}") from None


def _prefix_of(reader: SafetensorsReader, prefixes: Sequence[str], probe: str) -> Optional[str]:
    return next((p for p in prefixes if p + probe in reader.keys()), None)


def detect(reader: SafetensorsReader) -> Tuple[str, str]:
    """The family of a checkpoint (single_file_configs.FAMILIES) and what was found, in words;
    ImportFailure for a LoRA, another architecture or a file of no known layout."""
    keys = reader.keys()
    names = set(keys)
    if any(mark in k for k in keys[:200] for mark in _LORA_MARKS):
        raise ImportFailure(f"{reader.path}: a LoRA adapter (tensors such as "
                            f"'{next(k for k in keys if any(m in k for m in _LORA_MARKS))}'), "
                            f"not a checkpoint: it is fused into a base model with "
                            f"from-diffusers --lora")
    if any(k.endswith(_BNB_MARKS) for k in keys):
        raise ImportFailure(f"{reader.path}: a bitsandbytes-quantized checkpoint (tensors such as "
                            f"'{next(k for k in keys if k.endswith(_BNB_MARKS))}'); qpool "
                            f"imports single files in float16, bfloat16, float32 or "
                            f"float8_e4m3fn: import the unquantized file with --quantize "
                            f"transformer=nf4 (the same format, quantized by qpool)")
    if "ztsnr" in names:
        raise ImportFailure(f"{reader.path}: trained with zero terminal SNR (its 'ztsnr' "
                            f"tensor), a schedule qpool's samplers do not compute "
                            f"(diffusers' rescale_betas_zero_snr)")
    flux = _prefix_of(reader, _FLUX_PREFIXES, "double_blocks.0.img_attn.qkv.weight")
    if flux is not None:
        dev = flux + "guidance_in.in_layer.weight" in names
        return ("flux-dev" if dev else "flux-schnell"), \
            f"a FLUX.1 [{'dev' if dev else 'schnell'}] transformer"
    conv_in = _UNET + "input_blocks.0.0.weight"
    if conv_in in names:
        channels = reader.shape(conv_in)[1]
        if channels != 4:
            raise ImportFailure(f"{reader.path}: a UNet of {channels} input channels (an "
                                f"inpainting or image-conditioned model); qpool imports "
                                f"text-to-image UNets of 4")
        if "conditioner.embedders.1.model.ln_final.weight" in names:
            return "sdxl", "a Stable Diffusion XL base checkpoint"
        if "conditioner.embedders.0.model.ln_final.weight" in names:
            raise ImportFailure(f"{reader.path}: an SDXL refiner (one OpenCLIP text encoder); "
                                f"qpool imports SDXL base checkpoints")
        if "cond_stage_model.model.ln_final.weight" in names:
            return "sd2", "a Stable Diffusion 2.x checkpoint"
        if any(k.startswith("cond_stage_model.transformer.") for k in keys):
            return "sd1", "a Stable Diffusion 1.x checkpoint"
    raise ImportFailure(f"{reader.path}: no architecture qpool knows (SD 1.x, SD 2.x, SDXL, "
                        f"FLUX.1); its first tensors: {', '.join(keys[:layouts.SHOWN])}")


def _scales(reader: SafetensorsReader) -> Dict[str, str]:
    """weight -> its scale_weight, in ComfyUI's scaled fp8 files."""
    return {k[:-len("scale_weight")] + "weight": k for k in reader.keys()
            if k.endswith(".scale_weight")}


def _check_rest(reader: SafetensorsReader, claimed: Sequence[str]) -> None:
    """ImportFailure naming the first tensors of the checkpoint outside every component's part
    (Note [Single-file layouts])."""
    left = [k for k in reader.keys()
            if not k.startswith(tuple(claimed)) and k not in _LDM_IGNORED
            and not k.startswith(_IGNORED_PREFIXES) and not k.endswith((".scale_input",
                                                                         ".scale_weight"))]
    if left:
        raise ImportFailure(f"{reader.path}: {len(left)} tensor(s) that belong to no component "
                            f"qpool imports, the first: {', '.join(left[:layouts.SHOWN])}")


def _configs(opts: SingleFileOptions, name: str, marked_v: bool = False
             ) -> Dict[str, Dict[str, object]]:
    """The family's configs, or those of the --config folder; `marked_v`: the file says it
    predicts v (its 'v_pred' tensor, as ComfyUI marks such files), unless --prediction-type
    says otherwise."""
    found = configs.family(name)
    if marked_v and opts.prediction_type is None:
        opts = dataclasses.replace(opts, prediction_type="v_prediction")
    if opts.config is None:
        if opts.prediction_type is not None:
            found["scheduler"]["prediction_type"] = opts.prediction_type
            if name == "sd2" and opts.prediction_type == "epsilon":  # SD 2.x base: 512 images
                found["unet"]["sample_size"] = 64
                found["vae"]["sample_size"] = 512
        return found
    from .diffusers_components import read_json

    out: Dict[str, Dict[str, object]] = {"model_index": read_json(
        os.path.join(opts.config, "model_index.json"))}
    for part in found:
        if part == "model_index":
            continue
        file = "scheduler_config.json" if part == "scheduler" else "config.json"
        out[part] = read_json(os.path.join(opts.config, part, file))
    if opts.prediction_type is not None:
        out["scheduler"]["prediction_type"] = opts.prediction_type
    want = found["model_index"]["_class_name"]
    if out["model_index"].get("_class_name") != want:
        raise ImportFailure(f"{opts.config}/model_index.json: field '_class_name' is "
                            f"{out['model_index'].get('_class_name')!r}; the checkpoint is a "
                            f"{want} one")
    return out


def _tokenizer_folders(opts: SingleFileOptions, found: Dict[str, Dict[str, object]]
                       ) -> Dict[str, str]:
    """tokenizer name -> the folder it is copied from: --config's or --tokenizers' subfolders;
    ImportFailure saying where to find them otherwise."""
    names = [n for n in found["model_index"] if n.startswith("tokenizer")]
    root = opts.tokenizers or opts.config
    if root is None:
        raise ImportFailure(
            f"{opts.checkpoint}: a checkpoint holds no tokenizer; give --tokenizers DIR, a "
            f"folder with {' and '.join(n + '/' for n in names)} as the model's diffusers "
            f"repository has them (vocab.json and merges.txt, or tokenizer.json), or --config "
            f"DIR, a diffusers folder of the same model")
    folders = {n: os.path.join(root, n) for n in names}
    for n, folder in folders.items():
        if not os.path.isdir(folder):
            raise ImportFailure(f"{folder}: missing (the {n} of a "
                                f"{found['model_index']['_class_name']})")
    return folders


def _stage_source(found: Dict[str, Dict[str, object]], tokenizers: Dict[str, str],
                  where: str) -> None:
    """A diffusers folder without weights: the configs, the scheduler and the tokenizers."""
    with open(os.path.join(where, "model_index.json"), "w", encoding="utf-8") as f:
        json.dump(found["model_index"], f)
    for part, config in found.items():
        if part == "model_index":
            continue
        os.makedirs(os.path.join(where, part))
        file = "scheduler_config.json" if part == "scheduler" else "config.json"
        with open(os.path.join(where, part, file), "w", encoding="utf-8") as f:
            json.dump(config, f)
    for name, folder in tokenizers.items():
        dest = os.path.join(where, name)
        os.makedirs(dest)
        for entry in os.listdir(folder):
            path = os.path.join(folder, entry)
            if os.path.isfile(path) and not os.path.islink(path):
                shutil.copyfile(path, os.path.join(dest, entry))


def _sources(opts: SingleFileOptions, family: str, reader: SafetensorsReader,
             found: Dict[str, Dict[str, object]], opener=None
             ) -> Tuple[Dict[str, object], List[str]]:
    """Component folder -> its tensors (layouts.MappedTensors), and the files read; the
    --clip-l, --t5 and --vae files opened with `opener(path, what)` (default _open)."""
    opener = opener or _open
    sources: Dict[str, object] = {}
    files = [reader.path]
    claimed: List[str] = []

    def part(name: str, file: Optional[str], prefixes: Sequence[str], probe: str,
             make_rule, what: str) -> None:
        source = opener(file, what) if file else reader
        if file:
            files.append(file)
        prefix = _prefix_of(source, tuple(prefixes) + ("",), probe)
        if prefix is None:
            raise ImportFailure(f"{source.path}: no {what} in it (no tensor '{probe}' under "
                                f"{', '.join(repr(p) for p in prefixes if p) or 'any prefix'})"
                                + ("" if file else f"; give it with --{name_flag[name]} FILE"
                                   if name in name_flag else ""))
        if source is reader:
            claimed.append(prefix)
        shapes = lambda k, s=source, p=prefix: s.shape(p + k)  # noqa: E731
        sources[name] = layouts.mapped(source, prefix, make_rule(shapes), _scales(source), what)

    name_flag = {"text_encoder": "clip-l", "text_encoder_2": "t5", "vae": "vae"}
    vae_cfg = found["vae"]
    levels = len(vae_cfg.get("block_out_channels", (0,) * 4))
    vae_probe = "decoder.conv_in.weight"
    if family.startswith("flux"):
        cfg = found["transformer"]
        width = cfg["num_attention_heads"] * cfg["attention_head_dim"]
        part("transformer", None, _FLUX_PREFIXES, "double_blocks.0.img_attn.qkv.weight",
             lambda shapes: layouts.flux_rule(width, shapes), "FLUX transformer")
        part("text_encoder", opts.clip_l, _CLIP_L_PREFIXES, "text_model.final_layer_norm.weight",
             lambda shapes: layouts.clip_rule(), "CLIP-L text encoder")
        part("text_encoder_2", opts.t5, _T5_PREFIXES, "encoder.final_layer_norm.weight",
             lambda shapes: layouts.t5_rule(), "T5 text encoder")
        part("vae", opts.vae, _VAE_PREFIXES, vae_probe,
             lambda shapes: layouts.vae_rule(levels, shapes), "VAE")
    else:
        for flag, value in (("--clip-l", opts.clip_l), ("--t5", opts.t5)):
            if value is not None:
                raise ImportFailure(f"{flag}: a {family} checkpoint holds its text encoders")
        lpb = found["unet"].get("layers_per_block", 2)
        part("unet", None, (_UNET,), "input_blocks.0.0.weight",
             lambda shapes: layouts.unet_rule(lpb), "UNet")
        part("vae", opts.vae, _VAE_PREFIXES, vae_probe,
             lambda shapes: layouts.vae_rule(levels, shapes), "VAE")
        if family == "sd1":
            part("text_encoder", None, _CLIP_L_PREFIXES[:1], "text_model.final_layer_norm.weight",
                 lambda shapes: layouts.clip_rule(), "CLIP text encoder")
        elif family == "sd2":
            cfg = found["text_encoder"]
            part("text_encoder", None, ("cond_stage_model.model.",), "ln_final.weight",
                 lambda shapes: layouts.open_clip_rule(cfg["num_hidden_layers"],
                                                       cfg["hidden_size"], False),
                 "OpenCLIP text encoder")
        else:
            cfg = found["text_encoder_2"]
            part("text_encoder", None, _CLIP_L_PREFIXES[1:2], "text_model.final_layer_norm.weight",
                 lambda shapes: layouts.clip_rule(), "CLIP-L text encoder")
            part("text_encoder_2", None, ("conditioner.embedders.1.model.",), "ln_final.weight",
                 lambda shapes: layouts.open_clip_rule(cfg["num_hidden_layers"],
                                                       cfg["hidden_size"], True),
                 "OpenCLIP text encoder")
    _check_rest(reader, claimed)
    return sources, files


def import_single_file(opts: SingleFileOptions) -> Dict[str, object]:
    """Writes opts.out from the checkpoint; raises ImportFailure / tracing.ExportError /
    OSError, leaving the repository as it was."""
    from .from_diffusers import import_pipeline

    imports = opts.imports
    for flag, on in (("--full-check", imports.full_check), ("--layer-error", imports.layer_error),
                     ("--smoothquant", imports.smoothquant is not None),
                     ("--compile", imports.compile), ("--lora", imports.loras)):
        if on:
            raise ImportFailure(f"{flag}: a single-file import streams every component and "
                                f"takes no {flag} yet; import it, then use from-diffusers on "
                                f"a diffusers folder for it")
    reader = _open(opts.checkpoint, "checkpoint")
    family, found_what = detect(reader)
    if opts.family is not None and opts.family != family:
        raise ImportFailure(f"--family {opts.family}: {opts.checkpoint} is {found_what}")
    dtypes = sorted({str(reader.dtype(k)).replace("torch.", "") for k in reader.keys()
                     if reader.dtype(k).is_floating_point})
    found = _configs(opts, family, "v_pred" in reader.keys())
    tokenizers = _tokenizer_folders(opts, found)
    sources, files = _sources(opts, family, reader, found)
    out_dir = os.path.dirname(os.path.abspath(imports.out))
    os.makedirs(out_dir, exist_ok=True)
    src = tempfile.mkdtemp(prefix=f".{os.path.basename(imports.out)}.single-", dir=out_dir)
    try:
        _stage_source(found, tokenizers, src)
        configs_from = opts.config or f"qpool's defaults for {configs.REFERENCES[family]}"
        origin = (f"imported by qpool_export from-single-file from {', '.join(files)}: "
                  f"{found_what} stored in {'/'.join(dtypes)}\nconfigs and scheduler: "
                  f"{configs_from}; tokenizers: {opts.tokenizers or opts.config}")
        result = import_pipeline(dataclasses.replace(imports, src=src, sources=sources,
                                                     origin=origin))
    finally:
        shutil.rmtree(src, ignore_errors=True)
    result["found"] = f"{found_what} stored in {'/'.join(dtypes)}"
    result["configs"] = configs_from
    return result


def main(argv: Optional[Sequence[str]] = None) -> int:
    """`qpool-export from-single-file CHECKPOINT --out REPO/NAME`."""
    import argparse

    from .from_diffusers_cli import add_import_options, import_options, run

    p = argparse.ArgumentParser(
        prog="qpool-export from-single-file",
        description="Import a single-file checkpoint (AUTOMATIC1111 / ComfyUI / civitai "
                    ".safetensors: SD 1.x, SD 2.x, SDXL; a FLUX.1 transformer with its CLIP-L, "
                    "T5-XXL and VAE files) as a qpool pipeline folder (docs/model-repository.md, "
                    "'Single-file checkpoints').")
    p.add_argument("checkpoint", help="the checkpoint (.safetensors)")
    p.add_argument("--out", required=True, help="pipeline folder to write (REPO/NAME)")
    p.add_argument("--family", choices=sorted(configs.FAMILIES), default=None,
                   help="refuse the file unless it is of this family (default: detected)")
    p.add_argument("--config", metavar="DIR", default=None,
                   help="a diffusers folder of the same model, whose configs, scheduler and "
                        "tokenizers are used (default: those of the family's reference model)")
    p.add_argument("--tokenizers", metavar="DIR", default=None,
                   help="a folder with tokenizer/ (and tokenizer_2/) as the model's diffusers "
                        "repository has them; a checkpoint holds none")
    p.add_argument("--clip-l", metavar="FILE", default=None, help="FLUX: the CLIP-L file")
    p.add_argument("--t5", metavar="FILE", default=None, help="FLUX: the T5-XXL file")
    p.add_argument("--vae", metavar="FILE", default=None,
                   help="a VAE file instead of the checkpoint's (FLUX: ae.safetensors)")
    p.add_argument("--prediction-type", choices=("epsilon", "v_prediction"), default=None,
                   help="what the UNet predicts (default: the family's; SD 2.x: v_prediction, "
                        "as SD 2.1 768; epsilon for SD 2.x base, 512)")
    add_import_options(p)
    a = p.parse_args(argv)
    imports = import_options(a, p, "")
    opts = SingleFileOptions(checkpoint=a.checkpoint, out=a.out, family=a.family,
                             config=a.config, tokenizers=a.tokenizers, clip_l=a.clip_l, t5=a.t5,
                             vae=a.vae, prediction_type=a.prediction_type, imports=imports)
    return run("from-single-file", lambda: import_single_file(opts), imports,
               lambda result: f"found {result['found']}; configs: {result['configs']}")
