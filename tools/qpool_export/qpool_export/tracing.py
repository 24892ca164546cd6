"""torch.jit.trace with the checks the component contract needs (docs/model-repository.md).

Note [No tensor constants]
torch.jit.trace bakes any tensor it cannot trace back to an input, parameter or buffer into the
graph as a prim::Constant. Such a tensor belongs to no attribute, so no mover can reach it and it
stays on the export device; qpool refuses the component at load. We fail the export instead,
naming the node, and keep every tensor a forward needs in a buffer.

Note [Shapes are not baked]
A trace records one execution. Shapes read with `x.shape` stay symbolic (aten::size), but a
shape turned into a Python value and fed back (e.g. torch.zeros(int(h))) would be frozen. We run
the traced module on a second input shape and compare it with the eager module.

Note [Room before a save]
torch.jit.save cannot report a full disk: its writer's error escapes a destructor and the
process aborts ("unexpected pos N vs M", naming no file), so no handler runs and the staging
folder (Note [Export is all-or-nothing]) stays behind, holding the disk full. save() first
checks that the folder's file system has room for the module's tensors and a margin, and fails
the export with an error naming the component, the folder and both sizes. Exports running side
by side can still race for the same room; the check stops a lone export that cannot fit.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import warnings
from typing import Iterator, List, Sequence, Tuple

import torch

from . import weights_file


class ExportError(Exception):
    """An export check failed; the message says which component and why."""


# What a saved file holds beyond its tensors (code, pickles, zip records), generously.
SAVE_MARGIN_BYTES = 64 << 20


def tensor_bytes(module: torch.nn.Module) -> int:
    """Bytes of the distinct storages behind the module's parameters and buffers."""
    seen, total = set(), 0
    for t in module.state_dict().values():
        key = (t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    return total


def save(component: str, traced: torch.jit.ScriptModule, path: str) -> int:
    """The module's graph to `path` and its tensors to the weights file beside it (Note [Weights
    beside the graph] in server/component/weights_file.h), after checking there is room for them (Note [Room
    before a save]); returns the module's tensor bytes."""
    size = tensor_bytes(traced)
    check_room(component, os.path.dirname(os.path.abspath(path)), size)
    with quiet_torchscript():
        weights_file.save_split(traced, path, weights_file.weights_path(path))
    return size


def check_room(component: str, folder: str, size: int) -> None:
    """ExportError naming the component and the folder when its file system has no room for
    `size` bytes of tensors and a margin (Note [Room before a save])."""
    need = size + size // 100 + SAVE_MARGIN_BYTES
    free = shutil.disk_usage(folder).free
    if free < need:
        raise ExportError(f"{component}: not enough disk space in {folder}: writing it needs "
                          f"about {need / 1e9:.2f} GB, {free / 1e9:.2f} GB free")


@contextlib.contextmanager
def quiet_torchscript() -> Iterator[None]:
    """Silences TorchScript's deprecation warnings (we keep TorchScript on purpose, see
    /work/shared/ARCHITECTURE.md) and re-emits any other warning, TracerWarnings included."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    for w in caught:
        msg = str(w.message)
        deprecation = issubclass(w.category, (DeprecationWarning, FutureWarning))
        if deprecation and ("torch.jit" in msg or "TorchScript" in msg or "torch.compile" in msg):
            continue
        if _benign_tracer_warning(w):
            continue
        print(f"warning: {w.category.__name__}: {msg}", file=sys.stderr)


def _benign_tracer_warning(w: warnings.WarningMessage) -> bool:
    """F.group_norm's training-time batch-size check (`if size_prods == 1`) reads a traced size as
    a bool; it only decides whether to raise, so nothing of it enters the graph."""
    return (issubclass(w.category, torch.jit.TracerWarning) and
            w.filename.replace("\\", "/").endswith("torch/nn/functional.py") and
            "Python boolean" in str(w.message))


def trace(module: torch.nn.Module, example: Tuple[torch.Tensor, ...]) -> torch.jit.ScriptModule:
    with quiet_torchscript(), torch.no_grad():
        return torch.jit.trace(module, example, check_trace=False)


def _walk(block) -> Iterator[torch._C.Node]:
    for node in block.nodes():
        yield node
        for sub in node.blocks():
            yield from _walk(sub)


def tensor_constants(traced: torch.jit.ScriptModule, min_numel: int = 2) -> List[str]:
    """Descriptions of prim::Constant tensors with >= min_numel elements in the forward graph of
    the module and of every submodule (nested blocks included)."""
    found = []
    for name, sub in traced.named_modules():
        if not sub._c._has_method("forward"):
            continue  # containers that the trace never called
        for node in _walk(sub.graph):
            if node.kind() != "prim::Constant" or node.output().type().kind() != "TensorType":
                continue
            value = node.t("value")
            if value.numel() >= min_numel:
                where = name or "<root>"
                found.append(f"{where}.forward: prim::Constant tensor of shape "
                             f"{tuple(value.shape)} ({str(node).strip()})")
    return found


def check_no_tensor_constants(component: str, traced: torch.jit.ScriptModule) -> None:
    found = tensor_constants(traced)
    if found:
        raise ExportError(f"{component}: the traced graph holds tensor constants (they would stay "
                          f"on the export device; keep them in buffers):\n  " + "\n  ".join(found))


def check_no_baked_device(component: str, traced: torch.jit.ScriptModule) -> None:
    """ExportError naming the node when the trace holds a device constant as an operator's
    argument: torch.arange(..., device=x.device) is traced with the tracing device's name, so the
    tensor would be made there (the importing machine's CPU) whatever device the server runs the
    component on, and fail its first request on a GPU."""
    for node in traced.inlined_graph.nodes():
        for value in node.inputs():
            source = value.node()
            if source.kind() == "prim::Constant" and value.type().kind() == "DeviceObjType":
                where = node.sourceRange().strip().splitlines()
                raise ExportError(f"{component}: the trace baked in a device: {node.kind()} "
                                  f"takes the constant device {source.output().toIValue()}"
                                  + (f" ({where[0][:200]})" if where else ""))


def check_matches_eager(component: str, eager: torch.nn.Module, traced: torch.jit.ScriptModule,
                        inputs: Sequence[torch.Tensor]) -> float:
    """Runs both on `inputs` (a shape other than the trace's); returns the max abs difference
    over every output (a component may return a tuple of tensors)."""
    with torch.no_grad():
        want = eager(*inputs)
        got = traced(*inputs)
    wants = want if isinstance(want, tuple) else (want,)
    gots = got if isinstance(got, tuple) else (got,)
    if len(gots) != len(wants):
        raise ExportError(f"{component}: traced module returns {len(gots)} outputs, eager "
                          f"{len(wants)}")
    worst = 0.0
    for want, got in zip(wants, gots):
        if got.shape != want.shape:
            raise ExportError(f"{component}: traced output shape {tuple(got.shape)} != eager "
                              f"{tuple(want.shape)} for inputs {[tuple(t.shape) for t in inputs]} "
                              f"(a shape was baked into the trace)")
        # A streamed graph runs on placeholders (Note [Streaming import] in stream_import.py),
        # whose zeros make a w8a8 layer divide by zero: both must then be non-finite alike.
        finite = torch.isfinite(want)
        if not torch.equal(finite, torch.isfinite(got)):
            raise ExportError(f"{component}: traced output is not finite where eager is, or "
                              f"the other way round, for inputs "
                              f"{[tuple(t.shape) for t in inputs]}")
        want, got = want[finite], got[finite]
        diff = (got - want).abs().max().item() if got.numel() else 0.0
        scale = want.abs().max().item() if want.numel() else 0.0
        if not diff <= 1e-4 * (1.0 + scale):
            raise ExportError(f"{component}: traced output differs from eager by {diff:g} for "
                              f"inputs {[tuple(t.shape) for t in inputs]}")
        worst = max(worst, diff)
    return worst
