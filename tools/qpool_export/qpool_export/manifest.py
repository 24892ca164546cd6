"""pipeline.yaml for an exported pipeline (fields and layout: docs/model-repository.md)."""

from __future__ import annotations

import hashlib
import os
from typing import Dict, Optional

import yaml

from .presets import COMPONENTS, Preset

# SD 1.x scheduler config (diffusers' PNDM/DDIM config of runwayml/stable-diffusion-v1-5).
SD_SCHEDULER = {
    "num_train_timesteps": 1000,
    "beta_start": 0.00085,
    "beta_end": 0.012,
    "beta_schedule": "scaled_linear",
    "timestep_spacing": "leading",
    "steps_offset": 1,
    "prediction_type": "epsilon",
}
SD_SCALING_FACTOR = 0.18215


def quantization_section(fmt: str, blocksize: int, double_quant: bool,
                         skip: tuple = (), min_weights: int = 0) -> Dict[str, object]:
    """The `quantization:` mapping of one component (only the keys its format accepts)."""
    q: Dict[str, object] = {"format": fmt}
    if fmt == "nf4":
        q["blocksize"] = blocksize
        q["double_quant"] = bool(double_quant)
    if skip:
        q["skip"] = list(skip)
    if min_weights:
        q["min_weights"] = int(min_weights)
    return q


def build_manifest(preset: Preset, quantization: Optional[Dict[str, Dict[str, object]]] = None,
                   max_length: int = 77) -> Dict[str, object]:
    """The manifest as a dict; `quantization` maps component name -> quantization section."""
    quantization = quantization or {}
    components: Dict[str, object] = {}
    for name in COMPONENTS:
        entry = component_entry(name)
        if name in quantization:
            entry["quantization"] = quantization[name]
        components[name] = entry
    return {
        "kind": "sd",
        "components": components,
        "tokenizer": {"vocab": "tokenizer/vocab.json", "merges": "tokenizer/merges.txt",
                      "max_length": max_length},
        "scheduler": dict(SD_SCHEDULER),
        "latent": {"channels": preset.unet.in_channels,
                   "downscale": preset.vae_decoder.downscale,
                   "scaling_factor": SD_SCALING_FACTOR},
        "defaults": dict(preset.defaults),
        "limits": dict(preset.limits),
        "placement": {"device": "auto", "dtype": "auto"},
    }


def component_entry(name: str) -> Dict[str, object]:
    """A component's manifest entry before its digests: its graph and the weights file beside it
    (Note [Weights beside the graph] in server/component/weights_file.h)."""
    return {"file": f"{name}.pt", "weights": {"file": f"{name}.safetensors"}}


def sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(4 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def record_digests(manifest: Dict[str, object], folder: str) -> Dict[str, object]:
    """Each component's `sha256` (of its file in `folder`) after its `file`: the server checks
    it at load (docs/model-repository.md)."""
    components = manifest["components"]
    for name, entry in list(components.items()):
        digest = sha256_file(os.path.join(folder, entry["file"]))
        ordered = {"file": entry["file"], "sha256": digest}
        weights = entry.get("weights")
        if weights is not None:
            ordered["weights"] = {"file": weights["file"],
                                  "sha256": sha256_file(os.path.join(folder, weights["file"]))}
        ordered.update((k, v) for k, v in entry.items() if k not in ordered)
        components[name] = ordered
    return manifest


def dump_manifest(manifest: Dict[str, object], header: str = "") -> str:
    """YAML text in the documented key order, with an optional comment header."""
    body = yaml.safe_dump(manifest, sort_keys=False, default_flow_style=False)
    lines = "".join(f"# {line}\n" for line in header.splitlines())
    return lines + body
