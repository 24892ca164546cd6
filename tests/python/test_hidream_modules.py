"""Tests of qpool_export's HiDream transformer (hidream_transformer.py, hidream_experts.py) on
tiny random HiDreamImageTransformer2DModel checkpoints built with diffusers: the mirror equals the original
(the mixture of experts on routed tokens, Note [Routed experts]; full and half-head rotary), traces at one
shape and runs at another without tensor constants, quantizes to int8 and NF4 within bounds, and
refuses configs it does not reproduce, naming the field. CPU only, seconds.

Run: .venv/bin/python -m pytest -q -p no:cacheprovider tests/python/test_hidream_modules.py
"""

import copy
import os
import sys

import pytest
import torch

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tools", "qpool_export"))

diffusers = pytest.importorskip("diffusers")

from qpool_export import quant, tracing  # noqa: E402
from qpool_export.hidream_experts import MoeSwiGlu, expert_order, group_experts  # noqa: E402
from qpool_export.hidream_transformer import (HiDreamTransformer,  # noqa: E402
                                              HiDreamTransformerConfig, fuse_projections)
from qpool_export.import_error import ImportFailure  # noqa: E402

torch.set_num_threads(1)

T5_WIDTH, LLAMA_WIDTH, LLAMA_LAYERS, POOLED = 24, 20, 3, 16
TINY = dict(patch_size=2, in_channels=4, out_channels=4, num_layers=2, num_single_layers=2,
            attention_head_dim=16, num_attention_heads=2, caption_channels=[T5_WIDTH, LLAMA_WIDTH],
            text_emb_dim=POOLED, num_routed_experts=4, num_activated_experts=2,
            axes_dims_rope=[8, 4, 4], max_resolution=[16, 16], llama_layers=[0, 2, 1, 2])


def hidream(**overrides):
    torch.manual_seed(0)
    config = {**TINY, **overrides}
    original = diffusers.HiDreamImageTransformer2DModel(**config).eval()
    cfg = HiDreamTransformerConfig.from_diffusers(dict(original.config), "transformer/config.json")
    mirror = HiDreamTransformer(cfg).eval()
    missing, unexpected = mirror.load_state_dict(original.state_dict(), strict=False)
    assert missing == ["t_embedder.time_proj.freqs"] and not unexpected, (missing, unexpected)
    return original, mirror


MAX_SEQ = 16 * 16 // 4  # TINY's max_resolution in 2x2 patches


def image_mask(batch, tokens, padded=None):
    """The server's image_mask: ones over the patches, zeros over the padding to `padded`."""
    mask = torch.zeros(batch, padded or tokens)
    mask[:, :tokens] = 1
    return mask


def inputs(batch, size, t5_tokens=7, llama_tokens=5, seed=1, width=None):
    """The transformer's inputs for size x width (default: square) latents; a non-square
    latent's patches padded to MAX_SEQ, as the server and diffusers pad them."""
    width = width or size
    gen = torch.Generator().manual_seed(seed)
    tokens = (size // 2) * (width // 2)
    return (torch.randn(batch, 4, size, width, generator=gen),
            torch.rand(batch, generator=gen) * 1000,
            torch.randn(batch, t5_tokens, T5_WIDTH, generator=gen),
            torch.randn(LLAMA_LAYERS, batch, llama_tokens, LLAMA_WIDTH, generator=gen),
            torch.randn(batch, POOLED, generator=gen),
            image_mask(batch, tokens, None if width == size else MAX_SEQ))


@pytest.mark.parametrize("overrides", [{}, {"axes_dims_rope": [4, 2, 2]},
                                       {"num_routed_experts": 0}, {"num_single_layers": 0,
                                                                   "llama_layers": [1, 0]}])
@pytest.mark.parametrize("width", [8, 12, 4])
def test_transformer_equals_diffusers(overrides, width):
    """Square latents, and non-square ones, which diffusers pads to max_seq with their keys
    masked (Note [Padded images])."""
    original, mirror = hidream(**overrides)
    latents, t, t5, llama, pooled, mask = inputs(2, 8, width=width)
    with torch.no_grad():
        want = original(hidden_states=latents, timesteps=t, encoder_hidden_states_t5=t5,
                        encoder_hidden_states_llama3=llama, pooled_embeds=pooled,
                        return_dict=False)[0]
        got = mirror(latents, t, t5, llama, pooled, mask)
    assert got.shape == want.shape == latents.shape
    assert (got - want).abs().max().item() < 1e-5 * max(1.0, want.abs().max().item())


@pytest.mark.parametrize("overrides", [{}, {"num_routed_experts": 0}])
def test_fused_projections_equal_diffusers(overrides):
    """Each attention's q / k / v and each SwiGLU's w1 / w3 as one linear, and the routed
    experts grouped, as the importer makes them (Note [Fused projections], Note [Routed
    experts]): the same outputs, traced."""
    original, mirror = hidream(**overrides)
    blocks = TINY["num_layers"] + TINY["num_single_layers"]
    routed = overrides.get("num_routed_experts", TINY["num_routed_experts"])
    # Per block: its attention, the image feed-forward's experts (and shared one) or its
    # SwiGLU; per double block also the text feed-forward.
    swiglus = blocks * (routed + 1 if routed else 1) + TINY["num_layers"]
    assert fuse_projections(mirror) == blocks + swiglus
    assert not any(name.endswith((".w1.weight", ".to_q.weight")) for name in mirror.state_dict())
    assert group_experts(mirror) == (blocks if routed else 0)
    assert not any(".experts." in name for name in mirror.state_dict())
    example = inputs(2, 8, width=12)
    latents, t, t5, llama, pooled, mask = example
    with torch.no_grad():
        want = original(hidden_states=latents, timesteps=t, encoder_hidden_states_t5=t5,
                        encoder_hidden_states_llama3=llama, pooled_embeds=pooled,
                        return_dict=False)[0]
        got = tracing.trace(mirror, inputs(2, 8))(*example)
    assert (got - want).abs().max().item() < 1e-5 * max(1.0, want.abs().max().item())


def test_padding_changes_the_image():
    """The padding is not inert (its values reach the patches through attention): a wider
    mask gives another output, so the server must pad exactly where diffusers does."""
    _, mirror = hidream()
    latents, t, t5, llama, pooled, mask = inputs(1, 8, width=12)
    with torch.no_grad():
        padded = mirror(latents, t, t5, llama, pooled, mask)
        unpadded = mirror(latents, t, t5, llama, pooled, image_mask(1, 24))
    assert (padded - unpadded).abs().max().item() > 1e-3


def test_traced_at_one_shape_runs_at_another():
    """Traced square, run square at another size and non-square with padding."""
    _, mirror = hidream()
    traced = tracing.trace(mirror, inputs(2, 8))
    tracing.check_no_tensor_constants("transformer", traced)
    for other in (inputs(1, 12, t5_tokens=9, llama_tokens=3, seed=2),
                  inputs(2, 8, width=16, seed=3)):
        assert tracing.check_matches_eager("transformer", mirror, traced, other) < 1e-5
    # Its positions and rotary tables are made where the latents are (a GPU, for the server).
    tracing.check_no_baked_device("transformer", traced)


def dense_experts(moe, x):
    """Every routed expert on every token, weighted by the gate's weight for it (zero where it
    was not picked): the sums the routed experts must give."""
    flat = x.flatten(0, 1)
    scores = torch.nn.functional.linear(flat, moe.gate.weight).softmax(dim=-1)
    weight, index = torch.topk(scores, k=moe.activated, dim=-1)
    weights = torch.zeros_like(scores).scatter(1, index, weight)
    y = sum(expert(flat) * weights[:, i:i + 1] for i, expert in enumerate(moe.experts))
    return y.view(x.shape) + moe.shared_experts(x)


@pytest.mark.parametrize("grouped", [False, True])
def test_traced_experts_follow_each_routing(grouped):
    """One trace, any routing (Note [Routed experts]), per expert and grouped: traced where
    every expert has tokens, then run where only experts 0 and 1 are ever picked, so 2 and 3 get
    none. Only the per-expert form waits on the host (nonzero)."""
    torch.manual_seed(3)
    moe = MoeSwiGlu(16, 64, 4, 2).eval()
    reference = copy.deepcopy(moe)
    if grouped:
        assert fuse_projections(moe) == 5 and group_experts(moe) == 1
        assert (moe.w13.groups, moe.w13.group_features, moe.w13.in_features) == (4, 512, 16)
        assert (moe.w2.groups, moe.w2.group_features, moe.w2.in_features) == (4, 16, 256)
    x = torch.randn(2, 9, 16)
    with torch.no_grad():
        traced = torch.jit.trace(moe, (x,))
        waits = any(n.kind().startswith("aten::nonzero") for n in traced.inlined_graph.nodes())
        assert waits != grouped
        assert (traced(x) - dense_experts(reference, x)).abs().max().item() < 1e-5
        for m in (moe, reference):
            m.gate.weight.zero_()
            m.gate.weight[0, 0], m.gate.weight[1, 0] = 1.0, 0.5
        skewed = x.clone()
        skewed[..., 0] = 40.0
        got, want = traced(skewed), dense_experts(reference, skewed)
    assert (got - want).abs().max().item() < 1e-4 * want.abs().max().item()


@pytest.mark.parametrize("fmt, bound", [("int8", 0.02), ("nf4", 0.2), ("w8a8", 0.02)])
def test_grouped_experts_quantize_as_one_layer_and_stay_capturable(fmt, bound):
    """Grouped experts quantized afterwards (as --quantize does at import): each stacked layer
    is one quantized layer, the traced mixture still reads no size on the host and stays close
    to the float experts; without prequantize it stays float for the server to quantize."""
    torch.manual_seed(5)
    moe = MoeSwiGlu(16, 64, 4, 2).eval()
    reference = copy.deepcopy(moe)
    fuse_projections(moe)
    group_experts(moe)
    kept = copy.deepcopy(moe)
    assert quant.quantize_module(kept, fmt, prequantize=False) == 4
    assert kept.w13.format == kept.w2.format == "none"
    errors = {}
    assert quant.quantize_module(moe, fmt, errors=errors) == 4  # grouped w13, w2; shared w13, w2
    assert moe.w13.format == moe.w2.format == fmt and moe.w13.weight.shape[0] == 4 * 512
    assert 0 < errors["w13"] < 0.2 and 0 < errors["w2"] < 0.2
    x = torch.randn(2, 9, 16)
    with torch.no_grad():
        traced = torch.jit.trace(moe, (x,))
        assert not any(n.kind().startswith("aten::nonzero")
                       for n in traced.inlined_graph.nodes())
        got, want = traced(x), dense_experts(reference, x)
    assert ((got - want).norm() / want.norm()).item() < bound


def test_experts_group_only_as_plain_linears():
    """Quantized experts (which quantize layer by layer) and widths the grouped product's CUDA
    kernel does not take stay per expert, unchanged."""
    torch.manual_seed(3)
    quantized = MoeSwiGlu(16, 64, 4, 2).eval()
    fuse_projections(quantized)
    assert quant.quantize_module(quantized, "int8") > 0
    assert group_experts(quantized) == 0 and len(quantized.experts) == 4
    narrow = MoeSwiGlu(12, 64, 4, 2).eval()  # 12 columns: not a multiple of 16
    fuse_projections(narrow)
    assert group_experts(narrow) == 0 and len(narrow.experts) == 4
    unfused = MoeSwiGlu(16, 64, 4, 2).eval()
    assert group_experts(unfused) == 0


@pytest.mark.parametrize("fmt, bound", [("int8", 0.05), ("nf4", 0.3)])
def test_quantized_transformer_traces_and_stays_close(fmt, bound):
    _, mirror = hidream(attention_head_dim=32)
    module = copy.deepcopy(mirror)
    assert quant.quantize_module(module, fmt) > 0
    example = inputs(1, 8)
    traced = tracing.trace(module, example)
    tracing.check_no_tensor_constants("transformer", traced)
    with torch.no_grad():
        got, want = traced(*example), mirror(*example)
    assert ((got - want).norm() / want.norm()).item() < bound


@pytest.mark.parametrize("field, value", [
    ("llama_layers", [0, 1]), ("axes_dims_rope", [8, 4, 2]), ("axes_dims_rope", [8, 8]),
    ("caption_channels", [24]), ("num_activated_experts", 5), ("patch_size", None)])
def test_configs_it_does_not_reproduce_are_refused_naming_the_field(field, value):
    config = {**TINY, field: value}
    with pytest.raises(ImportFailure, match=f"transformer/config.json: field '{field}'"):
        HiDreamTransformerConfig.from_diffusers(config, "transformer/config.json")


def test_builder_imports_a_transformer_folder(tmp_path):
    from qpool_export.hidream_components import build_hidream_transformer

    torch.manual_seed(0)
    diffusers.HiDreamImageTransformer2DModel(**TINY).save_pretrained(tmp_path / "transformer")
    built, cfg = build_hidream_transformer(str(tmp_path), (7, T5_WIDTH),
                                           (LLAMA_LAYERS, 5, LLAMA_WIDTH), POOLED,
                                           torch.Generator().manual_seed(0))
    assert built.name == "transformer" and built.max_diff < 1e-5
    assert any(name.endswith("ff_i.w13.weight") for name in built.module.state_dict())
    traced = tracing.trace(built.module, built.trace_inputs)
    assert tracing.check_matches_eager("transformer", built.module, traced,
                                       built.check_inputs) < 1e-5
    with pytest.raises(ImportFailure, match="field 'caption_channels\\[1\\]'"):
        build_hidream_transformer(str(tmp_path), (7, T5_WIDTH), (LLAMA_LAYERS, 5, 99), POOLED,
                                  torch.Generator().manual_seed(0))
    with pytest.raises(ImportFailure, match="field 'llama_layers'"):
        build_hidream_transformer(str(tmp_path), (7, T5_WIDTH), (2, 5, LLAMA_WIDTH), POOLED,
                                  torch.Generator().manual_seed(0))


@pytest.mark.parametrize("pairs, groups", [(0, 4), (1, 4), (18, 4), (301, 8)])
def test_expert_order_is_the_stable_sort(pairs, groups):
    """The counting order (Note [Routed experts]) is torch.sort's stable order, its inverse and
    its group ends, experts without pairs included (only the first half of the ids is drawn)."""
    torch.manual_seed(pairs)
    expert = torch.randint(0, max(groups // 2, 1), (pairs,))
    order, place, ends = expert_order(expert, groups)
    _, want = torch.sort(expert, stable=True)
    assert torch.equal(order, want) and torch.equal(place, want.argsort())
    counts = torch.bincount(expert, minlength=groups)
    assert ends.dtype == torch.int32 and torch.equal(ends, counts.cumsum(0).to(torch.int32))
