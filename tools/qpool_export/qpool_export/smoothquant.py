"""SmoothQuant calibration for w8a8 layers (Xiao et al., "SmoothQuant", 2023).

A w8a8 layer quantizes each row of its input to int8, so a few input channels with large
activations waste the row's 255 levels on themselves. Per-input-channel scales
s_k = max|X_k|^alpha / max|W_k|^(1 - alpha) move that range into the weight: the layer stores
int8(w * s) and divides x by s before quantizing it (docs/quantization.md, w8a8), which leaves
x w^T unchanged. The maxima come from forward passes over calibration inputs.
"""

from typing import Dict, Iterable, Sequence

import torch
from torch import nn

from .linear_hooks import observe_linears

# Floor of maxima and scales: a channel that is always zero keeps a finite, positive scale.
EPS = 1e-5


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
