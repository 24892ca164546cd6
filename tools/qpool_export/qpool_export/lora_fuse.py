"""LoRA files fused into a diffusers folder's weights before it is imported (`from-diffusers
--lora FILE[:SCALE]`).

Note [Fused LoRAs]
A pipeline folder serves one set of weights: a LoRA is merged into them at import, as diffusers'
fuse_lora does (W + scale * B A for every layer the file adapts), not applied per request. The
folder's pipeline is loaded in float32 on the CPU, every file is loaded through diffusers'
load_lora_weights (the formats diffusers reads: its own and PEFT's, kohya's and others it
converts) as its own adapter, the adapters are weighted by their scales and fused, and the
components they adapted are saved (float32, under the folder's weight variant) into a temporary
diffusers folder whose other entries link to the source's; the import then reads that folder
like any other. A file none of whose keys adapts a layer of the pipeline is refused, as are
bitsandbytes-quantized components (their weights cannot take a float delta without loss).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import torch

from .diffusers_components import read_json
from .import_error import ImportFailure
from .manifest import sha256_file

PIPELINES = {"sd": "StableDiffusionPipeline", "sdxl": "StableDiffusionXLPipeline",
             "flux": "FluxPipeline"}


@dataclass(frozen=True)
class Lora:
    path: str
    scale: float = 1.0


def parse(text: str) -> Lora:
    """FILE or FILE:SCALE (a finite number); ValueError naming what is wrong."""
    path, scale = text, 1.0
    head, sep, tail = text.rpartition(":")
    if sep and head:
        try:
            scale = float(tail)
        except ValueError:
            scale = None
        if scale is not None:
            path = head
        else:
            scale = 1.0
    if not math.isfinite(scale):
        raise ValueError(f"--lora {text!r}: the scale must be a finite number")
    if not path:
        raise ValueError(f"--lora {text!r}: no file")
    return Lora(path, scale)


def describe(loras: Sequence[Lora]) -> str:
    """The loras for the manifest's header: file name, scale and SHA-256 of each."""
    parts = [f"{os.path.basename(lora.path)} x {lora.scale:g} (sha256 {sha256_file(lora.path)})"
             for lora in loras]
    return "fused LoRA " + ", ".join(parts)


def _check_files(loras: Sequence[Lora]) -> None:
    for lora in loras:
        if not os.path.isfile(lora.path):
            raise ImportFailure(f"--lora {lora.path}: not a file")
        if not lora.path.endswith(".safetensors"):
            raise ImportFailure(f"--lora {lora.path}: qpool reads LoRA weights from .safetensors "
                                f"files")


def _check_full_precision(src: str, components: Sequence[str]) -> None:
    for name in components:
        config = os.path.join(src, name, "config.json")
        if os.path.isfile(config) and "quantization_config" in read_json(config):
            raise ImportFailure(f"--lora: {config} is bitsandbytes-quantized; fuse LoRAs into a "
                                f"full-precision folder (a quantized weight cannot take the "
                                f"LoRA's float update without loss)")


def fused_source(src: str, kind: str, loras: Sequence[Lora], work: str,
                 variant: Optional[str] = None) -> List[str]:
    """Writes to `work` (an empty folder) a diffusers folder equal to `src` with `loras` fused into
    its weights (Note [Fused LoRAs]); returns the components the LoRAs changed."""
    import diffusers

    _check_files(loras)
    index = read_json(os.path.join(src, "model_index.json"))
    models = [name for name, entry in index.items()
              if isinstance(entry, list) and len(entry) == 2 and entry[0] in
              ("diffusers", "transformers") and entry[1] and
              not entry[1].endswith(("Tokenizer", "TokenizerFast", "Scheduler"))]
    _check_full_precision(src, models)
    cls = getattr(diffusers, PIPELINES[kind])
    extra = {"safety_checker": None} if kind == "sd" else {}
    try:
        pipe = cls.from_pretrained(src, torch_dtype=torch.float32, variant=variant, **extra)
    except Exception as e:  # diffusers raises many kinds for a folder it cannot read
        raise ImportFailure(f"--lora: {src} cannot be loaded as a {PIPELINES[kind]}: "
                            f"{type(e).__name__}: {e}") from e
    names = [f"lora_{i}" for i in range(len(loras))]
    adapted: Dict[str, List[str]] = {}
    for lora, name in zip(loras, names):
        before = {c: list(a) for c, a in pipe.get_list_adapters().items()}
        try:
            pipe.load_lora_weights(lora.path, adapter_name=name)
        except Exception as e:
            raise ImportFailure(f"--lora {lora.path}: diffusers cannot load it into this "
                                f"{PIPELINES[kind]}: {type(e).__name__}: "
                                f"{str(e).splitlines()[0] if str(e) else ''}") from e
        now = pipe.get_list_adapters()
        touched = [c for c, a in now.items() if name in a and name not in before.get(c, [])]
        if not touched:
            raise ImportFailure(f"--lora {lora.path}: none of its keys adapts a layer of {src} "
                                f"(a LoRA for another model?)")
        for c in touched:
            adapted.setdefault(c, []).append(name)
    pipe.set_adapters(names, adapter_weights=[lora.scale for lora in loras])
    with torch.no_grad():
        pipe.fuse_lora(components=sorted(adapted), adapter_names=names)
    pipe.unload_lora_weights()

    for entry in os.listdir(src):
        if entry not in adapted:
            os.symlink(os.path.join(src, entry), os.path.join(work, entry))
    for name in sorted(adapted):
        getattr(pipe, name).save_pretrained(os.path.join(work, name), variant=variant,
                                            safe_serialization=True)
    return sorted(adapted)
