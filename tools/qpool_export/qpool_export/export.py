"""Command line and export driver: builds a preset's pipeline with seeded random weights,
optionally quantizes it, traces every component and writes a model-repository folder.

Note [Export is all-or-nothing]
Everything is written into a hidden staging folder next to the target (".NAME.partial-PID"; the
server ignores dot-folders) and renamed into place at the end, so a running server never sees a
half-written pipeline and a failed export leaves the previous one intact.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

import torch

from . import bpe, corpus, manifest, tracing
from . import compile as aot
from .blocks import fuse_projections
from .presets import COMPONENTS, DEFAULT_QUANT_SKIP, PRESETS, Preset, count_parameters
from .weights import build_component

MAX_LENGTH = 77
_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
DEFAULT_QUANT_COMPONENTS = ("text_encoder", "unet")


@dataclass
class ExportOptions:
    preset: str
    out: str  # the pipeline folder (its name is the pipeline's name)
    seed: int = 0
    quantize: str = "none"  # none | int8 | nf4 | w8a8
    quant_mode: str = "prequantized"  # prequantized | load-time
    blocksize: int = 64
    double_quant: bool = False
    quant_components: Tuple[str, ...] = DEFAULT_QUANT_COMPONENTS
    skip: Tuple[str, ...] = ()
    min_weights: int = 0  # layers of fewer weights stay float (Note [Small layers stay float])
    smoothquant: Optional[float] = None  # w8a8: SmoothQuant alpha (smoothquant.py), or no scales
    dtype: str = "float32"  # float32 | float16
    verbose: bool = True
    threads: int = 0  # torch intra-op threads while exporting; 0 = leave torch's default
    # Components that also get an AOTInductor package (Note [Compiled forward]), and its device.
    compile: Tuple[str, ...] = ()
    compile_device: str = "cpu"
    compile_mode: str = "default"  # compile.MODES
    compile_attention: str = "auto"  # compile.ATTENTION


@dataclass
class ComponentReport:
    name: str
    params: int
    tensor_bytes: int
    file: str
    quantized_layers: int = 0
    max_trace_diff: float = 0.0
    compiled: str = ""  # the package's path, when compiled
    compile_seconds: float = 0.0
    stays_float: bool = False  # to quantize, but every layer is below min_weights


@dataclass
class ExportResult:
    out: str
    vocab_size: int
    num_merges: int
    components: List[ComponentReport] = field(default_factory=list)
    seconds: float = 0.0


def validate_name(name: str) -> None:
    if not _NAME_RE.match(name) or name.startswith("."):
        raise ValueError(f"'{name}' is not a valid pipeline name (letters, digits, '.', '_', '-'; "
                         f"at most 64 characters; not starting with '.')")


def example_inputs(preset: Preset, component: str, batch: int, h: int, w: int, vocab: int,
                   gen: torch.Generator) -> Tuple[torch.Tensor, ...]:
    """Inputs of the documented dtypes and shapes for one component."""
    if component == "text_encoder":
        return (torch.randint(0, vocab, (batch, MAX_LENGTH), generator=gen, dtype=torch.long),)
    c = preset.unet.in_channels
    latents = torch.randn(batch, c, h, w, generator=gen)
    if component == "unet":
        timestep = torch.randint(0, 1000, (batch,), generator=gen).float()
        context = torch.randn(batch, MAX_LENGTH, preset.text_encoder.hidden_size, generator=gen)
        return (latents, timestep, context)
    return (latents,)


def _quantize(module: torch.nn.Module, opts: ExportOptions,
              calibration: Sequence[Tuple[torch.Tensor, ...]] = ()) -> int:
    try:
        from . import quant  # written separately; registers torch.ops.qpool.quant_linear
    except ImportError as e:
        raise ValueError(f"--quantize {opts.quantize} needs qpool_export/quant.py, which could not "
                         f"be imported: {e}") from e
    smooth = None
    if opts.smoothquant is not None:
        from . import smoothquant
        smooth = smoothquant.fold(module,
                                  smoothquant.calibrate(module, calibration, opts.smoothquant))
    count = quant.quantize_module(module, opts.quantize, blocksize=opts.blocksize,
                                  double_quant=opts.double_quant, skip=list(opts.skip),
                                  prequantize=opts.quant_mode == "prequantized", smooth=smooth,
                                  min_weights=opts.min_weights)
    if opts.quantize == "w8a8" and opts.quant_mode == "prequantized":
        quant.fuse_geglu_linears(module)  # Note [GEGLU linear op]
        quant.fuse_norm_linears(module)  # Note [Norm linear op]
    return count


def _to_half(traced: torch.jit.ScriptModule, quant_modules: Sequence[str]) -> None:
    """Converts fp32 parameters and buffers to fp16 in place, except the quant state of quantized
    layers (absmax, code, ...: their weight and bias, and a NormQuantLinear's norm_weight and
    norm_bias, follow --dtype) and the frequency tables (FLOAT32_BUFFERS)."""
    from .quant import FLOAT32_BUFFERS, STATE_NAMES

    quant = set(quant_modules)
    for name, t in list(traced.named_parameters()) + list(traced.named_buffers()):
        owner, _, leaf = name.rpartition(".")
        if (owner in quant and leaf in STATE_NAMES) or leaf in FLOAT32_BUFFERS:
            continue
        if t.dtype == torch.float32:
            t.data = t.data.half()


def export_component(preset: Preset, component: str, opts: ExportOptions, folder: str,
                     vocab: int) -> ComponentReport:
    module = build_component(preset, component, opts.seed)
    fuse_projections(module)  # Note [Fused projections]
    quantized = 0
    if opts.quantize != "none" and component in opts.quant_components:
        calibration = []
        if opts.smoothquant is not None:  # 4 batches of random prompts (token ids) or latents
            gen = torch.Generator().manual_seed(opts.seed + 1)
            side = preset.trace_latent
            calibration = [example_inputs(preset, component, 2, side, side, vocab, gen)
                           for _ in range(4)]
        quantized = _quantize(module, opts, calibration)
    keep = [n for n, m in module.named_modules() if type(m).__module__.endswith(".quant")]

    gen = torch.Generator().manual_seed(opts.seed)
    side = preset.trace_latent
    traced = tracing.trace(module, example_inputs(preset, component, 2, side, side, vocab, gen))
    tracing.check_no_tensor_constants(component, traced)
    tracing.check_no_baked_device(component, traced)
    # Note [Shapes are not baked]: another batch and odd, non-square latents.
    if component == "text_encoder":
        second = example_inputs(preset, component, 3, side, side, vocab, gen)
    elif component == "unet":
        second = example_inputs(preset, component, 1, 2 * side - 1, side + 3, vocab, gen)
    else:
        second = example_inputs(preset, component, 1, side - 3, side + 1, vocab, gen)
    diff = tracing.check_matches_eager(component, module, traced, second)

    if opts.dtype == "float16":
        _to_half(traced, keep)
    path = os.path.join(folder, f"{component}.pt")
    size = tracing.save(component, traced, path)
    params = sum(p.numel() for p in traced.parameters())
    report = ComponentReport(component, params, size, path, quantized, diff)
    report.stays_float = (opts.quantize != "none" and component in opts.quant_components
                          and not quantized)
    if component in opts.compile:
        package = os.path.join(folder, aot.package_name(component, opts.compile_device))
        gen = torch.Generator().manual_seed(opts.seed)
        # Note [Compile at the serving size]: the preset's default image.
        serving = int(preset.defaults.get("width", side * preset.vae_decoder.downscale))
        big = aot.example_side(module, component, serving // preset.vae_decoder.downscale)
        report.compile_seconds = aot.compile_component(
            module, component, example_inputs(preset, component, 2, big, big, vocab, gen),
            opts.compile_device, package, manifest.sha256_file(path), mode=opts.compile_mode,
            attention=opts.compile_attention)
        report.compiled = package
    return report


def _make_stage(out: str) -> str:
    """A fresh, empty hidden staging folder next to `out` (Note [Export is all-or-nothing])."""
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    stage = os.path.join(parent, f".{os.path.basename(out)}.partial-{os.getpid()}")
    shutil.rmtree(stage, ignore_errors=True)
    os.makedirs(stage)
    return stage


def _install(stage: str, out: str) -> None:
    """Moves the staged folder to `out`, replacing a previous export there."""
    if not os.path.exists(out):
        os.rename(stage, out)
        return
    parent, name = os.path.split(os.path.abspath(out))
    old = os.path.join(parent, f".{name}.old-{os.getpid()}")
    os.rename(out, old)
    os.rename(stage, out)
    shutil.rmtree(old, ignore_errors=True)


def export(opts: ExportOptions) -> ExportResult:
    """Writes the pipeline folder opts.out; raises ValueError / tracing.ExportError on failure."""
    start = time.monotonic()
    if opts.preset not in PRESETS:
        raise ValueError(f"unknown preset '{opts.preset}' (choose from {', '.join(PRESETS)})")
    out = os.path.abspath(opts.out)
    validate_name(os.path.basename(out))
    if os.path.isfile(out) or (os.path.isdir(out) and os.listdir(out) and
                               not os.path.exists(os.path.join(out, "pipeline.yaml"))):
        raise ValueError(f"{out} exists and is not a pipeline folder; refusing to replace it")
    preset = PRESETS[opts.preset]
    if opts.threads > 0:
        torch.set_num_threads(opts.threads)

    stage = _make_stage(out)
    try:
        merges = _train_merges(preset.num_merges)
        vocab = bpe.write_tokenizer(os.path.join(stage, "tokenizer"), merges)
        preset = preset.with_vocab(len(vocab))
        if preset.text_encoder.hidden_size != preset.unet.cross_attention_dim:
            raise ValueError("text encoder width != UNet cross-attention width")
        result = ExportResult(out, len(vocab), len(merges))
        if opts.verbose:
            print(f"tokenizer     vocab {len(vocab):>13,}  merges {len(merges):,}  "
                  f"file {os.path.join(out, 'tokenizer', 'vocab.json')}", flush=True)
        for component in COMPONENTS:
            report = export_component(preset, component, opts, stage, len(vocab))
            report.file = os.path.join(out, os.path.basename(report.file))
            if report.compiled:
                report.compiled = os.path.join(out, os.path.basename(report.compiled))
            result.components.append(report)
            if opts.verbose:
                extra = (f"  ({report.quantized_layers} linear layers -> {opts.quantize}, "
                         f"{opts.quant_mode})" if report.quantized_layers else "")
                if report.stays_float:
                    extra = f"  (stays float: every layer below {opts.min_weights} weights)"
                print(f"{component:<13} params {report.params:>13,}  bytes "
                      f"{report.tensor_bytes:>15,}  file {report.file}{extra}", flush=True)
                if report.compiled:
                    print(f"{'':<13} compiled for {opts.compile_device} in "
                          f"{report.compile_seconds:.1f} s  file {report.compiled}", flush=True)

        quant = {}
        if opts.quantize != "none":
            stays_float = {r.name for r in result.components if r.stays_float}
            for c in [c for c in opts.quant_components if c not in stays_float]:
                skip = tuple(DEFAULT_QUANT_SKIP.get(c, ())) + tuple(opts.skip)
                quant[c] = manifest.quantization_section(opts.quantize, opts.blocksize,
                                                         opts.double_quant, skip,
                                                         opts.min_weights)
        header = (f"written by qpool_export {opts.preset} preset, seed {opts.seed}, dtype "
                  f"{opts.dtype}, quantize {opts.quantize}"
                  + (f" ({opts.quant_mode})" if opts.quantize != "none" else "")
                  + "\nrandom weights: structurally Stable Diffusion 1.x, not a trained model")
        entries = manifest.record_digests(manifest.build_manifest(preset, quant, MAX_LENGTH), stage)
        for c in opts.compile:
            entries["components"][c]["compiled"] = aot.manifest_entry(stage, c, opts.compile_device)
        text = manifest.dump_manifest(entries, header)
        with open(os.path.join(stage, "pipeline.yaml"), "w", encoding="utf-8") as f:
            f.write(text)
        _install(stage, out)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    result.seconds = time.monotonic() - start
    return result


@functools.lru_cache(maxsize=4)
def _train_merges(num_merges: int) -> Tuple[Tuple[str, str], ...]:
    """BPE merges of the built-in corpus (deterministic, so cached across in-process exports)."""
    return tuple(bpe.train_bpe(corpus.PROMPTS, num_merges))


def _split_list(text: str) -> Tuple[str, ...]:
    return tuple(s.strip() for s in text.split(",") if s.strip())


def parse_args(argv: Optional[Sequence[str]]):
    """ExportOptions, or the raw namespace when --count-only was given."""
    p = argparse.ArgumentParser(
        prog="qpool-export",
        description="Export a Stable-Diffusion-1.x-shaped pipeline with random weights as a qpool "
                    "model-repository folder (docs/model-repository.md).")
    p.add_argument("--preset", required=True, choices=sorted(PRESETS), help="model sizes")
    p.add_argument("--out", help="pipeline folder to write (or, with --name, the repository "
                                 "folder); required unless --count-only")
    p.add_argument("--count-only", action="store_true",
                   help="print each component's parameter count (built on the meta device, "
                        "nothing written) and exit")
    p.add_argument("--name", help="pipeline name: write OUT/NAME instead of OUT")
    p.add_argument("--seed", type=int, default=0, help="same seed, same weights (default 0)")
    p.add_argument("--quantize", choices=("none", "int8", "nf4", "w8a8"), default="none",
                   help="int8: int8 weights (row-wise absmax), float products; nf4: 4-bit "
                        "NormalFloat weights; w8a8: int8 weights and per-token int8 "
                        "activations, int8 products (docs/quantization.md)")
    p.add_argument("--quant-mode", choices=("prequantized", "load-time"), default="prequantized",
                   help="prequantized: packed weights in the .pt files; load-time: full-precision "
                        "files, the server quantizes when it loads them")
    p.add_argument("--blocksize", type=int, default=None, help="nf4 block size (default 64)")
    p.add_argument("--double-quant", action="store_true", help="nf4: 8-bit absmax of absmax")
    p.add_argument("--smoothquant", type=float, default=None, metavar="ALPHA",
                   help="w8a8, prequantized: SmoothQuant activation scales max|x|^ALPHA / "
                        "max|w|^(1-ALPHA) per input channel (0.5 is the usual), calibrated on 4 "
                        "batches of random prompts; default: scales of ones")
    p.add_argument("--components", default=None,
                   help="components to quantize, comma separated, or 'all' "
                        "(default: text_encoder,unet)")
    p.add_argument("--skip", default="",
                   help="linear layers to keep in full precision (comma separated name substrings)")
    p.add_argument("--min-weights", type=int, default=0, metavar="N",
                   help="keep linear layers of fewer than N weights (out x in) in full precision "
                        "(default 0; w8a8 pays only on large layers)")
    p.add_argument("--dtype", choices=("float32", "float16"), default="float32",
                   help="dtype of the saved weights (tracing always runs in float32)")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads for tracing (default: 1 for tiny, which is fastest for small "
                        "ops and immune to oversubscription; all cores otherwise)")
    p.add_argument("--compile", default="",
                   help="components that also get an ahead-of-time compiled forward (comma "
                        f"separated, from {', '.join(aot.COMPILABLE)}): torch.export + "
                        "AOTInductor writes COMPONENT.DEVICE.pt2 beside COMPONENT.pt, holding "
                        "generated code but no weights (the server binds the component's own "
                        "tensors to it), and the manifest gains components.COMPONENT.compiled "
                        "{file, device, sha256}; the server runs it while the component lives on "
                        "that device type, TorchScript elsewhere (docs/model-repository.md). "
                        "Batch 1-64 and latent sides 4-256 are dynamic. Takes about a minute "
                        "per component for tiny on 2 CPU cores. With --quantize, only "
                        "--quant-mode prequantized")
    p.add_argument("--compile-device", choices=aot.DEVICES, default="cpu",
                   help="device type the packages are compiled for (cuda needs a GPU here; its "
                        "packages compute in float16 with channels-last UNet weights, as the "
                        "server places them with placement.dtype auto)")
    p.add_argument("--compile-mode", choices=aot.MODES, default="default",
                   help="max-autotune: Inductor benchmarks its kernel choices (Triton templates "
                        "against cuBLAS and cuDNN) at the compile example's sizes; compiling takes "
                        "several times longer")
    p.add_argument("--compile-attention", choices=aot.ATTENTION, default="auto",
                   help=aot.ATTENTION_HELP)
    p.add_argument("-q", "--quiet", action="store_true", help="no per-component summary")
    a = p.parse_args(argv)
    if a.count_only:
        return a
    if not a.out:
        p.error("the following arguments are required: --out")

    if a.threads is not None and a.threads < 1:
        p.error("--threads must be >= 1")
    if a.seed < 0:
        p.error("--seed must be >= 0")
    out = os.path.join(a.out, a.name) if a.name else a.out
    name = os.path.basename(os.path.normpath(out))
    try:
        validate_name(name)
    except ValueError as e:
        p.error(str(e))
    nf4 = a.quantize == "nf4"
    if a.blocksize is not None and not nf4:
        p.error("--blocksize applies to --quantize nf4 only")
    blocksize = 64 if a.blocksize is None else a.blocksize
    if blocksize < 16 or blocksize > 4096 or blocksize & (blocksize - 1):
        p.error(f"--blocksize must be a power of two between 16 and 4096 (got {blocksize})")
    if a.double_quant and not nf4:
        p.error("--double-quant applies to --quantize nf4 only")
    if a.smoothquant is not None and (a.quantize != "w8a8" or a.quant_mode != "prequantized"):
        p.error("--smoothquant applies to --quantize w8a8 --quant-mode prequantized only")
    if a.smoothquant is not None and not 0 < a.smoothquant <= 1:
        p.error(f"--smoothquant must be in (0, 1] (got {a.smoothquant})")
    if a.quantize == "none" and (a.components is not None or a.skip or a.min_weights or
                                 a.quant_mode != "prequantized"):
        p.error("--components, --skip, --min-weights and --quant-mode apply only with --quantize "
                "int8|nf4|w8a8")
    if not 0 <= a.min_weights < 2**31:
        p.error(f"--min-weights must be in [0, 2^31) (got {a.min_weights})")
    compile_list = _split_list(a.compile)
    bad = [c for c in compile_list if c not in aot.COMPILABLE]
    if bad:
        p.error(f"--compile: unknown component(s) {', '.join(bad)} "
                f"(choose from {', '.join(aot.COMPILABLE)})")
    if compile_list and a.quantize != "none" and a.quant_mode != "prequantized":
        p.error("--compile with --quantize needs --quant-mode prequantized (a package is "
                "compiled for the weights' format)")
    comps = DEFAULT_QUANT_COMPONENTS
    if a.components is not None:
        comps = COMPONENTS if a.components.strip() == "all" else _split_list(a.components)
        bad = [c for c in comps if c not in COMPONENTS]
        if bad or not comps:
            p.error(f"--components: unknown component(s) {', '.join(bad) or '(none given)'} "
                    f"(choose from {', '.join(COMPONENTS)} or 'all')")
    return ExportOptions(preset=a.preset, out=out, seed=a.seed, quantize=a.quantize,
                         quant_mode=a.quant_mode, blocksize=blocksize, double_quant=a.double_quant,
                         quant_components=tuple(c for c in COMPONENTS if c in comps),
                         skip=_split_list(a.skip), min_weights=a.min_weights,
                         smoothquant=a.smoothquant, dtype=a.dtype,
                         verbose=not a.quiet,
                         compile=tuple(c for c in COMPONENTS if c in compile_list),
                         compile_device=a.compile_device, compile_mode=a.compile_mode,
                         compile_attention=a.compile_attention,
                         threads=a.threads if a.threads else (1 if a.preset == "tiny" else 0))


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "from-diffusers":
        from .from_diffusers_cli import main as import_main

        return import_main(args[1:])
    if args and args[0] == "from-single-file":
        from .single_file import main as single_file_main

        return single_file_main(args[1:])
    opts = parse_args(args)
    if isinstance(opts, argparse.Namespace):  # --count-only
        preset = PRESETS[opts.preset]
        vocab = preset.vocab_size or len(bpe.build_vocab(_train_merges(preset.num_merges)))
        for component in COMPONENTS:
            n = count_parameters(preset, component, vocab)
            print(f"{component:<13} params {n:>13,}  ({n / 1e6:.1f}M)")
        return 0
    try:
        result = export(opts)
    except (ValueError, OSError, tracing.ExportError, aot.CompileError) as e:
        print(f"qpool_export: error: {e}", file=sys.stderr)
        return 1
    if opts.verbose:
        print(f"wrote {result.out} in {result.seconds:.1f} s", flush=True)
    return 0
