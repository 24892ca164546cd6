"""Streaming import: a component's weights read from its safetensors files one block at a time,
converted and written to the weights file beside its graph, so that host memory stays bounded by
the largest block whatever the model's size.

Note [Streaming import]
Loading a component with diffusers and copying it into qpool's module held it twice in float32
(bench/results: the full-size FLUX import). A streaming import never holds a component:
  - the graph: qpool's module is built with every parameter on the meta device
    (params_on_meta; buffers stay real, and the tables qpool's modules compute, such as rotary
    and frequency tables, are small), transformed as the full import transforms it (fused
    projections, quantization: both compute shapes alone on meta tensors), given placeholders
    of one element per tensor (weights_file.placeholder) and traced; the trace and its checks
    run on the placeholders, which have every tensor's real dtype and sizes;
  - the weights: the untransformed module on meta is cut into blocks (units(): a module holding
    lists of modules and more elements than --max-block-mib in float32 is cut into its
    children, down to the blocks the builder's transform works on, which stay whole), and each
    block in turn gets its tensors from the source files (read
    one at a time from the safetensors files, checked for shape and finite values,
    converted to float32), is transformed in the same way, and its tensors go to their places
    in the weights file in the dtype of the graph's slot. Then the block is dropped.
What a full import checks on the whole module in float32 against diffusers' own (the outputs on
random inputs) a streaming import cannot; it checks instead that the source's tensors and qpool's
module match one to one (every tensor of the module found under its name, of its shape, and no
tensor of the source left unread but those the kind never reads), and qpool's modules are proven
equal to diffusers' by the tests, on small configurations of every supported variant, through
the images the server makes. `--full-check` imports through the full path, with the check on
the real weights, where memory allows (twice the largest component in float32). Checkpoints
the streaming path does not read (bitsandbytes layouts, pickled .bin files) and imports that
need the whole module in float (SmoothQuant's calibration, --layer-error, --compile) take the
full path.
"""

from __future__ import annotations

import contextlib
import copy
import glob
import os
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Set, Tuple

import torch
import torch.nn as nn

from .import_error import ImportFailure, check_weights_match

# --max-block-mib's default: blocks of up to 1 GiB in float32 are read whole.
MAX_BLOCK_MIB = 1024


@contextlib.contextmanager
def params_on_meta() -> Iterator[None]:
    """Every parameter registered inside is moved to the meta device as it is registered (the
    module's init then runs on meta tensors, costing nothing); buffers stay where they are made."""
    register = nn.Module.register_parameter

    def on_meta(module: nn.Module, name: str, param: Optional[nn.Parameter]) -> None:
        if param is not None and param.device.type != "meta":
            param = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        register(module, name, param)

    nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        nn.Module.register_parameter = register


def weight_files(where: str, variant: Optional[str]) -> List[str]:
    """model.safetensors, diffusion_pytorch_model-00001-of-00002.safetensors, ...; with a
    variant, the ones diffusers and transformers name after it: model.fp16.safetensors,
    model.fp16-00001-of-00002.safetensors."""
    found = []
    for path in sorted(glob.glob(os.path.join(where, "*.safetensors"))):
        parts = os.path.basename(path).split(".")
        if (variant and len(parts) == 3 and (parts[1] == variant or
                                             parts[1].startswith(variant + "-"))) or \
                (not variant and len(parts) == 2):
            found.append(path)
    return found


class SourceTensors:
    """The tensors of a component folder's safetensors files (one file, or shards listed by
    their *.safetensors.index.json; `variant`: the *.{variant}.safetensors files), read one at a
    time with plain reads (weights_file.SafetensorsReader)."""

    def __init__(self, where: str, variant: Optional[str] = None):
        from .weights_file import SafetensorsReader, WeightsFileError

        files = weight_files(where, variant)
        suffix = f".{variant}.safetensors" if variant else ".safetensors"
        if not files:
            raise ImportFailure(f"{where}: no *{suffix} weight files")
        self.where = where
        self._files: Dict[str, object] = {}
        self._owner: Dict[str, str] = {}
        for path in files:
            try:
                handle = SafetensorsReader(path)
            except (OSError, WeightsFileError) as e:
                raise ImportFailure(f"{path}: cannot be read as safetensors: {e}") from None
            self._files[path] = handle
            for key in handle.keys():
                if key in self._owner:
                    raise ImportFailure(f"{path}: tensor '{key}' is also in "
                                        f"{self._owner[key]}")
                self._owner[key] = path

    @staticmethod
    def available(where: str, variant: Optional[str] = None) -> bool:
        """Whether the folder has safetensors weight files the streaming path reads."""
        return bool(weight_files(where, variant))

    def keys(self) -> List[str]:
        return list(self._owner)

    def __contains__(self, key: str) -> bool:
        return key in self._owner

    def file_of(self, key: str) -> str:
        return self._owner[key]

    def shape(self, key: str) -> Tuple[int, ...]:
        return self._files[self._owner[key]].shape(key)

    def read(self, key: str) -> torch.Tensor:
        """The tensor as stored, read from its file (weights_file.SafetensorsReader)."""
        return self._files[self._owner[key]].read(key)


@dataclass
class Stream:
    """How a streamed component reads its source: the files, the names each of qpool's tensors
    may have there (the first one present is read), the source tensors qpool's module never
    reads, the untransformed module on meta (whose blocks get the weights), and the transform
    the builder applied to the graph (fused projections), applied again to each block."""
    source: SourceTensors
    pristine: nn.Module
    candidates: Callable[[str], Sequence[str]] = lambda key: (key,)
    ignored: Callable[[str], bool] = lambda key: False
    transform: Callable[[nn.Module], object] = lambda module: None
    # Blocks of more elements that hold lists of modules are cut into their children.
    block_elements: int = MAX_BLOCK_MIB << 18


def check_coverage(stream: Stream) -> Dict[str, str]:
    """Each meta tensor of the untransformed module -> its source key; ImportFailure naming the
    folder and the first missing, misshapen or unread tensors otherwise."""
    where = stream.source.where
    found: Dict[str, str] = {}
    missing: List[str] = []
    for name, t in _meta_tensors(stream.pristine, ""):
        key = next((k for k in stream.candidates(name) if k in stream.source), None)
        if key is None:
            missing.append(name)
            continue
        have = stream.source.shape(key)
        if have != tuple(t.shape):
            raise ImportFailure(f"{stream.source.file_of(key)}: tensor '{key}' has shape "
                                f"{list(have)}; the architecture its config describes needs "
                                f"{list(t.shape)}")
        found[name] = key
    read: Set[str] = set(found.values())
    unread = [k for k in stream.source.keys() if k not in read and not stream.ignored(k)]
    check_weights_match(where, missing, unread)
    return found


def _meta_tensors(module: nn.Module, prefix: str, recurse: bool = True
                  ) -> Iterator[Tuple[str, torch.Tensor]]:
    """The meta tensors of `module`, tied ones under each of their names."""
    for name, t in list(module.named_parameters(prefix.rstrip("."), recurse=recurse,
                                                remove_duplicate=False)) + \
            list(module.named_buffers(prefix.rstrip("."), recurse=recurse,
                                      remove_duplicate=False)):
        if t.device.type == "meta":
            yield name, t


def _replace(module: nn.Module, name: str, value: torch.Tensor, parameter: bool) -> None:
    owner, _, leaf = name.rpartition(".")
    holder = module.get_submodule(owner) if owner else module
    if parameter:
        holder._parameters[leaf] = value
    else:
        holder._buffers[leaf] = value


def _is_parameter(module: nn.Module, name: str) -> bool:
    owner, _, leaf = name.rpartition(".")
    return leaf in (module.get_submodule(owner) if owner else module)._parameters


def _elements(module: nn.Module) -> int:
    return sum(t.numel() for t in module.parameters()) + sum(t.numel() for t in module.buffers())


def _has_block_list(module: nn.Module) -> bool:
    return any(isinstance(m, nn.ModuleList) for m in module.modules())


def units(module: nn.Module, limit: int, prefix: str = ""
          ) -> Iterator[Tuple[str, nn.Module, bool]]:
    """(prefix, module, whole) of the blocks the weights are read in: whole modules, or (whole
    False) a module's own tensors where its children are units of their own (Note [Streaming
    import]). Modules with a `fuse` (the blocks whose projections the builders fuse) stay
    whole, whatever their size."""
    if _elements(module) > limit and _has_block_list(module) and not hasattr(module, "fuse"):
        yield prefix, module, False
        for name, child in module.named_children():
            yield from units(child, limit, f"{prefix}{name}.")
        return
    yield prefix, module, True


def materialize(unit: nn.Module, prefix: str, whole: bool, stream: Stream,
                keys: Dict[str, str]) -> nn.Module:
    """A copy of `unit` (or of its own tensors only, when not whole) with every meta tensor
    read from the source in float32, checked finite."""
    if whole:
        block = copy.deepcopy(unit)
    else:
        block = copy.copy(unit)  # its own tensors; the children are units of their own
        block._modules = {}
        block._parameters = dict(unit._parameters)
        block._buffers = dict(unit._buffers)
    done: Dict[int, torch.Tensor] = {}  # a tied tensor is read once and shared again
    for name, t in list(_meta_tensors(block, "", recurse=whole)):
        parameter = _is_parameter(block, name)
        if id(t) not in done:
            key = keys[prefix + name]
            value = stream.source.read(key)
            if value.is_floating_point():
                value = value.to(torch.float32)
                if not bool(torch.isfinite(value).all()):
                    raise ImportFailure(f"{stream.source.file_of(key)}: tensor '{key}' holds "
                                        f"values that are not finite (NaN or infinite)")
            done[id(t)] = nn.Parameter(value, requires_grad=False) if parameter else value
        _replace(block, name, done[id(t)], parameter)
    return block


def to_placeholders(module: nn.Module) -> None:
    """Every meta tensor of `module` replaced by a placeholder of its dtype and sizes."""
    from .weights_file import placeholder

    done: Dict[int, torch.Tensor] = {}  # tied tensors stay one tensor
    for name, t in list(_meta_tensors(module, "")):
        parameter = _is_parameter(module, name)
        if id(t) not in done:
            done[id(t)] = nn.Parameter(placeholder(t), requires_grad=False) if parameter \
                else placeholder(t)
        _replace(module, name, done[id(t)], parameter)


def write_weights(stream: Stream, plan: Dict[str, Tuple[torch.dtype, Tuple[int, ...]]],
                  tied: Dict[str, str], path: str,
                  quantize: Callable[[nn.Module, Dict[str, float]], int],
                  errors: Dict[str, float], device: str = "cpu",
                  progress: Callable[[int, int], None] = lambda done, total: None) -> None:
    """The weights file of a traced graph whose slots are `plan`, block by block from the source
    (Note [Streaming import]), each block transformed, quantized and converted on `device` (a
    GPU does it many times faster; quantized bytes are the CPU's but where a format averages,
    nf4's double quantization, whose last bit may differ); ImportFailure naming the source file
    and tensor of a bad one. `progress(bytes written, bytes in all)` is called after each
    block."""
    from .weights_file import WeightsWriter, tied_metadata

    from .weights_file import nbytes

    keys = check_coverage(stream)
    written: Set[str] = set()
    total = sum(nbytes(d, shape) for d, shape in plan.values())
    done = 0
    with WeightsWriter(path, [(n, d, s) for n, (d, s) in plan.items()],
                       tied_metadata(tied)) as out:
        for prefix, unit, whole in units(stream.pristine, stream.block_elements):
            if not any(name.startswith(prefix) for name in plan):
                continue  # dropped from the graph (layers past the hidden states read)
            block = materialize(unit, prefix, whole, stream, keys).to(device)
            if whole:
                stream.transform(block)
                if any(isinstance(m, nn.Linear) for m in block.modules()):
                    # A block that is a linear itself is quantized inside a holder (the
                    # quantizer replaces submodules).
                    holder = nn.Module()
                    holder.add_module("block", block)
                    own: Dict[str, float] = {}
                    quantize(holder, own)
                    block = holder.block
                    errors.update({prefix + k[len("block."):]: v for k, v in own.items()})
            own = block.state_dict(keep_vars=False) if whole else {
                **{n: t for n, t in block._parameters.items() if t is not None},
                **{n: t for n, t in block._buffers.items() if t is not None}}
            for name, t in own.items():
                full = prefix + name
                if full not in plan or full in written:
                    continue
                dtype, _ = plan[full]
                out.write(full, t.detach().to(dtype))
                written.add(full)
                done += nbytes(dtype, plan[full][1])
            del block, own
            progress(done, total)
