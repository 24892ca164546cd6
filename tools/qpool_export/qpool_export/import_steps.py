"""The steps every diffusers import takes, whatever its kind: the options, a built component
quantized, traced, checked, converted to its dtype and saved (save_component), and the tokenizer
files copied or converted into the pipeline folder (copy_clip_tokenizer, copy_sentencepiece,
copy_tokenizer_json). from_diffusers.py and the kinds' importers (hidream_import.py) call them.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

import torch

from . import compile as aot
from . import bnb_import, lora_fuse, tracing, weights_file
from . import manifest as manifest_io
from .diffusers_components import Built, read_json
from .import_error import ImportFailure

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16,
          "fp16": torch.float16, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
# FluxPipeline's default max_sequence_length, and its largest.
T5_MAX_LENGTH = 512


@dataclass
class ImportOptions:
    src: str
    out: str
    # None: bfloat16 for kind flux (its T5 overflows in float16), else float16.
    dtype: Optional[str] = None
    quantize: Dict[str, str] = field(default_factory=dict)  # component -> int8 | nf4 | w8a8
    blocksize: int = 64
    double_quant: bool = False
    # Layers of fewer weights stay float in the quantized components (Note [Small layers stay
    # float]); written to the manifest for load-time quantization.
    min_weights: int = 0
    clip_skip: int = 0
    variant: Optional[str] = None  # e.g. "fp16": read *.fp16.safetensors weight files
    # prequantized: --quantize quantizes now; load-time: the layers stay float (quantizable) and
    # the manifest has the server quantize them when it loads the pipeline.
    quant_mode: str = "prequantized"
    # Components that also get an AOTInductor package for compile_device (compile.py).
    compile: Tuple[str, ...] = ()
    compile_device: str = "cpu"
    compile_mode: str = "default"  # compile.MODES
    compile_attention: str = "auto"  # compile.ATTENTION
    # The dtype the server computes in when the manifest names one (placement.dtype); None: the
    # device's (set by import_pipeline).
    compile_dtype: Optional[str] = None
    # w8a8 components: SmoothQuant's alpha (smoothquant.py), or activation scales of ones.
    smoothquant: Optional[float] = None
    # A JSON file for every quantized layer's own error against its float layer (layer_error.py).
    layer_error: Optional[str] = None
    # LoRA files fused into the weights first (lora_fuse.py, Note [Fused LoRAs]).
    loras: Tuple[lora_fuse.Lora, ...] = ()
    warmup: bool = False  # the manifest's execution.warmup (Note [Warm-up at load])
    # Kind hidream: the Llama's folder when the pipeline folder has no text_encoder_4/
    # (hidream_import.py).
    text_encoder_4: Optional[str] = None
    # Every component through the full path, with its check against diffusers on the real
    # weights (Note [Streaming import] in stream_import.py).
    full_check: bool = False
    # Streamed components are read in blocks of at most this many MiB in float32 where their
    # modules can be cut (Note [Streaming import]).
    max_block_mib: int = 1024
    # Where streamed blocks are transformed, quantized and converted: auto (the GPU when there is
    # one), cpu or cuda.
    import_device: str = "auto"
    # Component folder -> the tensors it reads instead of its folder's files (a single file's
    # part, single_file_layouts.MappedTensors); such components are streamed.
    sources: Dict[str, object] = field(default_factory=dict)
    # The manifest header's first line, where the import is not from-diffusers of opts.src.
    origin: Optional[str] = None
    verbose: bool = True


def streams(opts: ImportOptions, name: str) -> bool:
    """Whether component `name` may be imported streaming (Note [Streaming import]): unless the
    full check is asked for, or what it needs holds the whole module in float (SmoothQuant's
    calibration, per-layer errors, a compiled package). Checkpoints the streaming path does not
    read take the full path as well (diffusers_components._open_original)."""
    smooth = opts.quantize.get(name) == "w8a8" and opts.smoothquant is not None
    return not (opts.full_check or opts.layer_error or smooth or name in opts.compile)


def quantize_built(built: Built, opts: ImportOptions) -> int:
    return quantize_tree(built.module, built, opts, built.weight_errors)


def quantize_tree(module: torch.nn.Module, built: Built, opts: ImportOptions,
                  errors: Optional[Dict[str, float]] = None) -> int:
    """Quantizes the linears of `module` (the built component's module, or one of its blocks
    where the import streams) as --quantize says for the component; returns how many, and
    records each layer's weight error in `errors`."""
    fmt = opts.quantize.get(built.name, "none")
    if fmt == "none":
        return 0
    from . import quant

    smooth = None
    if fmt == "w8a8" and opts.smoothquant is not None:
        # Activation maxima over the component's example inputs (as the server passes them,
        # random values); smoothquant.py.
        from . import smoothquant

        scales = smoothquant.calibrate(built.module, (built.trace_inputs, built.check_inputs),
                                       opts.smoothquant)
        smooth = smoothquant.fold(built.module, scales)  # Note [Folded smoothing]
    records = None
    if opts.layer_error and opts.quant_mode == "prequantized":
        from . import layer_error

        records = layer_error.capture(built.module, (built.trace_inputs, built.check_inputs))
    count = quant.quantize_module(module, fmt, blocksize=opts.blocksize,
                                  double_quant=opts.double_quant,
                                  prequantize=opts.quant_mode == "prequantized", smooth=smooth,
                                  min_weights=opts.min_weights, errors=errors)
    if records is not None:
        built.layer_errors = layer_error.errors(built.module, records)
    if fmt == "w8a8" and opts.quant_mode == "prequantized":
        quant.fuse_geglu_linears(module)  # after the layer errors (Note [GEGLU linear op])
        quant.fuse_norm_linears(module)  # Note [Norm linear op]
    return count


def to_dtype(traced: torch.jit.ScriptModule, dtype: torch.dtype) -> None:
    """Floating weights and buffers to `dtype`; the quant state (absmax, code, ...) of quantized
    layers and the frequency tables keep float32, as the server expects."""
    from .quant import FLOAT32_BUFFERS, STATE_NAMES

    for name, t in list(traced.named_parameters()) + list(traced.named_buffers()):
        if name.rpartition(".")[2] in STATE_NAMES + FLOAT32_BUFFERS:
            continue
        if t.dtype == torch.float32 and dtype != torch.float32:
            # A streamed graph's placeholders stay placeholders (Note [Streaming import]).
            t.data = weights_file.placeholder(t.data, dtype) if weights_file.is_placeholder(
                t.data) else t.data.to(dtype)


def traced_and_checked(built: Built) -> torch.jit.ScriptModule:
    """The built module traced, with no tensor constant or device baked into its graphs, and
    equal to the eager module on the second inputs (tracing.py)."""
    traced = tracing.trace(built.module, built.trace_inputs)
    tracing.check_no_tensor_constants(built.name, traced)
    tracing.check_no_baked_device(built.name, traced)
    tracing.check_matches_eager(built.name, built.module, traced, built.check_inputs)
    return traced


def save_component(built: Built, opts: ImportOptions, stage: str) -> Dict[str, object]:
    if built.stream is not None:
        return save_streamed(built, opts, stage)
    converted = bnb_import.install(built.module, built.prequantized, built.name)
    quantized = quantize_built(built, opts) + converted
    traced = traced_and_checked(built)
    dtype = built.dtype or opts.dtype
    to_dtype(traced, DTYPES[dtype])
    path = os.path.join(stage, f"{built.name}.pt")
    size = tracing.save(built.name, traced, path)
    formats = sorted({q["format"] for q in built.prequantized.values()})
    errors = built.weight_errors
    report = {"name": built.name, "streamed": False,
              "weight_error": max(errors.values()) if errors else None, "params": sum(p.numel() for p in traced.parameters()),
              "bytes": size, "quantized_layers": quantized,
              "converted_layers": converted, "converted_formats": formats,
              "max_diff": built.max_diff, "dtype": built.dtype, "compile_seconds": None,
              "layer_errors": built.layer_errors,
              # Every layer below --min-weights: no quantization section for it (Note [Small
              # layers stay float]).
              "stays_float": opts.quantize.get(built.name, "none") != "none" and not quantized}
    if built.name in opts.compile:
        if quantized and opts.quant_mode != "prequantized":
            raise ImportFailure(f"--compile {built.name}: the component is quantized at load "
                                f"(--quant-mode load-time), and a package is compiled for the "
                                f"weights' format: use --quant-mode prequantized")
        package = os.path.join(stage, aot.package_name(built.name, opts.compile_device))
        examples = aot.resized_examples(built.module, built.name,
                                        built.compile_inputs or built.trace_inputs,
                                        torch.Generator().manual_seed(0), built.compile_side)
        dtype = built.dtype or opts.compile_dtype
        try:
            report["compile_seconds"] = aot.compile_component(
                built.module, built.name, examples, opts.compile_device, package,
                manifest_io.sha256_file(path), DTYPES[dtype] if dtype else None,
                mode=opts.compile_mode, attention=opts.compile_attention)
        except aot.CompileError as e:
            raise ImportFailure(str(e)) from e
    return report


def save_streamed(built: Built, opts: ImportOptions, stage: str) -> Dict[str, object]:
    """save_component for a streamed component (Note [Streaming import]): the graph traced on
    placeholders, then the weights block by block from the source files."""
    from . import stream_import

    start = time.monotonic()
    built.stream.block_elements = opts.max_block_mib << 18
    quantized = quantize_built(built, opts)  # on meta: the shapes the graph needs
    stream_import.to_placeholders(built.module)
    traced = traced_and_checked(built)
    dtype = built.dtype or opts.dtype
    to_dtype(traced, DTYPES[dtype])
    params = sum(p.numel() for p in traced.parameters())
    stored, tied = weights_file.split_tied(weights_file.tensor_slots(traced))
    plan = {n: (t.dtype, tuple(t.shape)) for n, t in stored.items()}
    size = sum(weights_file.nbytes(d, shape) for d, shape in plan.values())
    path = os.path.join(stage, f"{built.name}.pt")
    tracing.check_room(built.name, stage, size)
    with tracing.quiet_torchscript():
        torch.jit.save(traced, path)
    del traced
    graph_seconds = time.monotonic() - start
    device = opts.import_device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    stream_import.write_weights(built.stream, plan, tied, weights_file.weights_path(path),
                                lambda block, errors: quantize_tree(block, built, opts, errors),
                                built.weight_errors, device,
                                Progress(built.name) if opts.verbose else lambda d, t: None)
    errors = built.weight_errors
    return {"name": built.name, "streamed": True,
            "params": params, "bytes": size,
            "quantized_layers": quantized, "converted_layers": 0, "converted_formats": [],
            "max_diff": None, "weight_error": max(errors.values()) if errors else None,
            "dtype": built.dtype, "compile_seconds": None, "layer_errors": None,
            "stays_float": opts.quantize.get(built.name, "none") != "none" and not quantized,
            "graph_seconds": graph_seconds,
            "weights_seconds": time.monotonic() - start - graph_seconds}


class Progress:
    """Prints how much of a large component's weights file is written, every tenth of it."""
    SMALLEST = 1 << 30  # components below 1 GiB print nothing

    def __init__(self, name: str):
        self.name, self.shown = name, 0

    def __call__(self, done: int, total: int) -> None:
        tenth = done * 10 // max(total, 1)
        if total >= self.SMALLEST and tenth > self.shown and done < total:
            self.shown = tenth
            print(f"{self.name}: {done / 1e9:.1f} of {total / 1e9:.1f} GB written", flush=True)


def write_bpe_files(tokenizer_json: str, dest: str) -> None:
    """vocab.json and merges.txt from a fast tokenizer's tokenizer.json (a BPE model)."""
    model = read_json(tokenizer_json).get("model")
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


def copy_clip_tokenizer(src: str, stage: str, name: str = "tokenizer") -> Tuple[int, str]:
    """Writes stage/NAME/{vocab.json,merges.txt} from the folder src/NAME: copied, or converted
    from tokenizer.json; returns the tokens per prompt (tokenizer_config.json's
    model_max_length, else 77) and the pad token."""
    folder = os.path.join(src, name)
    dest = os.path.join(stage, name)
    os.makedirs(dest)
    files = [os.path.join(folder, n) for n in ("vocab.json", "merges.txt")]
    if all(os.path.isfile(f) for f in files):
        for f in files:
            shutil.copyfile(f, os.path.join(dest, os.path.basename(f)))
    elif os.path.isfile(os.path.join(folder, "tokenizer.json")):
        write_bpe_files(os.path.join(folder, "tokenizer.json"), dest)
    else:
        raise ImportFailure(f"{folder}: holds neither vocab.json and merges.txt nor "
                            f"tokenizer.json")
    config_path = os.path.join(folder, "tokenizer_config.json")
    config = read_json(config_path) if os.path.isfile(config_path) else {}
    pad = config.get("pad_token") or "<|endoftext|>"
    pad = pad.get("content") if isinstance(pad, dict) else pad
    vocab = read_json(os.path.join(dest, "vocab.json"))
    if not isinstance(pad, str) or pad not in vocab:
        raise ImportFailure(f"{config_path}: field 'pad_token' is {pad!r}, which the vocabulary "
                            f"does not hold")
    length = config.get("model_max_length", 77)
    length = length if isinstance(length, int) and 2 <= length <= 1024 else 77
    return length, pad


@dataclass
class Tokenizer:
    """A tokenizer folder as the manifest names it."""
    name: str  # tokenizer | tokenizer_2
    max_length: int
    pad_token: str

    def section(self) -> Dict[str, object]:
        return {"vocab": f"{self.name}/vocab.json", "merges": f"{self.name}/merges.txt",
                "max_length": self.max_length, "pad_token": self.pad_token}


def copy_sentencepiece(src: str, stage: str, name: str = "tokenizer_2") -> int:
    """Copies T5's SentencePiece model src/NAME/spiece.model to stage/NAME/; returns the tokens per
    prompt: FluxPipeline's max_sequence_length (512), or the tokenizer's model_max_length when
    that is smaller."""
    folder = os.path.join(src, name)
    model = os.path.join(folder, "spiece.model")
    dest = os.path.join(stage, name)
    if os.path.isfile(model):
        os.makedirs(dest)
        shutil.copyfile(model, os.path.join(dest, "spiece.model"))
    elif os.path.isfile(os.path.join(folder, "tokenizer.json")):
        # transformers 5 saves T5's tokenizer as tokenizer.json alone (Note [T5 from
        # tokenizer.json] in t5_tokenizer.py).
        from .t5_tokenizer import spiece_from_tokenizer_json

        data = spiece_from_tokenizer_json(os.path.join(folder, "tokenizer.json"))
        os.makedirs(dest)
        with open(os.path.join(dest, "spiece.model"), "wb") as f:
            f.write(data)
    else:
        raise ImportFailure(f"{model}: missing, and no tokenizer.json beside it (qpool reads "
                            f"T5's SentencePiece model, or builds it from tokenizer.json)")
    config_path = os.path.join(folder, "tokenizer_config.json")
    config = read_json(config_path) if os.path.isfile(config_path) else {}
    length = config.get("model_max_length", T5_MAX_LENGTH)
    return length if isinstance(length, int) and 2 <= length <= T5_MAX_LENGTH else T5_MAX_LENGTH
