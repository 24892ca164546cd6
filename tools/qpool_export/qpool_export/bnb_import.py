"""Converts the linear layers of a bitsandbytes-quantized checkpoint (a diffusers or transformers
component saved with `quantization_config: {quant_method: bitsandbytes}`) into qpool's formats.

Note [bitsandbytes checkpoints]
A 4-bit layer `L` is stored as L.weight (uint8, the flattened [N, K] weight packed two codes a
byte, the first in the high nibble), L.weight.absmax (one scale per `blocksize` consecutive
elements of the flattened weight; uint8 with double quantization), L.weight.quant_map (the 16
code values), with double quantization L.weight.nested_absmax and L.weight.nested_quant_map, and
L.weight.quant_state.bitsandbytes__nf4 (or __fp4): a JSON document as bytes with shape,
blocksize, dtype and, with double quantization, nested_blocksize and nested_offset. The weight it
stands for is w[i] = quant_map[code i] * absmax[i // blocksize], the absmax of double
quantization being nested_quant_map[absmax[b]] * nested_absmax[b // nested_blocksize] +
nested_offset, all in float32. An 8-bit (LLM.int8) layer is L.weight (int8 [N, K]) and L.SCB
(float32 [N]): w = weight * SCB / 127.

Where the math is the same, the bytes become qpool's without loss: int8 as it is (SCB is qpool's
per-row absmax); NF4 when each row is a whole number of blocks (then blocks never straddle rows,
as in qpool's row-padded layout) and the code is the NF4 code, its double-quantized absmax
expanded to float32 (qpool's nested code is another table; the expanded values are exactly the
ones bitsandbytes multiplies by). FP4, rows that are not a whole number of blocks and other codes
are refused, naming the tensor.
"""

from __future__ import annotations

import json
import os
from typing import Dict, Tuple

import torch

from . import quant
from .import_error import ImportFailure

QUANT_STATE = ".weight.quant_state.bitsandbytes__"


def is_bnb_config(config: Dict[str, object]) -> bool:
    q = config.get("quantization_config")
    return isinstance(q, dict) and q.get("quant_method") == "bitsandbytes"


def read_state_dict(folder: str) -> Dict[str, torch.Tensor]:
    """Every tensor of the component's safetensors files (one file or an index of shards)."""
    from safetensors.torch import load_file

    names = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))
    if not names:
        raise ImportFailure(f"{folder}: no .safetensors file (quantized checkpoints are read "
                            f"from safetensors)")
    state: Dict[str, torch.Tensor] = {}
    for name in names:
        try:
            state.update(load_file(os.path.join(folder, name)))
        except Exception as e:  # noqa: BLE001 - safetensors raises its own types
            raise ImportFailure(f"{os.path.join(folder, name)}: cannot be read: {e}") from None
    return state


def _quant_state(tensor: torch.Tensor, key: str) -> Dict[str, object]:
    try:
        return json.loads(bytes(tensor.to(torch.uint8).flatten().tolist()).decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise ImportFailure(f"tensor '{key}': not a bitsandbytes quant state ({e})") from None


def _need(state: Dict[str, torch.Tensor], key: str, where: str) -> torch.Tensor:
    if key not in state:
        raise ImportFailure(f"{where}: tensor '{key}' is missing")
    return state[key]


def _nf4(state, prefix: str, key: str, where: str) -> Tuple[quant.State, set]:
    qs = _quant_state(state[key], key)
    used = {key, f"{prefix}.weight", f"{prefix}.weight.absmax", f"{prefix}.weight.quant_map"}
    shape, blocksize = qs.get("shape"), qs.get("blocksize")
    if not (isinstance(shape, list) and len(shape) == 2 and isinstance(blocksize, int)):
        raise ImportFailure(f"{where}: tensor '{key}' lacks a 2-D shape and a blocksize")
    n, k = shape
    if k % blocksize:
        raise ImportFailure(f"{where}: layer '{prefix}' has rows of {k} elements, not a whole "
                            f"number of {blocksize}-element blocks; qpool cannot hold its blocks "
                            f"without converting them")
    qmap = _need(state, f"{prefix}.weight.quant_map", where).to(torch.float32)
    if not torch.equal(qmap, quant.nf4_code()):
        raise ImportFailure(f"{where}: tensor '{prefix}.weight.quant_map' is not the NF4 code")
    packed = _need(state, f"{prefix}.weight", where)
    if packed.dtype != torch.uint8 or packed.numel() != (n * k + 1) // 2:
        raise ImportFailure(f"{where}: tensor '{prefix}.weight' holds {packed.numel()} "
                            f"{packed.dtype} values; a [{n}, {k}] NF4 weight packs into "
                            f"{(n * k + 1) // 2} uint8")
    absmax = _need(state, f"{prefix}.weight.absmax", where)
    blocks = n * k // blocksize
    if absmax.numel() != blocks:
        raise ImportFailure(f"{where}: tensor '{prefix}.weight.absmax' has {absmax.numel()} "
                            f"values for {blocks} blocks")
    nested_key = f"{prefix}.weight.nested_absmax"
    if nested_key in state:
        nested = state[nested_key].to(torch.float32).flatten()
        nested_map = _need(state, f"{prefix}.weight.nested_quant_map", where)
        nested_map = nested_map.to(torch.float32).flatten()
        nb = qs.get("nested_blocksize")
        offset = qs.get("nested_offset")
        if not isinstance(nb, int) or not isinstance(offset, (int, float)) or nb < 1:
            raise ImportFailure(f"{where}: tensor '{key}' lacks nested_blocksize and "
                                f"nested_offset for its double-quantized absmax")
        if absmax.dtype != torch.uint8 or nested.numel() != -(-blocks // nb):
            raise ImportFailure(f"{where}: tensors '{prefix}.weight.absmax' and "
                                f"'{nested_key}' do not describe {blocks} double-quantized "
                                f"scales")
        index = torch.arange(blocks) // nb
        absmax_f = nested_map[absmax.flatten().long()] * nested[index] + torch.tensor(
            float(offset), dtype=torch.float32)
        used |= {nested_key, f"{prefix}.weight.nested_quant_map"}
    else:
        absmax_f = absmax.to(torch.float32).flatten()
    empty = torch.empty(0, dtype=torch.float32)
    qstate = {"format": "nf4", "shape": (n, k), "weight": packed.flatten().reshape(n, k // 2),
              "absmax": absmax_f.contiguous(), "code": quant.nf4_code(), "nested_absmax": empty,
              "nested_code": empty.clone(), "offset": empty.clone()}
    return qstate, used


def _int8(state, prefix: str, where: str) -> Tuple[quant.State, set]:
    weight = _need(state, f"{prefix}.weight", where)
    scb = state[f"{prefix}.SCB"].to(torch.float32).flatten()
    if weight.dtype != torch.int8 or weight.dim() != 2 or scb.numel() != weight.shape[0]:
        raise ImportFailure(f"{where}: tensors '{prefix}.weight' and '{prefix}.SCB' are not an "
                            f"int8 [N, K] weight with N row scales")
    empty = torch.empty(0, dtype=torch.float32)
    qstate = {"format": "int8", "shape": tuple(weight.shape), "weight": weight.contiguous(),
              "absmax": scb.contiguous(), "code": empty, "nested_absmax": empty.clone(),
              "nested_code": empty.clone(), "offset": empty.clone()}
    used = {f"{prefix}.weight", f"{prefix}.SCB", f"{prefix}.weight_format"}
    return qstate, used


def convert(state: Dict[str, torch.Tensor], where: str
            ) -> Tuple[Dict[str, torch.Tensor], Dict[str, quant.State]]:
    """(the float32 state dict, every quantized weight dequantized, and {layer prefix: qpool
    quant state}) of a bitsandbytes state dict (Note [bitsandbytes checkpoints])."""
    layers: Dict[str, quant.State] = {}
    used: set = set()
    for key in state:
        if QUANT_STATE in key:
            prefix, fmt = key.split(".weight.quant_state.bitsandbytes__")
            if fmt != "nf4":
                raise ImportFailure(f"{where}: tensor '{key}': bitsandbytes {fmt} weights; qpool "
                                    f"imports nf4 and int8 (LLM.int8) checkpoints")
            layers[prefix], keys = _nf4(state, prefix, key, where)
            used |= keys
        elif key.endswith(".SCB"):
            prefix = key[: -len(".SCB")]
            layers[prefix], keys = _int8(state, prefix, where)
            used |= keys
    if not layers:
        raise ImportFailure(f"{where}: config.json says bitsandbytes, but no tensor is a "
                            f"bitsandbytes-quantized weight")
    floats: Dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if key in used:
            continue
        floats[key] = value.to(torch.float32) if value.is_floating_point() else value
    for prefix, qstate in layers.items():
        floats[f"{prefix}.weight"] = quant.dequantize(qstate)
    return floats, layers


def install(module: torch.nn.Module, layers: Dict[str, quant.State], where: str) -> int:
    """Puts a QuantLinear holding each converted layer's bytes in place of module's nn.Linear of
    the same name; returns how many."""
    for prefix, qstate in layers.items():
        try:
            linear = module.get_submodule(prefix) if prefix else None
        except AttributeError:
            linear = None
        if not isinstance(linear, torch.nn.Linear):
            raise ImportFailure(f"{where}: quantized layer '{prefix}' is not a linear layer of "
                                f"the architecture")
        quant.replace_submodule(module, prefix, quant.QuantLinear(
            linear.in_features, linear.out_features, qstate, linear.bias))
    return len(layers)
