"""The components of a diffusers-format pipeline as qpool's trace-clean modules, ready to trace:
each is loaded with diffusers / transformers (or, for a bitsandbytes checkpoint, built from its
config and given the dequantized weights), its weights are loaded strictly into qpool's module of
the same architecture (Note [Importing through qpool's modules] in sd_unet.py), and that module is
checked against the original on random inputs. Kinds `sd` and `sdxl` share these builders; what
differs is which hidden states the text encoders give and the UNet's extra SDXL inputs.
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass, field
from typing import Callable, Dict, Optional, Sequence, Tuple

import torch

from . import bnb_import
from .blocks import fuse_projections
from .clip_text import ClipTextConfig, ClipTextEncoder
from .import_error import ImportFailure, check_weights_match
from .sd_unet import SdUNet, SdUNetConfig
from .sd_vae import SdVaeConfig, SdVaeDecoder
from .stream_import import SourceTensors, Stream, params_on_meta


def read_json(path: str) -> Dict[str, object]:
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except FileNotFoundError:
        raise ImportFailure(f"{path}: missing") from None
    except (OSError, ValueError) as e:
        raise ImportFailure(f"{path}: cannot be read as JSON: {e}") from None
    if not isinstance(value, dict):
        raise ImportFailure(f"{path}: expected a JSON object")
    return value


# Note [Config size bounds]
# diffusers and transformers build a component from its config.json before reading a weight: a
# config declaring 100,000 layers grew the importer by gigabytes before anything failed. Every
# integer of a component's config is bounded first, naming the field: counts of layers, blocks
# and heads at 1024, widths and other sizes at 2^20 (RoPE's theta aside), and lists at 64
# entries, far above any model's.
MAX_COUNT = 1024
MAX_SIZE = 1 << 20
MAX_LIST = 64


def check_config_sizes(config: Dict[str, object], path: str, prefix: str = "") -> None:
    """ImportFailure naming the field of `config` (the file at `path`) whose number is beyond
    Note [Config size bounds]."""
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            check_config_sizes(value, path, f"{name}.")
            continue
        if isinstance(value, list) and len(value) > MAX_LIST:
            raise ImportFailure(f"{path}: field '{name}' has {len(value)} entries; qpool imports "
                                f"at most {MAX_LIST}")
        sized = "channels" in key or key.endswith(("_size", "_dim", "_dims"))
        counted = not sized and any(w in key for w in ("layer", "block", "head", "depth"))
        limit = MAX_COUNT if counted else MAX_SIZE
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, int) and not isinstance(v, bool) and "theta" not in key and \
                    abs(v) > limit:
                raise ImportFailure(f"{path}: field '{name}' is {v}; qpool imports at most "
                                    f"{limit}")


def _load(what: str, loader: Callable[[], torch.nn.Module]) -> torch.nn.Module:
    """Runs a diffusers / transformers loader, turning its errors into ImportFailure naming the
    component folder."""
    try:
        module = loader()
    except ImportFailure:
        raise
    except Exception as e:  # noqa: BLE001 - the libraries raise many types; all mean "cannot load"
        message = str(e).strip().splitlines()
        raise ImportFailure(f"{what}: cannot be loaded: {type(e).__name__}: "
                            f"{message[0] if message else ''}") from None
    return module.eval().float()


# Leaf names of the buffers qpool's modules compute themselves, where the originals compute them
# in forward: the sinusoidal and rotary frequency tables, T5's relative position buckets
# (Note [Relative position buckets] in t5_encoder.py) and the LLM encoders' rotary tables (Note
# [Rotary tables] in llm_encoder.py). No checkpoint holds them.
COMPUTED_BUFFERS = ("freqs", "relative_position_buckets", "rotary_cos", "rotary_sin")


def _load_strict(mirror: torch.nn.Module, state: Dict[str, torch.Tensor], where: str) -> None:
    """Loads `state` into `mirror`; every tensor must match, but for the buffers qpool's modules
    compute themselves (COMPUTED_BUFFERS), which keep the mirror's values when `state` lacks
    them."""
    own = mirror.state_dict()
    state = dict(state)
    for key in own:
        if key.rpartition(".")[2] in COMPUTED_BUFFERS and key not in state:
            state[key] = own[key]
    result = mirror.load_state_dict(state, strict=False)
    check_weights_match(where, list(result.missing_keys), list(result.unexpected_keys))


def _check_same(what: str, want: torch.Tensor, got: torch.Tensor) -> float:
    if got.shape != want.shape:
        raise ImportFailure(f"{what}: qpool's module gives shape {tuple(got.shape)}, diffusers "
                            f"{tuple(want.shape)}")
    diff = (got - want).abs().max().item()
    scale = want.abs().max().item()
    if not diff <= 1e-4 * (1.0 + scale):
        raise ImportFailure(f"{what}: qpool's module differs from the original by {diff:g} "
                            f"(output scale {scale:g}); this architecture is not supported")
    return diff


@dataclass
class Built:
    """One component ready to trace: qpool's module, example inputs for the trace and for the
    second-shape check, what the checks found, and the layers a bitsandbytes checkpoint had
    quantized (installed after the checks, which run on their dequantized weights)."""
    name: str
    module: torch.nn.Module
    trace_inputs: Tuple[torch.Tensor, ...]
    check_inputs: Tuple[torch.Tensor, ...]
    max_diff: float
    prequantized: Dict[str, object] = field(default_factory=dict)
    dtype: Optional[str] = None  # saved in this dtype instead of the import's --dtype
    # Example inputs for --compile where the trace's are not what the server passes (sizes that
    # stay fixed in the package); None: the trace's.
    compile_inputs: Optional[Tuple[torch.Tensor, ...]] = None
    # The latent side a package is compiled at (Note [Compile at the serving size]).
    compile_side: Optional[int] = None
    # Quantized layers' own errors against the float layers (layer_error.py), when asked for.
    layer_errors: Optional[Dict[str, Dict[str, object]]] = None
    # Streamed (Note [Streaming import] in stream_import.py): `module` has its parameters on
    # meta and the weights come from here; max_diff is then None (not measured).
    stream: Optional[Stream] = None
    # Each quantized layer's weight error (quant.weight_error), filled as it is quantized.
    weight_errors: Dict[str, float] = field(default_factory=dict)


def _load_original(where: str, from_pretrained: Callable[[], torch.nn.Module],
                   from_config: Callable[[Dict[str, object]], torch.nn.Module]
                   ) -> Tuple[torch.nn.Module, Dict[str, object]]:
    """The component as diffusers / transformers build it, and the layers of a bitsandbytes
    checkpoint converted to qpool's formats (Note [bitsandbytes checkpoints] in bnb_import.py):
    then the component is built from its config and gets the dequantized weights, so that the
    checks compare float math with float math."""
    config = read_json(os.path.join(where, "config.json"))
    check_config_sizes(config, os.path.join(where, "config.json"))  # before anything is built
    if not bnb_import.is_bnb_config(config):
        return _load(where, from_pretrained), {}
    floats, layers = bnb_import.convert(bnb_import.read_state_dict(where), where)
    plain = {k: v for k, v in config.items() if k != "quantization_config"}
    original = _load(where, lambda: from_config(plain))
    own = set(original.state_dict())
    if not set(floats) <= own:  # transformers 4 checkpoints name CLIP's tensors text_model.*
        floats = {k[len("text_model."):] if k.startswith("text_model.") else k: v
                  for k, v in floats.items()}
        layers = {k[len("text_model."):] if k.startswith("text_model.") else k: v
                  for k, v in layers.items()}
    floats = {k: v for k, v in floats.items() if k in own or not k.endswith("position_ids")}
    _load_strict(original, floats, where)
    return original.eval().float(), layers


def _open_original(where: str, from_pretrained: Callable[[], torch.nn.Module],
                   from_config: Callable[[Dict[str, object]], torch.nn.Module], streamed: bool,
                   variant: Optional[str] = None, source: Optional[SourceTensors] = None
                   ) -> Tuple[torch.nn.Module, Dict[str, object], Optional[SourceTensors]]:
    """_load_original's original and bitsandbytes layers; or, `streamed` and the folder's
    weights in plain safetensors files (Note [Streaming import]), the original built from its
    config with its parameters on meta (for its config and names) and the files to read; or,
    given a `source` (a single file's part, single_file_layouts.MappedTensors), that source."""
    if streamed or source is not None:
        config = read_json(os.path.join(where, "config.json"))
        check_config_sizes(config, os.path.join(where, "config.json"))
        if source is not None or (not bnb_import.is_bnb_config(config) and
                                  SourceTensors.available(where, variant)):
            with params_on_meta():
                original = _load(where, lambda: from_config(config))
            return original, {}, source or SourceTensors(where, variant)
    original, prequantized = _load_original(where, from_pretrained, from_config)
    return original, prequantized, None


def _mirror(make: Callable[[], torch.nn.Module], original_state: Callable[[], Dict[str, object]],
            source: Optional[SourceTensors], where: str,
            graph_transform: Callable[[torch.nn.Module], object] = lambda m: None,
            block_transform: Optional[Callable[[torch.nn.Module], object]] = None,
            candidates: Callable[[str], Sequence[str]] = lambda key: (key,),
            ignored: Callable[[str], bool] = lambda key: False
            ) -> Tuple[torch.nn.Module, Optional[Stream]]:
    """qpool's module (`make()`) given the original's weights and transformed; or, streamed, on
    meta with the Stream that gives each of its blocks the weights and `block_transform` (by
    default graph_transform) later. `candidates`: the source names of one of its tensors;
    `ignored`: the source tensors it never reads."""
    if source is None:
        mirror = make()
        _load_strict(mirror, original_state(), where)
        graph_transform(mirror)
        return mirror, None
    with params_on_meta():
        mirror = make()
    stream = Stream(source, copy.deepcopy(mirror), candidates, ignored,
                    block_transform or graph_transform)
    graph_transform(mirror)
    return mirror, stream


def _strip_text_model(key: str) -> str:
    """transformers' CLIPTextModelWithProjection (and CLIPTextModel checkpoints of transformers
    4) name the text model's tensors text_model.*; qpool's ClipTextEncoder has them at its top."""
    return key[len("text_model."):] if key.startswith("text_model.") else key


def _check_ids(cfg: ClipTextConfig, batch: int, length: int, gen: torch.Generator) -> torch.Tensor:
    """Random token ids, each row with an end-of-text token at a random position when the config
    names one in the vocabulary (where text_embeds are read)."""
    ids = torch.randint(0, cfg.vocab_size, (batch, length), generator=gen)
    if 0 <= cfg.eos_token_id < cfg.vocab_size and cfg.eos_token_id != 2:
        ids[ids == cfg.eos_token_id] = 0
        at = torch.randint(1, length, (batch,), generator=gen)
        ids[torch.arange(batch), at] = cfg.eos_token_id
    return ids


def build_text_encoder(src: str, name: str, kind: str, max_length: int, clip_skip: int,
                       gen: torch.Generator, variant: Optional[str] = None,
                       streamed: bool = False, source: Optional[SourceTensors] = None) -> Built:
    """`name` is the component folder: text_encoder (CLIPTextModel) or, for kind sdxl,
    text_encoder_2 (CLIPTextModelWithProjection, whose module also returns text_embeds). Kind sd
    takes the last hidden state (or, with clip_skip, an earlier one through the final layer
    norm), kind sdxl the penultimate layer's output as StableDiffusionXLPipeline does, kind flux
    CLIPTextModel's pooler output and kind hidream (text_encoder and text_encoder_2, both
    CLIPTextModelWithProjection) text_embeds alone (module docstring of clip_text.py)."""
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    pooler = kind == "flux"  # CLIPTextModel's pooler_output alone (FluxPipeline)
    projected = kind == "hidream"  # text_embeds alone (HiDreamImagePipeline, both CLIPs)
    pooled = name == "text_encoder_2" and not (pooler or projected)
    penultimate = kind == "sdxl"
    cls = CLIPTextModelWithProjection if pooled or projected else CLIPTextModel
    if (pooler or projected) and clip_skip:
        raise ImportFailure(f"--clip-skip {clip_skip}: kind {kind} reads CLIP's pooled output of "
                            f"the last layer and takes no clip skip")
    where = os.path.join(src, name)
    original, prequantized, source = _open_original(
        where, lambda: cls.from_pretrained(where, variant=variant),
        lambda c: cls(CLIPTextConfig.from_dict(c)), streamed, variant, source)
    cfg = ClipTextConfig.from_transformers(original.config.to_dict(),
                                           os.path.join(where, "config.json"))
    if max_length > cfg.max_position_embeddings:
        tokenizer = name.replace("text_encoder", "tokenizer")
        raise ImportFailure(f"{src}/{tokenizer}: model_max_length {max_length} exceeds the text "
                            f"encoder's max_position_embeddings {cfg.max_position_embeddings}")

    def state() -> Dict[str, torch.Tensor]:
        own = {_strip_text_model(k): v for k, v in original.state_dict().items()}
        own.pop("embeddings.position_ids", None)
        return own

    mirror, stream = _mirror(
        lambda: ClipTextEncoder(cfg, skip=clip_skip, penultimate=penultimate, pooled=pooled,
                                pooler=pooler, projected=projected),
        state, source, where, candidates=lambda key: ("text_model." + key, key),
        ignored=lambda key: key.endswith("position_ids"))
    ids = _check_ids(cfg, 2, max_length, gen)

    @torch.no_grad()
    def compare() -> float:
        out = original(ids, output_hidden_states=True)
        if pooler:
            want = out.pooler_output
        elif projected:
            want = out.text_embeds
        elif penultimate:
            want = out.hidden_states[-(clip_skip + 2)]
        elif clip_skip == 0:
            want = out.last_hidden_state
        else:
            final_norm = getattr(original, "text_model", original).final_layer_norm
            want = final_norm(out.hidden_states[-(clip_skip + 1)])
        got = mirror(ids)
        if pooled:
            return max(_check_same(where, want, got[0]),
                       _check_same(f"{where} (text_embeds)", out.text_embeds, got[1]))
        return _check_same(where, want, got)

    # Note [Streaming import]: a streamed encoder has no weights here to compare.
    diff = compare() if stream is None else None
    # Layers past the hidden states' never run unless text_embeds need them: drop their weights
    # (and the bitsandbytes layers among them).
    mirror.drop_unused()
    kept = {n for n, _ in mirror.named_modules()}
    layers = {_strip_text_model(k): v for k, v in prequantized.items()}
    layers = {k: v for k, v in layers.items() if k in kept}
    second = (_check_ids(cfg, 3, max_length, gen),)
    return Built(name, mirror, (ids,), second, diff, layers, stream=stream)


ADDITION = {"sd": None, "sdxl": "text_time"}  # the UNet's addition_embed_type per kind
TIME_IDS = 6  # SDXL's micro-conditioning: original size, crop top-left, target size


def build_unet(src: str, kind: str, context: Tuple[int, int], pooled_dim: int,
               gen: torch.Generator, variant: Optional[str] = None,
               streamed: bool = False, source: Optional[SourceTensors] = None) -> Built:
    """`context` is (tokens, width) of the text encoders' hidden states; `pooled_dim` the width
    of text_embeds (kind sdxl; 0 for sd)."""
    from diffusers import UNet2DConditionModel

    where = os.path.join(src, "unet")
    config_path = os.path.join(where, "config.json")
    # Checked before diffusers builds the UNet: another kind's embedding would fail there, with a
    # message about its weights rather than the field.
    addition = read_json(config_path).get("addition_embed_type")
    if addition != ADDITION[kind]:
        hint = {"sd": " (SDXL's 'text_time' comes with StableDiffusionXLPipeline, kind sdxl)",
                "sdxl": ""}[kind]
        raise ImportFailure(f"{config_path}: field 'addition_embed_type' is {addition!r}; kind "
                            f"{kind} imports {ADDITION[kind]!r}{hint}")
    original, prequantized, source = _open_original(
        where, lambda: UNet2DConditionModel.from_pretrained(where, variant=variant),
        UNet2DConditionModel.from_config, streamed, variant, source)
    cfg = SdUNetConfig.from_diffusers(dict(original.config), config_path)
    length, width = context
    if width != cfg.cross_attention_dim:
        raise ImportFailure(f"{config_path}: field 'cross_attention_dim' is "
                            f"{cfg.cross_attention_dim}; the text encoders give {width}")
    text_time = cfg.addition_embed_type == "text_time"
    if text_time and (cfg.projection_class_embeddings_input_dim
                      != pooled_dim + TIME_IDS * cfg.addition_time_embed_dim):
        raise ImportFailure(
            f"{config_path}: field 'projection_class_embeddings_input_dim' is "
            f"{cfg.projection_class_embeddings_input_dim}; text_encoder_2's projection_dim "
            f"{pooled_dim} plus {TIME_IDS} time ids of addition_time_embed_dim "
            f"{cfg.addition_time_embed_dim} give "
            f"{pooled_dim + TIME_IDS * cfg.addition_time_embed_dim}")
    # A bitsandbytes checkpoint's layers keep their names; the others' projections are fused
    # (Note [Fused projections]).
    mirror, stream = _mirror(lambda: SdUNet(cfg), original.state_dict, source, where,
                             (lambda m: None) if prequantized else fuse_projections)
    levels = 2 ** (len(cfg.block_out_channels) - 1)

    def inputs(batch: int, h: int, w: int) -> Tuple[torch.Tensor, ...]:
        plain = (torch.randn(batch, cfg.in_channels, h, w, generator=gen),
                 torch.randint(0, 1000, (batch,), generator=gen).float(),
                 torch.randn(batch, length, width, generator=gen))
        if not text_time:
            return plain
        return plain + (torch.randn(batch, pooled_dim, generator=gen),
                        torch.randint(0, 2048, (batch, TIME_IDS), generator=gen).float())

    def diffusers_unet(args: Tuple[torch.Tensor, ...]) -> torch.Tensor:
        if not text_time:
            return original(*args).sample
        return original(*args[:3], added_cond_kwargs={"text_embeds": args[3],
                                                      "time_ids": args[4]}).sample

    # A latent that is not a multiple of the UNet's downscale: the upsamplers then take their
    # skip's size, which covers every size (Note [Shapes are not baked] in tracing.py).
    side = levels * 2 + 1
    trace_inputs = inputs(2, side, side + levels)
    even = inputs(1, levels * 2, levels * 2)
    diff = None  # Note [Streaming import]: a streamed UNet has no weights here to compare
    if stream is None:
        with torch.no_grad():
            diff = _check_same(where, diffusers_unet(trace_inputs), mirror(*trace_inputs))
            diff = max(diff, _check_same(where, diffusers_unet(even), mirror(*even)))
    return Built("unet", mirror, trace_inputs, inputs(1, levels * 3, levels * 2 + 3), diff,
                 prequantized, stream=stream)


# The tensors of an AutoencoderKL that its decoder reads.
DECODER_KEYS = ("decoder.", "post_quant_conv.")
# The names diffusers' attention had in older VAE checkpoints, which from_pretrained converts.
_DEPRECATED_ATTENTION = ((".to_q.", ".query."), (".to_k.", ".key."), (".to_v.", ".value."),
                         (".to_out.0.", ".proj_attn."))


def _vae_candidates(key: str) -> Tuple[str, ...]:
    return (key,) + tuple(key.replace(new, old) for new, old in _DEPRECATED_ATTENTION
                          if new in key)


def build_vae_decoder(src: str, kind: str, gen: torch.Generator, variant: Optional[str] = None,
                      dtype: torch.dtype = torch.float16, streamed: bool = False,
                      source: Optional[SourceTensors] = None) -> Tuple[Built, SdVaeConfig]:
    """The decoder, saved in `dtype` (the import's) or in float32 where StableDiffusionXLPipeline
    decodes in float32: an SDXL VAE whose config says force_upcast (it overflows in float16),
    given float16."""
    from diffusers import AutoencoderKL

    where = os.path.join(src, "vae")
    original, prequantized, source = _open_original(
        where, lambda: AutoencoderKL.from_pretrained(where, variant=variant),
        AutoencoderKL.from_config, streamed, variant, source)
    cfg = SdVaeConfig.from_diffusers(dict(original.config), os.path.join(where, "config.json"))
    if cfg.shift_factor != 0.0 and kind not in ("flux", "hidream"):
        raise ImportFailure(f"{where}/config.json: field 'shift_factor' is {cfg.shift_factor}; "
                            f"kind {kind} imports VAEs without one")
    upcast = kind == "sdxl" and cfg.force_upcast and dtype == torch.float16
    # A float32 decoder's 1x1 shortcuts stay cuDNN convolutions, which run in TF32 as diffusers'
    # do; as GEMMs they would be float32 products without tensor cores.
    mirror, stream = _mirror(
        lambda: SdVaeDecoder(cfg, gemm_shortcuts=not upcast and dtype != torch.float32),
        lambda: {k: v for k, v in original.state_dict().items() if k.startswith(DECODER_KEYS)},
        source, where, candidates=_vae_candidates,
        ignored=lambda key: not key.startswith(DECODER_KEYS))
    z = torch.randn(1, cfg.latent_channels, 6, 5, generator=gen)
    diff = None  # Note [Streaming import]: a streamed decoder has no weights here to compare
    if stream is None:
        with torch.no_grad():
            diff = _check_same(where, original.decode(z).sample, mirror(z))
    second = (torch.randn(2, cfg.latent_channels, 4, 7, generator=gen),)
    layers = {k: v for k, v in prequantized.items() if k.startswith("decoder.")
              or k.startswith("post_quant_conv.")}
    built = Built("vae_decoder", mirror, (z,), second, diff, layers, stream=stream)
    if upcast:
        built.dtype = "float32"  # the server keeps a component in its manifest entry's dtype
    return built, cfg

