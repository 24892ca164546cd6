"""A component's tensors in a safetensors file beside its TorchScript graph (Note [Weights beside
the graph] in server/component/weights_file.h): the graph keeps placeholders of each tensor's
dtype and sizes whose storage holds one element, the file holds the tensors under the graph's
slot names. WeightsWriter writes a file one tensor at a time (the header is known from the
tensors' dtypes and sizes before any of them is), so that an import need not hold a component's
tensors at once; save_split writes a traced module as the two files; load_component reads them
back into one module (for tests and for inspecting an import).
"""

from __future__ import annotations

import json
import os
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import torch

# The safetensors names of the dtypes a component's tensors have.
DTYPE_NAMES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16",
               torch.bfloat16: "BF16", torch.int64: "I64", torch.int32: "I32",
               torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL",
               torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2"}
GRAPH_SUFFIX = ".pt"
WEIGHTS_SUFFIX = ".safetensors"


class WeightsFileError(ValueError):
    pass


def weights_path(graph_path: str) -> str:
    """The weights file beside a graph file: unet.pt -> unet.safetensors."""
    stem = graph_path[:-len(GRAPH_SUFFIX)] if graph_path.endswith(GRAPH_SUFFIX) else graph_path
    return stem + WEIGHTS_SUFFIX


def nbytes(dtype: torch.dtype, shape: Sequence[int]) -> int:
    count = 1
    for s in shape:
        count *= int(s)
    return count * torch.empty((), dtype=dtype).element_size()


class WeightsWriter:
    """Writes the tensors of `plan` ((name, dtype, sizes) each) to `path` as safetensors, one
    write() at a time in any order, each at its place (laid out by element size, largest first,
    so that every tensor starts at a multiple of its element size); close() checks that every
    one was written. The header is padded to a multiple of 8 bytes, as the safetensors library
    writes it."""

    def __init__(self, path: str, plan: Iterable[Tuple[str, torch.dtype, Sequence[int]]],
                 metadata: Optional[Dict[str, str]] = None):
        entries = list(plan)
        names = [name for name, _, _ in entries]
        if len(set(names)) != len(names):
            raise WeightsFileError(f"{path}: a tensor name appears twice")
        for name, dtype, _ in entries:
            if dtype not in DTYPE_NAMES:
                raise WeightsFileError(f"{path}: tensor '{name}' has dtype {dtype}, which a "
                                       f"weights file does not hold")
        entries.sort(key=lambda e: -torch.empty((), dtype=e[1]).element_size())
        header: Dict[str, object] = {}
        if metadata:
            header["__metadata__"] = dict(metadata)
        offset = 0
        self._expected: Dict[str, Tuple[torch.dtype, Tuple[int, ...], int]] = {}
        for name, dtype, shape in entries:
            size = nbytes(dtype, shape)
            header[name] = {"dtype": DTYPE_NAMES[dtype], "shape": [int(s) for s in shape],
                            "data_offsets": [offset, offset + size]}
            self._expected[name] = (dtype, tuple(int(s) for s in shape), offset)
            offset += size
        text = json.dumps(header, separators=(",", ":")).encode("utf-8")
        text += b" " * (-len(text) % 8)
        self.order: List[str] = [name for name, _, _ in entries]
        self.data_bytes = offset
        self._data_start = 8 + len(text)
        self._written: set = set()
        self._path = path
        self._file = open(path, "wb")
        self._file.write(len(text).to_bytes(8, "little"))
        self._file.write(text)
        self._file.truncate(self._data_start + offset)

    def write(self, name: str, tensor: torch.Tensor) -> None:
        if name not in self._expected or name in self._written:
            why = "written twice" if name in self._written else "not in its header"
            raise WeightsFileError(f"{self._path}: tensor '{name}' is {why}")
        dtype, shape, offset = self._expected[name]
        if tensor.dtype != dtype or tuple(tensor.shape) != shape:
            raise WeightsFileError(f"{self._path}: tensor '{name}' is {tensor.dtype} "
                                   f"{tuple(tensor.shape)}; the header says {dtype} {shape}")
        data = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
        if data.numel():
            self._file.seek(self._data_start + offset)
            self._file.write(memoryview(data.numpy()))
        self._written.add(name)

    def close(self) -> None:
        self._file.close()
        left = [n for n in self.order if n not in self._written]
        if left:
            os.unlink(self._path)
            raise WeightsFileError(f"{self._path}: {len(left)} tensors were not written, the "
                                   f"first '{left[0]}'")

    def __enter__(self) -> "WeightsWriter":
        return self

    def __exit__(self, kind, value, traceback) -> None:
        if kind is None:
            self.close()
        else:
            self._file.close()
            os.unlink(self._path)


# The header's metadata entry naming tied slots (kTiedMetadataKey in
# server/component/weights_file.h).
TIED_KEY = "qpool.tied"


# safetensors' own limit on a header, which the server applies too (kMaxWeightsHeaderBytes).
MAX_HEADER_BYTES = 100 << 20
DTYPES = {name: dtype for dtype, name in DTYPE_NAMES.items()}


class SafetensorsReader:
    """A safetensors file read tensor by tensor with plain reads, not a memory map: the pages of
    a mapping count in the process's resident memory once touched, so reading every tensor of a
    file through one holds the whole file; read() holds only the tensor it returns. The header is
    checked as the server checks it (dtypes, sizes and ranges inside the file), naming the file
    and the tensor."""

    def __init__(self, path: str):
        self.path = path
        self._file = open(path, "rb")
        size = os.fstat(self._file.fileno()).st_size
        length = int.from_bytes(self._file.read(8), "little") if size >= 8 else -1
        if length < 0 or length > MAX_HEADER_BYTES or 8 + length > size:
            self._file.close()
            raise WeightsFileError(f"{path}: not a safetensors file (its header length "
                                   f"{length} does not fit its {size} bytes)")
        try:
            header = json.loads(self._file.read(length))
        except ValueError as e:
            self._file.close()
            raise WeightsFileError(f"{path}: its safetensors header is not JSON: {e}") from None
        if not isinstance(header, dict):
            self._file.close()
            raise WeightsFileError(f"{path}: its safetensors header is not a JSON object")
        meta = header.pop("__metadata__", None)
        self.metadata: Dict[str, str] = meta if isinstance(meta, dict) else {}
        self._start = 8 + length
        self._entries: Dict[str, Tuple[torch.dtype, Tuple[int, ...], int, int]] = {}
        for name, e in header.items():
            dtype = DTYPES.get(e.get("dtype")) if isinstance(e, dict) else None
            shape, offsets = (e.get("shape"), e.get("data_offsets")) if isinstance(e, dict) \
                else (None, None)
            if dtype is None or not isinstance(shape, list) or not isinstance(offsets, list) \
                    or len(offsets) != 2 or not all(isinstance(v, int) and v >= 0
                                                    for v in shape + offsets):
                self._file.close()
                raise WeightsFileError(f"{path}: tensor '{name}' has an entry qpool cannot "
                                       f"read: {json.dumps(e)[:200]}")
            begin, end = offsets
            if end - begin != nbytes(dtype, shape) or self._start + end > size:
                self._file.close()
                raise WeightsFileError(f"{path}: tensor '{name}' has data_offsets {offsets}, "
                                       f"not the {nbytes(dtype, shape)} bytes of {shape} "
                                       f"{e['dtype']} inside the file's {size} bytes")
            self._entries[name] = (dtype, tuple(shape), begin, end)

    def keys(self) -> List[str]:
        return list(self._entries)

    def shape(self, name: str) -> Tuple[int, ...]:
        return self._entries[name][1]

    def dtype(self, name: str) -> torch.dtype:
        return self._entries[name][0]

    def read(self, name: str) -> torch.Tensor:
        dtype, shape, begin, end = self._entries[name]
        data = torch.empty(end - begin, dtype=torch.uint8)
        view = memoryview(data.numpy())
        done = 0
        while done < len(view):
            got = os.preadv(self._file.fileno(), [view[done:]], self._start + begin + done)
            if got <= 0:
                raise WeightsFileError(f"{self.path}: ends inside tensor '{name}'")
            done += got
        return data.view(dtype).reshape(shape)

    def close(self) -> None:
        self._file.close()


def tensor_slots(module: torch.nn.Module) -> Dict[str, torch.Tensor]:
    """Every parameter and buffer of `module` by qualified name, tied ones under each of their
    names: the slots of the server's tensor table (Note [qpool owns the tensors])."""
    slots: Dict[str, torch.Tensor] = {}
    for name, t in list(module.named_parameters(remove_duplicate=False)) + \
            list(module.named_buffers(remove_duplicate=False)):
        slots.setdefault(name, t)
    return slots


def split_tied(slots: Dict[str, torch.Tensor]) -> Tuple[Dict[str, torch.Tensor], Dict[str, str]]:
    """The slots stored (the first name of each tensor) and the tied ones: slot -> the stored
    slot that is the very same tensor (same storage, sizes and strides)."""
    stored: Dict[str, torch.Tensor] = {}
    tied: Dict[str, str] = {}
    first: Dict[Tuple[object, ...], str] = {}
    for name, t in slots.items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(),
               t.dtype)
        if t.numel() and key in first:
            tied[name] = first[key]
            continue
        first.setdefault(key, name)
        stored[name] = t
    return stored, tied


def tied_metadata(tied: Dict[str, str]) -> Optional[Dict[str, str]]:
    """The header's metadata for `tied` (none when nothing is)."""
    return {TIED_KEY: json.dumps(tied, sort_keys=True)} if tied else None


def placeholder(t: torch.Tensor, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """A tensor of t's sizes and dtype (or `dtype`) over a storage of one element (strides of
    zero)."""
    return torch.zeros((), dtype=dtype or t.dtype).expand(t.shape)


def is_placeholder(t: torch.Tensor) -> bool:
    """Whether `t` spans more elements than its storage holds (a placeholder)."""
    return t.numel() > 1 and t.untyped_storage().nbytes() < t.numel() * t.element_size()


def save_split(traced: torch.jit.ScriptModule, graph: str, weights: str) -> None:
    """Writes `traced` as its graph with placeholders (`graph`) and its tensors (`weights`);
    `traced` keeps its tensors."""
    slots = tensor_slots(traced)
    stored, tied = split_tied(slots)
    with WeightsWriter(weights, [(n, t.dtype, tuple(t.shape)) for n, t in stored.items()],
                       tied_metadata(tied)) as out:
        for name in out.order:
            out.write(name, stored[name])
    kept = {name: t.data for name, t in stored.items()}
    try:
        for t in stored.values():
            t.data = placeholder(t)  # a tied slot is the same tensor: replaced with it
        torch.jit.save(traced, graph)
    finally:
        for name, t in stored.items():
            t.data = kept[name]


def read_weights(path: str) -> Dict[str, torch.Tensor]:
    """Every tensor of a weights file by slot name, tied slots included (through the safetensors
    library, which checks the format as the server does)."""
    from safetensors import safe_open

    with safe_open(path, framework="pt") as f:
        tensors = {key: f.get_tensor(key) for key in f.keys()}
        tied = json.loads((f.metadata() or {}).get(TIED_KEY, "{}"))
    for slot, name in tied.items():
        tensors[slot] = tensors[name]
    return tensors


def load_component(graph: str, weights: Optional[str] = None) -> torch.jit.ScriptModule:
    """torch.jit.load of a component's graph with its tensors bound from `weights` (by default
    the file beside it, when there is one); a graph holding its own tensors loads as it is. The
    Python references of the ops the graphs call are registered first (quant.py, blocks.py)."""
    from . import quant  # noqa: F401

    module = torch.jit.load(graph)
    weights = weights or weights_path(graph)
    if not os.path.exists(weights):
        return module
    tensors = read_weights(weights)
    slots = tensor_slots(module)
    if set(tensors) != set(slots):
        missing = sorted(set(slots) - set(tensors))[:3]
        extra = sorted(set(tensors) - set(slots))[:3]
        raise WeightsFileError(f"{weights}: does not match {graph}: missing {missing}, "
                               f"unknown {extra}")
    for name, t in slots.items():
        t.data = tensors[name]  # tied slots: the one tensor, under each name
    return module
