"""Ahead-of-time compiled forwards: torch.export + AOTInductor packages without weights.

Note [Compiled forward] (server/component/compiled_forward.h)
The package holds generated code only (`aot_inductor.package_constants_in_so=False`); the server
supplies the component's own tensors as its constants, found by the qualified names of the eager
module's parameters and buffers, which are the names of the TorchScript file's tensor slots. The
package's metadata records what the server checks before it runs the package instead of
TorchScript: the SHA-256 of the TorchScript file written beside it, every input's dtype and the
size range of each dimension, and the layout of the 4-d weights; and, for its log and warnings,
the attention priority order it was compiled under (Note [Compiled attention]).
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import torch

SOURCE_KEY = "qpool.source_sha256"
INPUTS_KEY = "qpool.inputs"
LAYOUT_KEY = "qpool.weight_layout"
ATTENTION_KEY = "qpool.attention"

DEVICES = ("cpu", "cuda")
# Inductor's modes: default, or max-autotune (kernel choices benchmarked at compile time).
MODES = ("default", "max-autotune")
# Components that can be compiled, and the dimensions of their inputs that vary at run time
# (what server/pipeline/sd/, sdxl/ and flux/ pass): batch (images x 2 with guidance) and the
# latent's sides; an SDXL UNet's two extra inputs (pooled text embeddings, time ids) vary with the
# batch. A FLUX transformer's image tokens (a packed latent's 2x2 patches) vary with the size, its
# text tokens are the manifest's T5 length: (hidden states, T5 states, pooled CLIP, timestep,
# img_ids, txt_ids, guidance).
MAX_BATCH = 64
MIN_SIDE = 4  # export's guards on the UNet's down-sampling need sides of at least 3
MAX_SIDE = 256  # latent sides up to 2048-pixel images
MAX_TOKENS = (MAX_SIDE // 2) ** 2
_DYNAMIC: Dict[str, Tuple[Dict[int, str], ...]] = {
    "text_encoder": ({0: "batch"},),
    "unet": ({0: "batch", 2: "height", 3: "width"}, {0: "batch"}, {0: "batch"}, {0: "batch"},
             {0: "batch"}),
    "vae_decoder": ({0: "batch", 2: "height", 3: "width"},),
    "transformer": ({0: "batch", 1: "tokens"}, {0: "batch"}, {0: "batch"}, {0: "batch"},
                    {0: "tokens"}, {}, {0: "batch"}),
}
# Floating inputs the pipelines pass in float32 whatever the compute dtype, by position: a UNet's
# timestep and an SDXL UNet's time ids (server/pipeline/sd/, sdxl/), a FLUX transformer's
# timestep, position ids and guidance (flux/). The server runs a package only on inputs of the
# dtypes it was compiled for (Note [Compiled forward]): an input declared here in the wrong
# dtype leaves the package unused.
_FLOAT32_INPUTS: Dict[str, Tuple[int, ...]] = {"unet": (1, 4), "transformer": (3, 4, 5, 6)}
COMPILABLE = tuple(_DYNAMIC)
# --compile-attention, as the server's --attention takes it (Note [Compiled attention]).
ATTENTION = ("auto", "cudnn", "flash", "efficient", "math")
ATTENTION_HELP = ("the server's --attention the packages' attention kernels are chosen for (a "
                  "package's kernel is fixed when it is compiled); auto: the order ATen settles "
                  "on the compile device, as the server's auto")
_SDP_BACKENDS = {"math": 0, "flash": 1, "efficient": 2, "cudnn": 3, "overrideable": 4}
_DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16",
                torch.int64: "int64", torch.int32: "int32", torch.bool: "bool"}


class CompileError(Exception):
    """The component could not be exported or compiled."""


def package_name(component: str, device: str) -> str:
    return f"{component}.{device}.pt2"


def compute_dtype(device: str) -> torch.dtype:
    """The dtype the server computes in on `device` with placement.dtype auto."""
    return torch.float16 if device == "cuda" else torch.float32


# Note [Compile at the serving size]
# A package runs at every size of its signature, but Inductor picks its generated kernels' block
# sizes and reduction strategies for the sizes of the example it compiles, so a package compiled
# from a small example serves large images with kernels chosen for small ones. UNets and VAE
# decoders therefore compile from an example at the latent side the pipeline serves by default
# (the UNet config's sample_size; a preset's default width), with the UNet's batch of one image
# with guidance (2), and a FLUX transformer from the image tokens of its default 1024x1024 image
# (sides capped at the signature's MAX_SIDE).


def _side_multiple(module: torch.nn.Module, component: str) -> int:
    """What a latent side must be a multiple of: a UNet's skip connections join each
    down-sampled map with its up-sampled twin, so every stride-2 convolution halves a side that
    must stay even; export refuses sides it cannot prove fit."""
    if component != "unet":
        return 1
    halvings = sum(1 for m in module.modules()
                   if isinstance(m, torch.nn.Conv2d) and tuple(m.stride) == (2, 2))
    return 2 ** halvings


def example_side(module: torch.nn.Module, component: str, side: int) -> int:
    """A latent side to export `component` with: at least two of the deepest level's pixels, as a
    side of 1 there is specialized by export (size-1 dimensions are)."""
    return max(side, 2 * _side_multiple(module, component))


def resized_examples(module: torch.nn.Module, component: str,
                     inputs: Sequence[torch.Tensor], gen: torch.Generator,
                     side: Optional[int] = None) -> Tuple[torch.Tensor, ...]:
    """`inputs` made what export needs of an example: latent sides that are multiples of the
    UNet's down-sampling and at least example_side, and a batch of at least 2 (export
    specializes a dimension of size 1). `side`, the latent side the pipeline serves by default,
    replaces both sides (Note [Compile at the serving size]). Inputs that change get random
    values of their dtype (integer ones: the values of their first row)."""
    multiple = _side_multiple(module, component)
    out = []
    for spec, t in zip(_DYNAMIC[component], inputs):
        shape = list(t.shape)
        for axis, name in spec.items():
            if name in ("batch", "tokens"):
                shape[axis] = max(shape[axis], 2)
            else:
                wanted = side if side else shape[axis]
                side_here = -(-wanted // multiple) * multiple
                shape[axis] = example_side(module, component, side_here)
        if shape == list(t.shape):
            out.append(t)
        elif t.is_floating_point():
            out.append(torch.randn(shape, generator=gen).to(t.dtype))
        else:  # token ids: the batch grows by repeating the first row
            out.append(t[:1].expand(shape).clone())
    return tuple(out) + tuple(inputs[len(out):])


def _dims(component: str, inputs: Sequence[torch.Tensor], multiple: int = 1):
    """export's dynamic_shapes and the metadata's input signature ("lo:hi" or "lo:hi:step" for a
    dimension that varies, "n" for one that does not). Sides start at two of the deepest level's
    pixels (example_side)."""
    low = max(-(-MIN_SIDE // multiple) * multiple, 2 * multiple if multiple > 1 else MIN_SIDE)
    ranges = {"batch": (1, MAX_BATCH, 1), "height": (low, MAX_SIDE, multiple),
              "width": (low, MAX_SIDE, multiple), "tokens": (2, MAX_TOKENS, 1)}
    dims = {}
    for name, (lo, hi, step) in ranges.items():
        if step == 1:
            dims[name] = torch.export.Dim(name, min=lo, max=hi)
        else:  # sides that are multiples of `step`: a derived dimension
            dims[name] = step * torch.export.Dim(f"{name}_over_{step}", min=lo // step,
                                                 max=hi // step)
    shapes, entries = [], []
    for spec, t in zip(_DYNAMIC[component], inputs):
        shapes.append({axis: dims[name] for axis, name in spec.items()})
        sizes = []
        for axis, n in enumerate(t.shape):
            if axis not in spec:
                sizes.append(str(n))
                continue
            lo, hi, step = ranges[spec[axis]]
            sizes.append(f"{lo}:{hi}" if step == 1 else f"{lo}:{hi}:{step}")
        entries.append(f"{_DTYPE_NAMES[t.dtype]}[{','.join(sizes)}]")
    return tuple(shapes), ";".join(entries)


def _tensors_that_keep_their_dtype(module: torch.nn.Module
                                   ) -> Dict[Tuple[str, str], torch.Tensor]:
    """By (owner, leaf): the quant state of quantized layers (every buffer but weight and bias)
    and the frequency tables, which the server keeps in the dtype they were saved in (Note
    [Tensors that keep their dtype]): the package must read them in that dtype too."""
    from .quant import FLOAT32_BUFFERS, QuantLinear

    return {(owner, leaf): buf for owner, m in module.named_modules()
            for leaf, buf in m.named_buffers(recurse=False)
            if buf is not None and (leaf in FLOAT32_BUFFERS or (
                isinstance(m, QuantLinear) and leaf not in ("weight", "bias")))}


def example_args(component: str, inputs: Sequence[torch.Tensor], dtype: torch.dtype,
                 device: str = "cpu") -> list:
    """`inputs` as the server passes them to `component` computing in `dtype` on `device`:
    floating inputs in `dtype`, except those _FLOAT32_INPUTS names."""
    keep_float32 = _FLOAT32_INPUTS.get(component, ())
    return [(t.to(dtype) if t.is_floating_point() and i not in keep_float32 else t).to(device)
            for i, t in enumerate(inputs)]


# Note [Compiled attention]
# A TorchScript component chooses its attention kernel at every call, by the priority order the
# server settled at start (Note [Attention backend] in server/component/attention_backend.h:
# ATen's own order, cuDNN first on Hopper, or --attention's). A package's kernel is chosen once,
# when Inductor lowers scaled_dot_product_attention, by the order of the exporting process at that
# moment, which depends on whether that process had run attention on the device before (ATen
# settles its CUDA order at its first choice). compile_component therefore settles the order on
# the compile device as the server does, applies --compile-attention as the server applies
# --attention, and compiles under that order, so a package made with `auto` runs the kernel the
# server's TorchScript would on a device of the compile device's kind. The order is recorded in the
# package's metadata (ATTENTION_KEY), and the server warns when it differs from its own.


def attention_order(name: str, device: str) -> List[int]:
    """ATen's attention priority order (at::SDPBackend values) as the server runs it with
    `--attention name` on `device` (Note [Compiled attention])."""
    if name not in ATTENTION:
        raise CompileError(f"--compile-attention {name}: choose from {', '.join(ATTENTION)}")
    if device == "cuda":
        q = torch.zeros(1, 1, 1, 64, device="cuda", dtype=torch.float16)
        torch.ops.aten._fused_sdp_choice(q, q, q)
    order = [int(b) for b in torch._C._get_sdp_priority_order()]
    if name != "auto":
        order.remove(_SDP_BACKENDS[name])
        order.insert(0, _SDP_BACKENDS[name])
    return order


def describe_attention(order: Sequence[int]) -> str:
    """"cudnn, flash, efficient, math, overrideable": an order as the metadata and the server's
    DescribeAttentionPriority write it."""
    names = {v: k for k, v in _SDP_BACKENDS.items()}
    return ", ".join(names.get(int(b), str(int(b))) for b in order)


@contextlib.contextmanager
def attention_priority(order: Sequence[int]) -> Iterator[None]:
    """ATen's attention priority order is `order` inside, what it was outside."""
    previous = torch._C._get_sdp_priority_order()
    torch._C._set_sdp_priority_order(list(order))
    try:
        yield
    finally:
        torch._C._set_sdp_priority_order(previous)


def compile_component(module: torch.nn.Module, component: str,
                      inputs: Sequence[torch.Tensor], device: str, path: str,
                      source_sha256: str, dtype: Optional[torch.dtype] = None,
                      mode: str = "default", attention: str = "auto") -> float:
    """Writes the AOTInductor package of `module`'s forward for `device` to `path`; returns the
    seconds it took. `inputs` are float32 CPU examples; floating ones take `dtype`, by default
    the device's compute dtype (except the inputs _FLOAT32_INPUTS names, which the pipelines pass
    in float32). `attention` is the server's --attention the package's kernels are chosen for
    (Note [Compiled attention])."""
    if component not in _DYNAMIC:
        raise CompileError(f"--compile: {component} cannot be compiled "
                           f"(choose from {', '.join(COMPILABLE)})")
    if device == "cuda" and not torch.cuda.is_available():
        raise CompileError("--compile-device cuda needs a GPU on the exporting machine")
    if mode not in MODES:
        raise CompileError(f"--compile-mode {mode}: choose from {', '.join(MODES)}")
    order = attention_order(attention, device)
    start = time.monotonic()
    dtype = dtype or compute_dtype(device)
    layout = "contiguous"
    saved = _tensors_that_keep_their_dtype(module)
    module = module.to(device=device, dtype=dtype).eval()
    for (owner, leaf), buf in saved.items():
        module.get_submodule(owner)._buffers[leaf] = buf.to(device)
    # Note [Channels-last convolutions]: the server lays out a UNet's and a VAE decoder's 4-d
    # weights channels-last on GPUs (the decoder's when its norms are qpool::group_norm, as every
    # decoder this exporter writes), and the package must read them as they are.
    if device == "cuda" and component in ("unet", "vae_decoder"):
        module = module.to(memory_format=torch.channels_last)
        layout = "channels_last"
    args = example_args(component, inputs, dtype, device)
    shapes, signature = _dims(component, args, _side_multiple(module, component))
    metadata = {SOURCE_KEY: source_sha256, INPUTS_KEY: signature, LAYOUT_KEY: layout,
                ATTENTION_KEY: describe_attention(order)}
    try:
        with torch.no_grad(), attention_priority(order):
            program = torch.export.export(module, tuple(args), dynamic_shapes=shapes, strict=False)
            torch._inductor.aoti_compile_and_package(
                program, package_path=path,
                inductor_configs={"aot_inductor.package_constants_in_so": False,
                                  "aot_inductor.metadata": metadata,
                                  "max_autotune": mode == "max-autotune"})
    except Exception as e:  # export and inductor raise many kinds
        raise CompileError(f"--compile {component}: {type(e).__name__}: "
                           f"{str(e).splitlines()[0] if str(e) else ''}") from e
    return time.monotonic() - start


def manifest_entry(folder: str, component: str, device: str,
                   sha256: Optional[str] = None) -> Dict[str, str]:
    """The `compiled:` mapping of one component (docs/model-repository.md)."""
    from .manifest import sha256_file

    name = package_name(component, device)
    digest = sha256 or sha256_file(os.path.join(folder, name))
    return {"file": name, "device": device, "sha256": digest}
