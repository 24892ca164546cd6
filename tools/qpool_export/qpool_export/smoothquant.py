"""SmoothQuant calibration for w8a8 layers (Xiao et al., "SmoothQuant", 2023).

A w8a8 layer quantizes each row of its input to int8, so a few input channels with large
activations waste the row's 255 levels on themselves. Per-input-channel scales
s_k = max|X_k|^alpha / max|W_k|^(1 - alpha) move that range into the weight: the layer stores
int8(w * s) and divides x by s before quantizing it (docs/quantization.md, w8a8), which leaves
x w^T unchanged. The maxima come from forward passes over calibration inputs.
"""

from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import torch
from torch import nn

from .linear_hooks import observe_linears

# Floor of maxima and scales: a channel that is always zero keeps a finite, positive scale.
EPS = 1e-5

# Note [Folded smoothing]
# A w8a8 layer divides its input x by its scales s before quantizing it. Where x is made by an
# affine map that nothing else reads, that map's output rows divided by s make x / s already, and
# the layer needs no division (SmoothQuant folds its scales so): a LayerNorm's weight and bias; the
# rows of a linear that feed only this layer, such as the value half of a GEGLU projection, or a
# value projection, whose output reaches the attention's output projection mixed over tokens but
# not over channels. The layer's weight keeps its w * s, its scales become ones, and the
# quantizing kernel skips divisions by 1 (Note [Unit scales] in server/quant/w8a8_kernels.cu).
# Modules name their foldable pairs with `smoothing_folds()` (`Fold`s relative to themselves);
# `fold` applies them in float32 before quantization. A layer's scales are folded only where they
# all lie in [1 / MAX_FOLDED, MAX_FOLDED], so that the producer's divided weights stay normal
# numbers in fp16; others keep their division. The same inputs give the same outputs up to the
# rounding of the producer's new weights in the export's dtype (tests/python/test_smoothquant.py).
MAX_FOLDED = 1024.0


@dataclass(frozen=True)
class Fold:
    """The input of nn.Linear `consumer` is made by `producer` alone: an nn.LayerNorm (affine), or
    output rows [rows[0], rows[1]) of an nn.Linear. Names are relative to the listing module."""
    consumer: str
    producer: str
    rows: Optional[Tuple[int, int]] = None


def activation_maxima(module: nn.Module, batches: Iterable[Sequence[torch.Tensor]]
                      ) -> Dict[str, torch.Tensor]:
    """max |x| per input channel (float32 [K]) of every nn.Linear of `module`, by qualified
    name, over forward passes on `batches` (each a tuple of positional inputs)."""
    maxima: Dict[str, torch.Tensor] = {}

    def record(name, x, _):
        m = x.reshape(-1, x.shape[-1]).abs().amax(0).to(torch.float32)
        maxima[name] = torch.maximum(maxima[name], m) if name in maxima else m

    observe_linears(module, batches, record)
    return maxima


@torch.no_grad()
def smoothing_scales(module: nn.Module, maxima: Dict[str, torch.Tensor],
                     alpha: float = 0.5) -> Dict[str, torch.Tensor]:
    """s = max|X|^alpha / max|W|^(1 - alpha) (float32 [K], positive and finite) for every
    nn.Linear of `module` that `maxima` names."""
    if not 0.0 < alpha <= 1.0:
        raise ValueError(f"SmoothQuant alpha must be in (0, 1], got {alpha}")
    scales = {}
    for name, m in module.named_modules():
        if isinstance(m, nn.Linear) and name in maxima:
            w = m.weight.detach().to(torch.float32).abs().amax(0).clamp_min(EPS)
            x = maxima[name].to(w.device).clamp_min(EPS)
            scales[name] = x.pow(alpha).div(w.pow(1 - alpha)).clamp(EPS, 1 / EPS)
    return scales


def calibrate(module: nn.Module, batches: Iterable[Sequence[torch.Tensor]],
              alpha: float = 0.5) -> Dict[str, torch.Tensor]:
    """The SmoothQuant scales of every nn.Linear of `module` from forward passes on `batches`,
    for quant.quantize_module(module, "w8a8", smooth=...)."""
    return smoothing_scales(module, activation_maxima(module, batches), alpha)


def folds(module: nn.Module) -> List[Fold]:
    """Every Fold that the submodules of `module` list, with names relative to `module`."""
    found = []
    for prefix, m in module.named_modules():
        listed = getattr(m, "smoothing_folds", None)
        if listed is None:
            continue
        dot = prefix + "." if prefix else ""
        found += [Fold(dot + f.consumer, dot + f.producer, f.rows) for f in listed()]
    return found


@torch.no_grad()
def fold(module: nn.Module, scales: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """Folds the scales of every layer that a Fold of `module` names into its producer (Note
    [Folded smoothing]): the layer's weight columns times s, the producer's rows divided by s.
    Returns the scales still to divide by: `scales` without the folded layers."""
    left = dict(scales)
    for f in folds(module):
        s = left.get(f.consumer)
        if s is None or not bool(((s >= 1 / MAX_FOLDED) & (s <= MAX_FOLDED)).all()):
            continue
        consumer = module.get_submodule(f.consumer)
        producer = module.get_submodule(f.producer)
        if not isinstance(consumer, nn.Linear) or consumer.in_features != s.numel():
            raise ValueError(f"fold: {f.consumer} is no linear of {s.numel()} inputs")
        if isinstance(producer, nn.LayerNorm):
            if f.rows is not None or producer.weight is None or producer.bias is None:
                raise ValueError(f"fold: {f.producer} must be an affine LayerNorm, whole")
            params = [producer.weight, producer.bias]
            first, last = 0, producer.weight.shape[0]
        elif isinstance(producer, nn.Linear):
            first, last = f.rows if f.rows is not None else (0, producer.out_features)
            params = [producer.weight] + ([producer.bias] if producer.bias is not None else [])
        else:
            raise ValueError(f"fold: {f.producer} is neither a LayerNorm nor a linear")
        if last - first != s.numel():
            raise ValueError(f"fold: {f.producer} makes {last - first} values, {f.consumer} "
                             f"reads {s.numel()}")
        for p in params:
            rows = p.data[first:last]
            shape = (-1,) + (1,) * (rows.dim() - 1)
            rows.copy_(rows.to(torch.float32).div(s.to(rows.device).view(shape)).to(p.dtype))
        w = consumer.weight.data
        w.copy_(w.to(torch.float32).mul(s.to(w.device)).to(w.dtype))
        del left[f.consumer]
    return left
