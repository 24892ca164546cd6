"""Tests of qpool_export's FLUX modules (flux_transformer.py, t5_encoder.py) and their builders
(flux_components.py) on tiny random FluxTransformer2DModel / T5EncoderModel checkpoints written
with diffusers / transformers: the mirrors equal the originals, trace at one shape and run at
another, hold no tensor constants, keep the seven-input contract, keep their frequency tables
float32 in a bfloat16 export, quantize, and refuse configs they do not reproduce, naming the
field. CPU only, well under a minute.

Run: .venv/bin/python -m pytest -q -p no:cacheprovider tests/python/test_flux_modules.py
"""

import copy
import io
import json
import os
import sys
import warnings

import pytest
import torch

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tools", "qpool_export"))

pytest.importorskip("diffusers")
pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

from qpool_export import quant, tracing  # noqa: E402
from qpool_export.flux_components import build_flux_transformer, build_t5_encoder  # noqa: E402
from qpool_export.flux_transformer import FluxTransformerConfig  # noqa: E402
from qpool_export.import_steps import to_dtype  # noqa: E402
from qpool_export.import_error import ImportFailure  # noqa: E402
from qpool_export.t5_encoder import T5EncoderConfig  # noqa: E402

torch.set_num_threads(1)  # tiny ops: one thread is fastest

FORWARD_INPUTS = ["hidden_states", "encoder_hidden_states", "pooled_projections", "timestep",
                  "img_ids", "txt_ids", "guidance"]
T5_WIDTH, T5_TOKENS, POOLED = 32, 16, 32
FLUX_CONFIGS = {
    "dev": dict(num_layers=2, num_single_layers=2, attention_head_dim=16, num_attention_heads=2,
                joint_attention_dim=T5_WIDTH, pooled_projection_dim=POOLED, in_channels=16,
                guidance_embeds=True, axes_dims_rope=[4, 6, 6]),
    "schnell": dict(num_layers=1, num_single_layers=2, attention_head_dim=16,
                    num_attention_heads=2, joint_attention_dim=T5_WIDTH,
                    pooled_projection_dim=POOLED, in_channels=64, guidance_embeds=False,
                    axes_dims_rope=[4, 6, 6]),
}
T5_CONFIG = dict(vocab_size=99, d_model=T5_WIDTH, d_kv=8, d_ff=40, num_layers=2, num_heads=4,
                 relative_attention_num_buckets=8, relative_attention_max_distance=12)


def _perturb(model, gen):
    """Random norm weights (the checkpoints initialize them to ones, which would hide a swapped
    or missing norm)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and "norm" in name and name.endswith("weight"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3 + 1)


def write_flux(folder, name):
    from diffusers import FluxTransformer2DModel

    gen = torch.Generator().manual_seed(1)
    torch.manual_seed(1)
    model = FluxTransformer2DModel(**FLUX_CONFIGS[name])
    _perturb(model, gen)
    model.save_pretrained(os.path.join(folder, "transformer"))
    return str(folder)


def write_t5(folder, feed_forward):
    from transformers import T5Config, T5EncoderModel

    gen = torch.Generator().manual_seed(2)
    torch.manual_seed(2)
    model = T5EncoderModel(T5Config(feed_forward_proj=feed_forward, **T5_CONFIG))
    _perturb(model, gen)
    model.save_pretrained(os.path.join(folder, "text_encoder_2"))
    return str(folder)


def quiet_load(traced):
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.jit.save(traced, buffer)
        buffer.seek(0)
        return torch.jit.load(buffer)


@pytest.fixture(scope="module", params=sorted(FLUX_CONFIGS))
def flux(request, tmp_path_factory):
    src = write_flux(tmp_path_factory.mktemp(request.param), request.param)
    built, cfg = build_flux_transformer(src, (T5_TOKENS, T5_WIDTH), POOLED,
                                        torch.Generator().manual_seed(0))
    traced = tracing.trace(built.module, built.trace_inputs)
    return {"name": request.param, "src": src, "built": built, "cfg": cfg, "traced": traced}


@pytest.fixture(scope="module", params=["gated-gelu", "relu"])
def t5(request, tmp_path_factory):
    src = write_t5(tmp_path_factory.mktemp(request.param), request.param)
    built = build_t5_encoder(src, 24, torch.Generator().manual_seed(0))
    return {"src": src, "built": built, "traced": tracing.trace(built.module,
                                                                  built.trace_inputs)}


# --- transformer -----------------------------------------------------------------------------


def test_transformer_equals_diffusers(flux):
    built, cfg = flux["built"], flux["cfg"]
    assert built.name == "transformer"
    assert cfg.guidance_embeds == (flux["name"] == "dev")
    assert built.max_diff < 1e-5


def test_transformer_equals_diffusers_at_another_shape(flux):
    """The builder compares at one shape; here at the check shape, with FluxPipeline's ids."""
    from diffusers import FluxTransformer2DModel

    original = FluxTransformer2DModel.from_pretrained(os.path.join(flux["src"], "transformer"))
    args = flux["built"].check_inputs
    with torch.no_grad():
        want = original(*args[:6], guidance=args[6] if flux["cfg"].guidance_embeds else None,
                        return_dict=False)[0]
        got = flux["built"].module(*args)
    assert (got - want).abs().max().item() < 1e-5


def test_trace_inputs_differ_in_every_dimension(flux):
    a, b = flux["built"].trace_inputs, flux["built"].check_inputs
    assert a[0].shape[0] != b[0].shape[0]  # B
    assert a[0].shape[1] != b[0].shape[1]  # S
    assert a[1].shape[1] != b[1].shape[1]  # L
    assert a[4].shape == (a[0].shape[1], 3) and a[5].shape == (a[1].shape[1], 3)
    assert all(t.dtype == torch.float32 for t in a[3:])


def test_traced_transformer_equals_eager_at_another_shape(flux):
    built = flux["built"]
    tracing.check_no_tensor_constants(built.name, flux["traced"])
    assert tracing.check_matches_eager(built.name, built.module, flux["traced"],
                                       built.check_inputs) < 1e-5


def test_traced_schema_keeps_the_seven_inputs(flux):
    """guidance stays an input without guidance_embeds (Note [The unused guidance input])."""
    loaded = quiet_load(flux["traced"])
    schema = loaded._c._get_method("forward").schema
    assert [a.name for a in schema.arguments] == ["self"] + FORWARD_INPUTS
    args = flux["built"].check_inputs
    with torch.no_grad():
        other_guidance = loaded(*args[:6], args[6] + 2)
        same = loaded(*args)
    assert torch.equal(same, flux["traced"](*args))
    assert torch.equal(other_guidance, same) != flux["cfg"].guidance_embeds


def test_freqs_buffers_stay_float32_in_a_bfloat16_export(flux):
    cfg = flux["cfg"]
    traced = quiet_load(flux["traced"])
    to_dtype(traced, torch.bfloat16)
    freqs = {n: b for n, b in traced.named_buffers() if n.rpartition(".")[2] == "freqs"}
    assert set(freqs) == {"time_text_embed.time_proj.freqs", "pos_embed.axes.0.freqs",
                          "pos_embed.axes.1.freqs", "pos_embed.axes.2.freqs"}
    assert all(b.dtype == torch.float32 for b in freqs.values())
    assert [freqs[f"pos_embed.axes.{i}.freqs"].numel() for i in range(3)] == \
        list(cfg.axes_dims_rope)
    assert all(p.dtype == torch.bfloat16 for p in traced.parameters())
    # Activations in bfloat16; timestep, ids and guidance stay float32.
    args = flux["built"].check_inputs
    half = tuple(a.bfloat16() for a in args[:3]) + args[3:]
    with torch.no_grad():
        got = traced(*half)
        want = flux["built"].module(*args)
    assert got.dtype == torch.bfloat16
    assert (got.float() - want).norm() / want.norm() < 0.05


def test_imported_transformer_has_fused_projections(flux):
    """Note [Fused projections]: one linear per input in every block, named so, and the same
    numbers as the separate linears (an unfused copy of the same weights)."""
    from qpool_export.flux_transformer import FluxTransformer

    module, cfg = flux["built"].module, flux["cfg"]
    names = {n for n, m in module.named_modules() if isinstance(m, torch.nn.Linear)}
    inner, mlp = cfg.inner_dim, cfg.inner_dim * 4
    for i in range(cfg.num_layers):
        assert {f"transformer_blocks.{i}.attn.to_qkv", f"transformer_blocks.{i}.attn.add_qkv"} \
            <= names
        assert module.transformer_blocks[i].attn.to_qkv.out_features == 3 * inner
    for i in range(cfg.num_single_layers):
        fused = module.single_transformer_blocks[i].to_qkv_mlp
        assert (fused.in_features, fused.out_features) == (inner, 3 * inner + mlp)
    assert not [n for n in names if n.endswith(("to_q", "to_k", "to_v", "proj_mlp",
                                                "add_q_proj", "add_k_proj", "add_v_proj"))]
    # The same weights unfused: built from the checkpoint's state dict, loaded strictly.
    from diffusers import FluxTransformer2DModel

    original = FluxTransformer2DModel.from_pretrained(os.path.join(flux["src"], "transformer"))
    separate = FluxTransformer(cfg)
    own = dict(module.named_buffers())
    missing = separate.load_state_dict(original.state_dict(), strict=False)
    assert set(missing.missing_keys) <= set(own) and not missing.unexpected_keys
    for name in missing.missing_keys:
        owner, _, leaf = name.rpartition(".")
        setattr(separate.get_submodule(owner), leaf, own[name])
    args = flux["built"].check_inputs
    with torch.no_grad():
        assert (module(*args) - separate(*args)).abs().max().item() < 1e-5
    assert separate.fuse_projections() == cfg.num_layers + cfg.num_single_layers
    with torch.no_grad():
        assert torch.equal(module(*args), separate(*args))


def test_traced_transformer_norms_and_rotates_q_and_k_with_one_op(flux):
    """Note [Normed rotary embedding op]: q and k of every block, of both streams in the
    double-stream blocks, go through one qpool::rms_rope each in the traced graph (the server's
    one-pass kernel): no RMS norm, rotation or concatenation of q or k is left outside it."""
    cfg = flux["cfg"]
    kinds = [n.kind() for n in flux["traced"].inlined_graph.nodes()]
    assert kinds.count("qpool::rms_rope") == 2 * (cfg.num_layers + cfg.num_single_layers)
    assert "aten::rms_norm" not in kinds and "qpool::rope" not in kinds
    assert "aten::stack" not in kinds
    # Note [Joined GELU op]: every single-stream block joins its attention and GELU'd MLP in one.
    assert kinds.count("qpool::cat_gelu") == cfg.num_single_layers
    assert kinds.count("aten::gelu") == 2 * cfg.num_layers  # the double blocks' feed-forwards
    # Note [Modulated norm op]: four per double-stream block, one per single-stream block, one at
    # the output; no LayerNorm outside them.
    assert kinds.count("qpool::ada_norm") == 4 * cfg.num_layers + cfg.num_single_layers + 1
    assert "aten::layer_norm" not in kinds


def test_ada_norm_equals_diffusers_modulation():
    """qpool::ada_norm's reference against diffusers' AdaLayerNormZero arithmetic,
    norm(x) * (1 + scale[:, None]) + shift[:, None]: equal up to the one rounding addcmul saves
    in float32; the unfused addcmul form bit for bit in bfloat16."""
    from qpool_export.flux_transformer import NORM_EPS

    gen = torch.Generator().manual_seed(11)
    norm = torch.nn.LayerNorm(24, elementwise_affine=False, eps=NORM_EPS)
    x = torch.randn(2, 5, 24, generator=gen) * 3 + 1
    shift, scale = torch.randn(2, 24, generator=gen), torch.randn(2, 24, generator=gen)
    got = torch.ops.qpool.ada_norm(x, shift, scale, NORM_EPS)
    assert torch.allclose(got, norm(x) * (1 + scale[:, None]) + shift[:, None], atol=1e-6)
    xb, sb, cb = x.bfloat16(), shift.bfloat16(), scale.bfloat16()
    want = torch.addcmul(sb[:, None], norm(xb), 1 + cb[:, None])
    assert torch.equal(torch.ops.qpool.ada_norm(xb, sb, cb, NORM_EPS), want)


def test_cat_gelu_equals_diffusers_join():
    """qpool::cat_gelu's reference is diffusers' single-stream join: torch.cat of the attention
    output and nn.GELU(approximate="tanh") of the MLP branch, bit for bit."""
    gen = torch.Generator().manual_seed(10)
    for dtype in (torch.float32, torch.bfloat16):
        fused = torch.randn(2, 5, 4 * 8 + 32, generator=gen).to(dtype)
        a, b = torch.randn(2, 5, 16, generator=gen).to(dtype), fused[..., 32:]
        want = torch.cat([a, torch.nn.GELU(approximate="tanh")(b)], dim=2)
        got = torch.ops.qpool.cat_gelu(a, b)
        assert got.dtype == dtype and torch.equal(got, want), dtype


def test_rms_rope_equals_diffusers_norms_and_rotation():
    """qpool::rms_rope's reference against diffusers' operations: torch.nn.RMSNorm per stream,
    the streams joined (text first), apply_rotary_emb; and qpool::rope against the rotation
    alone (Note [Rotary embedding op]), which earlier exports still call."""
    from diffusers.models.embeddings import apply_rotary_emb
    from qpool_export.flux_transformer import NORM_EPS, apply_rope

    gen = torch.Generator().manual_seed(9)
    angles = torch.rand(1, 7, 1, 16, generator=gen) * 30
    tables = (angles.cos()[0, :, 0], angles.sin()[0, :, 0])
    for dtype in (torch.float32, torch.bfloat16):
        text, image = (torch.randn(2, n, 3, 16, generator=gen).to(dtype) for n in (2, 5))
        norms = [torch.nn.RMSNorm(16, eps=NORM_EPS).to(dtype) for _ in range(2)]
        for norm in norms:
            torch.nn.init.normal_(norm.weight, generator=gen)
        with torch.no_grad():
            joined = torch.cat([norms[0](text), norms[1](image)], dim=1)
            want = apply_rotary_emb(joined, tables, sequence_dim=1)
            got = torch.ops.qpool.rms_rope([text, image], [n.weight for n in norms], NORM_EPS,
                                           angles.cos(), angles.sin())
        assert got.dtype == dtype and torch.equal(got, want), dtype
        assert torch.equal(apply_rope(joined, angles.cos(), angles.sin()), want), dtype


@pytest.mark.parametrize("fmt", ["int8", "nf4", "w8a8"])
def test_quantizing_a_fused_weight_equals_quantizing_its_parts(fmt):
    """Note [Fused projections]: per-row (int8, w8a8) and per-block (nf4, rows a multiple of
    the block) quantization of the concatenated weight is the concatenation of the parts'."""
    gen = torch.Generator().manual_seed(5)
    parts = [torch.randn(n, 128, generator=gen) for n in (48, 48, 48, 192)]
    whole = quant.quantize(torch.cat(parts), fmt)
    each = [quant.quantize(p, fmt) for p in parts]
    for name in ("weight", "absmax"):
        assert torch.equal(whole[name], torch.cat([e[name] for e in each])), name
    assert torch.equal(whole["code"], each[0]["code"])


@pytest.mark.parametrize("fmt, bound", [("int8", 0.05), ("nf4", 0.3)])
def test_quantized_transformer_traces_and_stays_close(flux, fmt, bound):
    built = flux["built"]
    module = copy.deepcopy(built.module)
    assert quant.quantize_module(module, fmt) == sum(
        isinstance(m, torch.nn.Linear) for m in built.module.modules())
    traced = tracing.trace(module, built.trace_inputs)
    tracing.check_no_tensor_constants(built.name, traced)
    with torch.no_grad():
        got = traced(*built.check_inputs)
        want = built.module(*built.check_inputs)
    assert got.shape == want.shape
    assert (got - want).norm() / want.norm() < bound


def test_flux_bitsandbytes_checkpoint_imports(tmp_path):
    """An LLM.int8 checkpoint: the builder compares with the dequantized weights and hands the
    int8 layers over."""
    src = write_flux(tmp_path, "schnell")
    layers = ["single_transformer_blocks.0.proj_mlp", "transformer_blocks.0.attn.to_q"]
    _quantize_int8(os.path.join(src, "transformer"), layers)
    built, _ = build_flux_transformer(src, (T5_TOKENS, T5_WIDTH), POOLED,
                                      torch.Generator().manual_seed(0))
    assert sorted(built.prequantized) == sorted(layers)
    assert built.max_diff < 1e-5


def test_context_mismatches_name_the_field(tmp_path):
    src = write_flux(tmp_path, "schnell")
    gen = torch.Generator().manual_seed(0)
    with pytest.raises(ImportFailure, match="'joint_attention_dim' is 32; text_encoder_2 gives 48"):
        build_flux_transformer(src, (T5_TOKENS, 48), POOLED, gen)
    with pytest.raises(ImportFailure, match="'pooled_projection_dim' is 32.*are 64 wide"):
        build_flux_transformer(src, (T5_TOKENS, T5_WIDTH), 64, gen)


FLUX_BAD = [
    ({"patch_size": 2}, "'patch_size' is 2"),
    ({"axes_dims_rope": [4, 6, 4]}, "'axes_dims_rope'"),
    ({"axes_dims_rope": [3, 7, 6]}, "'axes_dims_rope'"),
    ({"axes_dims_rope": [4, 12]}, "'axes_dims_rope'"),
    ({"guidance_embeds": "yes"}, "'guidance_embeds'"),
    ({"num_attention_heads": 0}, "'num_attention_heads' is 0"),
    ({"in_channels": 16.0}, "'in_channels' is 16.0"),
    ({"out_channels": True}, "'out_channels' is True"),
    ({"joint_attention_dim": None}, "'joint_attention_dim' is None"),
    ({"qk_norm": "layer_norm"}, "'qk_norm' is not one of"),
]


@pytest.mark.parametrize("change, message", FLUX_BAD)
def test_bad_transformer_configs_are_refused_naming_the_field(change, message):
    config = {**FLUX_CONFIGS["dev"], "_class_name": "FluxTransformer2DModel", **change}
    with pytest.raises(ImportFailure, match=f"^transformer/config.json: field {message}"):
        FluxTransformerConfig.from_diffusers(config, "transformer/config.json")


def test_real_flux_configs_are_accepted():
    dev = {"_class_name": "FluxTransformer2DModel", "_diffusers_version": "0.30.0",
           "attention_head_dim": 128, "axes_dims_rope": [16, 56, 56], "guidance_embeds": True,
           "in_channels": 64, "joint_attention_dim": 4096, "num_attention_heads": 24,
           "num_layers": 19, "num_single_layers": 38, "patch_size": 1,
           "pooled_projection_dim": 768, "out_channels": None}
    cfg = FluxTransformerConfig.from_diffusers(dev, "dev")
    assert (cfg.inner_dim, cfg.out_channels, cfg.guidance_embeds) == (3072, 64, True)
    schnell = FluxTransformerConfig.from_diffusers({**dev, "guidance_embeds": False}, "schnell")
    assert not schnell.guidance_embeds


def test_bad_transformer_checkpoint_config_fails_before_diffusers_loads_it(tmp_path):
    src = write_flux(tmp_path, "schnell")
    path = os.path.join(src, "transformer", "config.json")
    with open(path, encoding="utf-8") as f:
        config = json.load(f)
    config["axes_dims_rope"] = [4, 4, 4]
    with open(path, "w", encoding="utf-8") as f:
        json.dump(config, f)
    with pytest.raises(ImportFailure, match="config.json: field 'axes_dims_rope'"):
        build_flux_transformer(src, (T5_TOKENS, T5_WIDTH), POOLED, torch.Generator())


# --- T5 --------------------------------------------------------------------------------------


def test_t5_equals_transformers(t5):
    built = t5["built"]
    assert built.name == "text_encoder_2"
    assert built.max_diff < 1e-5
    assert built.trace_inputs[0].dtype == torch.int64


def test_traced_t5_equals_eager_at_another_shape(t5):
    built, traced = t5["built"], t5["traced"]
    assert built.trace_inputs[0].shape != built.check_inputs[0].shape
    tracing.check_no_tensor_constants(built.name, traced)
    assert tracing.check_matches_eager(built.name, built.module, traced,
                                       built.check_inputs) < 1e-5
    schema = quiet_load(traced)._c._get_method("forward").schema
    assert [a.name for a in schema.arguments] == ["self", "input_ids"]


def test_t5_keeps_transformers_names_and_the_tied_embedding(t5):
    from transformers import T5EncoderModel

    original = T5EncoderModel.from_pretrained(os.path.join(t5["src"], "text_encoder_2"))
    state = t5["built"].module.state_dict()
    assert set(state) == set(original.state_dict()) | {"encoder.relative_position_buckets"}
    loaded = quiet_load(t5["traced"])
    assert loaded.shared.weight.data_ptr() == loaded.encoder.embed_tokens.weight.data_ptr()
    to_dtype(loaded, torch.bfloat16)
    assert loaded.encoder.embed_tokens.weight.dtype == torch.bfloat16
    assert loaded.encoder.relative_position_buckets.dtype == torch.int64
    ids = t5["built"].check_inputs
    with torch.no_grad():
        got, want = loaded(*ids), t5["built"].module(*ids)
    assert got.dtype == torch.bfloat16
    assert (got.float() - want).norm() / want.norm() < 0.05


@pytest.mark.parametrize("fmt, bound", [("int8", 0.05), ("nf4", 0.3)])
def test_quantized_t5_traces_and_stays_close(t5, fmt, bound):
    built = t5["built"]
    module = copy.deepcopy(built.module)
    quant.quantize_module(module, fmt)
    traced = tracing.trace(module, built.trace_inputs)
    tracing.check_no_tensor_constants(built.name, traced)
    with torch.no_grad():
        got, want = traced(*built.check_inputs), built.module(*built.check_inputs)
    assert (got - want).norm() / want.norm() < bound


def test_t5_bitsandbytes_checkpoint_with_one_embedding_imports(tmp_path):
    """transformers saves the tied embedding once; built from its config (bitsandbytes path),
    the other name takes the same tensor."""
    src = write_t5(tmp_path, "gated-gelu")
    folder = os.path.join(src, "text_encoder_2")
    layers = ["encoder.block.0.layer.0.SelfAttention.q",
              "encoder.block.1.layer.1.DenseReluDense.wi_0"]
    state = _quantize_int8(folder, layers)
    assert "encoder.embed_tokens.weight" not in state
    built = build_t5_encoder(src, 24, torch.Generator().manual_seed(0))
    assert sorted(built.prequantized) == sorted(layers)
    assert built.max_diff < 1e-5


T5_BAD = [
    ({"feed_forward_proj": "gated-silu"}, "'feed_forward_proj' is 'gated-silu'"),
    ({"dense_act_fn": "gelu"}, "'dense_act_fn' is 'gelu'"),
    ({"is_gated_act": False}, "'is_gated_act' is False"),
    ({"is_decoder": True}, "'is_decoder' is True"),
    ({"d_kv": 0}, "'d_kv' is 0"),
    ({"relative_attention_num_buckets": 2}, "'relative_attention_num_buckets' is 2"),
    ({"relative_attention_max_distance": 2}, "'relative_attention_max_distance' is 2"),
    ({"layer_norm_epsilon": "small"}, "'layer_norm_epsilon' is 'small'"),
]


@pytest.mark.parametrize("change, message", T5_BAD)
def test_bad_t5_configs_are_refused_naming_the_field(change, message):
    config = {**T5_CONFIG, "feed_forward_proj": "gated-gelu", "dense_act_fn": "gelu_new",
              "is_gated_act": True, **change}
    with pytest.raises(ImportFailure, match=f"^text_encoder_2/config.json: field {message}"):
        T5EncoderConfig.from_transformers(config, "text_encoder_2/config.json")


def test_real_t5_xxl_config_is_accepted():
    xxl = {"d_ff": 10240, "d_kv": 64, "d_model": 4096, "dense_act_fn": "gelu_new",
           "feed_forward_proj": "gated-gelu", "is_encoder_decoder": True, "is_gated_act": True,
           "layer_norm_epsilon": 1e-06, "num_heads": 64, "num_layers": 24,
           "relative_attention_max_distance": 128, "relative_attention_num_buckets": 32,
           "tie_word_embeddings": False, "vocab_size": 32128}
    cfg = T5EncoderConfig.from_transformers(xxl, "xxl")
    assert cfg.gated and cfg.d_model == 4096


# --- helpers ---------------------------------------------------------------------------------


def _quantize_int8(folder, layers):
    """Rewrites the component's checkpoint with `layers` in bitsandbytes' LLM.int8 format
    (int8 weight and SCB row absmax) and marks its config bitsandbytes; returns the state."""
    path = os.path.join(folder, [f for f in os.listdir(folder) if f.endswith(".safetensors")][0])
    state = dict(safetensors_torch.load_file(path))
    for prefix in layers:
        w = state[f"{prefix}.weight"].float()
        scb = w.abs().amax(1)
        state[f"{prefix}.weight"] = torch.round(w * 127 / scb[:, None]).clamp(-127, 127).to(
            torch.int8)
        state[f"{prefix}.SCB"] = scb
    safetensors_torch.save_file(state, path)
    config_path = os.path.join(folder, "config.json")
    with open(config_path, encoding="utf-8") as f:
        config = json.load(f)
    config["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_8bit": True}
    with open(config_path, "w", encoding="utf-8") as f:
        json.dump(config, f)
    return state
