"""Tests of qpool_export's decoder-only LLM text encoder (llm_encoder.py) on tiny random
LlamaModel checkpoints built with transformers: every layer's hidden states equal
transformers' hidden_states[1:] as HiDreamImagePipeline stacks them (grouped-query attention,
Llama 3's rotary scaling, right padding), the rotary tables equal transformers' own, the module
traces at one shape and runs at another without tensor constants, quantizes to int8 and NF4
within bounds, and refuses configs it does not reproduce, naming the field. CPU only, seconds.

Run: .venv/bin/python -m pytest -q -p no:cacheprovider tests/python/test_llm_encoder.py
"""

import copy
import os
import sys

import pytest
import torch

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tools", "qpool_export"))

transformers = pytest.importorskip("transformers")

from qpool_export import quant, tracing  # noqa: E402
from qpool_export.import_error import ImportFailure  # noqa: E402
from qpool_export.llm_encoder import LlmEncoder, LlmEncoderConfig  # noqa: E402

torch.set_num_threads(1)

MAX_LENGTH = 40
LLAMA = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
             num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
             max_position_embeddings=128, rope_theta=500000.0,
             # Llama 3.1's scaling, its original context shrunk so that every band is used
             rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                           "high_freq_factor": 4.0, "original_max_position_embeddings": 16})


def llama(**overrides):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(**{**LLAMA, **overrides})
    original = transformers.LlamaModel(config).eval()
    cfg = LlmEncoderConfig.from_llama(original.config.to_dict(), "text_encoder_4/config.json")
    mirror = LlmEncoder(cfg, MAX_LENGTH).eval()
    missing, unexpected = mirror.load_state_dict(original.state_dict(), strict=False)
    assert sorted(missing) == sorted(LlmEncoder.ROTARY) and not unexpected, (missing, unexpected)
    return original, mirror


def inputs(batch, length, padded_from=None, seed=1):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, LLAMA["vocab_size"], (batch, length), generator=gen)
    mask = torch.ones(batch, length, dtype=torch.long)
    if padded_from is not None:
        mask[-1, padded_from:] = 0  # right padding, as the pipelines' tokenizers pad
    return ids, mask


@pytest.mark.parametrize("overrides", [{}, {"num_key_value_heads": 4},
                                       {"rope_scaling": None, "head_dim": 8},
                                       {"attention_bias": True}])
def test_hidden_states_equal_transformers(overrides):
    original, mirror = llama(**overrides)
    ids, mask = inputs(2, 23, padded_from=15)
    with torch.no_grad():
        want = torch.stack(original(ids, attention_mask=mask,
                                    output_hidden_states=True).hidden_states[1:], dim=0)
        got = mirror(ids, mask)
    assert got.shape == (LLAMA["num_hidden_layers"], 2, 23, LLAMA["hidden_size"])
    assert (got - want).abs().max().item() < 1e-5


def test_rotary_tables_equal_transformers():
    original, mirror = llama()
    x = torch.zeros(1, MAX_LENGTH, LLAMA["hidden_size"])
    cos, sin = original.rotary_emb(x, torch.arange(MAX_LENGTH)[None])
    assert torch.equal(mirror.rotary_cos, cos[0]) and torch.equal(mirror.rotary_sin, sin[0])


def test_traced_at_one_shape_runs_at_another():
    _, mirror = llama()
    traced = tracing.trace(mirror, inputs(2, 17, padded_from=9))
    tracing.check_no_tensor_constants("text_encoder_4", traced)
    assert tracing.check_matches_eager("text_encoder_4", mirror, traced,
                                       inputs(3, 31, padded_from=4, seed=2)) < 1e-5
    tracing.check_no_baked_device("text_encoder_4", traced)


@pytest.mark.parametrize("fmt, bound", [("int8", 0.05), ("nf4", 0.3)])
def test_quantized_encoder_traces_and_stays_close(fmt, bound):
    _, mirror = llama(hidden_size=128, intermediate_size=256)
    module = copy.deepcopy(mirror)
    assert quant.quantize_module(module, fmt) == 7 * LLAMA["num_hidden_layers"]
    example = inputs(2, 12, padded_from=8)
    traced = tracing.trace(module, example)
    tracing.check_no_tensor_constants("text_encoder_4", traced)
    with torch.no_grad():
        got, want = traced(*example), mirror(*example)
    assert ((got - want).norm() / want.norm()).item() < bound


@pytest.mark.parametrize("field, value, says", [
    ("hidden_act", "gelu", "'hidden_act'"),
    ("num_key_value_heads", 3, "'num_key_value_heads'"),
    ("mlp_bias", True, "'mlp_bias'"),
    ("rope_scaling", {"rope_type": "yarn", "factor": 4.0}, "'rope_parameters.rope_type'"),
    ("rope_scaling", {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0,
                      "high_freq_factor": 1.0, "original_max_position_embeddings": 16},
     "'rope_parameters.high_freq_factor'"),
])
def test_configs_it_does_not_reproduce_are_refused_naming_the_field(field, value, says):
    config = transformers.LlamaConfig(**LLAMA).to_dict()
    config.pop("rope_parameters", None)
    config[field] = value
    if field == "rope_scaling":
        config["rope_parameters"] = value
    with pytest.raises(ImportFailure, match=f"text_encoder_4/config.json: field {says}"):
        LlmEncoderConfig.from_llama(config, "text_encoder_4/config.json")


def test_builder_imports_a_llama_folder(tmp_path):
    """text_encoder_4 as HiDream ships it (LlamaForCausalLM), saved and imported through the
    builder, which compares with transformers and checks the rotary tables."""
    from qpool_export.hidream_components import build_llm_encoder

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA)).eval()
    model.save_pretrained(tmp_path / "text_encoder_4")
    built, cfg = build_llm_encoder(str(tmp_path / "text_encoder_4"), MAX_LENGTH, torch.Generator().manual_seed(0))
    assert built.name == "text_encoder_4" and built.max_diff < 1e-5
    assert cfg.num_kv_heads == 2 and cfg.rope_scaling.factor == 8.0
    traced = tracing.trace(built.module, built.trace_inputs)
    assert tracing.check_matches_eager("text_encoder_4", built.module, traced,
                                       built.check_inputs) < 1e-5


def test_builder_refuses_a_config_before_building(tmp_path):
    from qpool_export.hidream_components import build_llm_encoder

    folder = tmp_path / "text_encoder_4"
    folder.mkdir()
    config = transformers.LlamaConfig(**LLAMA).to_dict()
    config["hidden_act"] = "relu"
    (folder / "config.json").write_text(__import__("json").dumps(config))
    with pytest.raises(ImportFailure, match="field 'hidden_act'"):
        build_llm_encoder(str(tmp_path / "text_encoder_4"), MAX_LENGTH, torch.Generator().manual_seed(0))
