"""`python -m qpool_export from-diffusers SRC --out REPO/NAME`: the command line of the
diffusers importer (from_diffusers.py): options, their checks, and the summary it prints."""

from __future__ import annotations

import argparse
import sys
from typing import Callable, Dict, Optional, Sequence

from . import compile as aot
from . import lora_fuse, tracing
from .from_diffusers import DTYPES, QUANT_COMPONENTS, ImportOptions, import_pipeline


def _parse_quantize(text: str, parser: argparse.ArgumentParser) -> Dict[str, str]:
    out: Dict[str, str] = {}
    for item in (s.strip() for s in text.split(",") if s.strip()):
        name, _, fmt = item.partition("=")
        if name not in QUANT_COMPONENTS or fmt not in ("none", "int8", "nf4", "w8a8"):
            parser.error(f"--quantize: '{item}' is not COMPONENT=FORMAT with COMPONENT one of "
                         f"{', '.join(QUANT_COMPONENTS)} and FORMAT one of none, int8, nf4, w8a8")
        out[name] = fmt
    return out


def add_import_options(p: argparse.ArgumentParser) -> None:
    """The options from-diffusers and from-single-file share."""
    p.add_argument("--dtype", default=None, choices=sorted(DTYPES),
                   help="dtype of the saved weights (default float16; bfloat16 for FLUX)")
    p.add_argument("--quantize", default="",
                   help="components to quantize, e.g. unet=nf4,text_encoder=int8 (SDXL: "
                        "text_encoder_2 too; FLUX: transformer and text_encoder_2, T5)")
    p.add_argument("--quant-mode", choices=("prequantized", "load-time"), default="prequantized",
                   help="prequantized: --quantize quantizes the saved weights; load-time: they "
                        "stay float in quantizable layers and the server quantizes them when it "
                        "loads the pipeline (the manifest's format can then be changed without "
                        "importing again)")
    p.add_argument("--layer-error", metavar="FILE",
                   help="write each quantized layer's own error against its float layer, on "
                        "the component's example inputs, as JSON (relative error, cosine), and "
                        "print the worst three per component (--quant-mode prequantized)")
    p.add_argument("--smoothquant", type=float, default=None, metavar="ALPHA",
                   help="w8a8: SmoothQuant scales with this alpha in (0, 1] from the components' "
                        "example inputs (default: none)")
    p.add_argument("--blocksize", type=int, default=64, help="nf4 block size (default 64)")
    p.add_argument("--min-weights", type=int, default=0, metavar="N",
                   help="keep linear layers of fewer than N weights (out x in) in float in the "
                        "quantized components: w8a8 pays only on large layers, e.g. 4194304 "
                        "(docs/quantization.md; default 0: quantize all)")
    p.add_argument("--double-quant", action="store_true", help="nf4: 8-bit absmax of absmax")
    p.add_argument("--clip-skip", type=int, default=0,
                   help="diffusers' clip_skip: SD uses the text encoder's layer -(N+1) "
                        "(with its final layer norm; default 0: the last layer), SDXL layer "
                        "-(N+2) of both encoders (default 0: the penultimate layer)")
    p.add_argument("--variant", default=None,
                   help="weight files of this variant, e.g. fp16 (diffusion_pytorch_model.fp16."
                        "safetensors)")
    p.add_argument("--compile", default="",
                   help="components that also get an ahead-of-time compiled forward, as "
                        "qpool_export --compile writes it (comma separated: text_encoder, unet, "
                        "vae_decoder; FLUX: transformer, vae_decoder; a quantized one only with "
                        "--quant-mode prequantized)")
    p.add_argument("--compile-device", choices=aot.DEVICES, default="cpu",
                   help="device type the packages are compiled for (cuda needs a GPU here)")
    p.add_argument("--compile-mode", choices=aot.MODES, default="default",
                   help="max-autotune: Inductor benchmarks its kernel choices at the compile "
                        "example's sizes; compiling takes several times longer")
    p.add_argument("--compile-attention", choices=aot.ATTENTION, default="auto",
                   help=aot.ATTENTION_HELP)
    p.add_argument("--lora", action="append", default=[], metavar="FILE[:SCALE]",
                   help="a LoRA .safetensors file fused into the weights at SCALE (default 1), "
                        "in any format diffusers' load_lora_weights reads; repeat for several")
    p.add_argument("--text-encoder-4", default=None, metavar="DIR",
                   help="kind hidream: the Llama's folder (config.json, weights, tokenizer.json) "
                        "when the pipeline folder has no text_encoder_4/, as HiDream-I1's")
    p.add_argument("--warmup", action="store_true",
                   help="the manifest's execution.warmup: each replica makes one image at the "
                        "defaults as it loads, so its first request runs at full speed")
    p.add_argument("--full-check", action="store_true",
                   help="load each component whole and check qpool's module against diffusers' "
                        "on the real weights (about twice the largest component in float32 of "
                        "host memory), instead of streaming it block by block")
    p.add_argument("--max-block-mib", type=int, default=1024, metavar="N",
                   help="streamed components are read in blocks of at most N MiB in float32 "
                        "where their modules can be cut (default 1024): the import's host "
                        "memory is about the largest block, quantized and converted")
    p.add_argument("--import-device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="where streamed blocks are converted and quantized (default auto: the "
                        "GPU when there is one, many times faster than the CPU)")
    p.add_argument("-q", "--quiet", action="store_true", help="no per-component summary")


def import_options(a: argparse.Namespace, p: argparse.ArgumentParser, src: str) -> ImportOptions:
    """ImportOptions from the shared options, checked (argparse's errors, exit 2)."""
    try:
        loras = tuple(lora_fuse.parse(text) for text in a.lora)
    except ValueError as e:
        p.error(str(e))
    quantize = _parse_quantize(a.quantize, p)
    if not 1 <= a.max_block_mib <= 1 << 20:
        p.error(f"--max-block-mib must be in [1, 2^20] (got {a.max_block_mib})")
    if a.min_weights < 0 or a.min_weights > 2**31 - 1:
        p.error(f"--min-weights must be in [0, 2^31) (got {a.min_weights})")
    if a.min_weights and not set(quantize.values()) - {"none"}:
        p.error("--min-weights applies to components named by --quantize")
    if a.smoothquant is not None:
        if "w8a8" not in quantize.values() or a.quant_mode != "prequantized":
            p.error("--smoothquant applies to w8a8 components with --quant-mode prequantized")
        if not 0 < a.smoothquant <= 1:
            p.error(f"--smoothquant must be in (0, 1] (got {a.smoothquant})")
    if a.layer_error is not None and (a.quant_mode != "prequantized" or
                                      not set(quantize.values()) - {"none"}):
        p.error("--layer-error needs --quantize with --quant-mode prequantized")
    return ImportOptions(src=src, out=a.out, dtype=a.dtype,
                         quantize=quantize, blocksize=a.blocksize, smoothquant=a.smoothquant,
                         double_quant=a.double_quant, min_weights=a.min_weights,
                         clip_skip=a.clip_skip, variant=a.variant,
                         quant_mode=a.quant_mode, layer_error=a.layer_error,
                         compile=tuple(c.strip() for c in a.compile.split(",") if c.strip()),
                         compile_device=a.compile_device, compile_mode=a.compile_mode,
                         compile_attention=a.compile_attention, loras=loras, warmup=a.warmup,
                         text_encoder_4=a.text_encoder_4, full_check=a.full_check,
                         max_block_mib=a.max_block_mib, import_device=a.import_device,
                         verbose=not a.quiet)


def print_report(result: Dict[str, object], opts: ImportOptions) -> None:
    """The per-component summary of an import."""
    for r in result["components"]:
        extra = f"  ({r['quantized_layers']} layers quantized)" if r["quantized_layers"] else ""
        if r["stays_float"]:
            extra = f"  (stays float: every layer has fewer than {opts.min_weights} weights)"
        if r["converted_layers"]:
            extra += (f"  ({r['converted_layers']} bitsandbytes layers converted to "
                      f"{'/'.join(r['converted_formats'])})")
        if r["compile_seconds"] is not None:
            extra += f"  (compiled for {opts.compile_device} in {r['compile_seconds']:.0f} s)"
        if r["weight_error"] is not None:
            extra += f"  (largest weight error of a quantized layer {r['weight_error']:.2g})"
        checked = (f"streamed (graph {r['graph_seconds']:.0f} s, weights "
                   f"{r['weights_seconds']:.0f} s)") if r["streamed"] else \
            f"max diff vs diffusers {r['max_diff']:.2g}"
        print(f"{r['name']:<14} params {r['params']:>13,}  bytes {r['bytes']:>15,}  "
              f"{checked}{extra}", flush=True)
        if r["layer_errors"]:
            from . import layer_error

            for name in layer_error.worst(r["layer_errors"]):
                e = r["layer_errors"][name]
                print(f"{'':<14} {e['format']} {name}: relative error "
                      f"{e['relative_error']:.3g}, cosine {e['cosine']:.5f}", flush=True)
    if result["lora_components"]:
        print(f"fused {len(opts.loras)} LoRA file(s) into "
              f"{', '.join(result['lora_components'])}", flush=True)
    for note in result["notes"]:
        print(f"note: {note}", flush=True)
    print(f"wrote {result['out']}: {result['bytes'] / 1e9:.2f} GB in {result['seconds']:.1f} s, "
          f"peak host memory {result['peak_rss_bytes'] / 2**30:.2f} GiB", flush=True)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(
        prog="qpool-export from-diffusers",
        description="Import a diffusers-format Stable Diffusion 1.x / 2.x, SDXL or FLUX.1 folder "
                    "as a qpool pipeline folder (docs/model-repository.md, 'Importing diffusers "
                    "models').")
    p.add_argument("src", help="the diffusers folder (model_index.json, unet/, vae/, ...)")
    p.add_argument("--out", required=True, help="pipeline folder to write (REPO/NAME)")
    add_import_options(p)
    a = p.parse_args(argv)
    opts = import_options(a, p, a.src)
    return run("from-diffusers", lambda: import_pipeline(opts), opts)


def run(command: str, do_import: Callable[[], Dict[str, object]], opts: ImportOptions,
        found: Callable[[Dict[str, object]], str] = lambda result: "") -> int:
    """Runs an import: its error on stderr (exit 1), or the report (`found`: a first line)."""
    try:
        result = do_import()
    except (ValueError, tracing.ExportError, OSError) as e:  # ImportFailure is a ValueError
        print(f"qpool_export {command}: error: {e}", file=sys.stderr)
        return 1
    if opts.verbose:
        if found(result):
            print(found(result), flush=True)
        print_report(result, opts)
    return 0
