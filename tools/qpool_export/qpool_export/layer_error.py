"""Per-layer error of quantized linear layers against the float layers they replace.

Each nn.Linear of a component is run on the inputs it receives in the float component (over the
component's example inputs); after quantization, the QuantLinear of the same name is run on those
same inputs. The error of each layer is therefore its own, not accumulated from the layers
before it:

  relative_error = ||y_quantized - y_float|| / ||y_float||   (over every output of the batches)
  cosine         = <y_quantized, y_float> / (||y_quantized|| ||y_float||)

which says which layers a format hurts most (candidates for `--skip`), beside the image-level
PSNR the benchmarks report.
"""

import math
from typing import Dict, Iterable, List, Sequence, Tuple

import torch
from torch import nn

from .linear_hooks import observe_linears

Records = Dict[str, List[Tuple[torch.Tensor, torch.Tensor]]]


def capture(module: nn.Module, batches: Iterable[Sequence[torch.Tensor]]) -> Records:
    """The input and output of every nn.Linear of `module` (by qualified name) over `batches`,
    with the module as it is now (before quantization)."""
    records: Records = {}
    observe_linears(module, batches,
                    lambda name, x, y: records.setdefault(name, []).append((x, y)))
    return records


def errors(module: nn.Module, records: Records) -> Dict[str, Dict[str, object]]:
    """For each quantized layer of `module` that `records` saw: its format, relative error and
    cosine against the float layer's outputs (float64 sums)."""
    from .quant import QuantLinear

    out: Dict[str, Dict[str, object]] = {}
    with torch.no_grad():
        for name, pairs in records.items():
            layer = module.get_submodule(name)
            if not isinstance(layer, QuantLinear):
                continue
            diff = ref = got = dot = 0.0
            for x, y in pairs:
                y = y.double()
                q = layer(x).double()
                diff += float(((q - y) ** 2).sum())
                ref += float((y ** 2).sum())
                got += float((q ** 2).sum())
                dot += float((q * y).sum())
            out[name] = {"format": layer.format,
                         "relative_error": math.sqrt(diff / ref) if ref > 0 else 0.0,
                         "cosine": dot / math.sqrt(ref * got) if ref > 0 and got > 0 else 1.0}
    return out


def worst(layer_errors: Dict[str, Dict[str, object]], count: int = 3) -> List[str]:
    """The `count` layers with the largest relative error, worst first."""
    return sorted(layer_errors, key=lambda n: layer_errors[n]["relative_error"],
                  reverse=True)[:count]
