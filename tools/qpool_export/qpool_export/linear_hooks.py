"""Observing every nn.Linear of a module while it runs (SmoothQuant's calibration, layer
errors)."""

from typing import Callable, Iterable, Sequence

import torch
from torch import nn


@torch.no_grad()
def observe_linears(module: nn.Module, batches: Iterable[Sequence[torch.Tensor]],
                    observe: Callable[[str, torch.Tensor, torch.Tensor], None]) -> None:
    """Runs `module` on each batch (a tuple of positional inputs) and calls observe(name, x, y)
    for every call of one of its nn.Linear layers: its qualified name, input and output."""
    hooks = []
    for name, layer in module.named_modules():
        if isinstance(layer, nn.Linear):
            hooks.append(layer.register_forward_hook(
                lambda _, args, out, name=name: observe(name, args[0].detach(), out.detach())))
    try:
        for inputs in batches:
            module(*inputs)
    finally:
        for h in hooks:
            h.remove()
