"""What a single-file import takes from qpool itself: the families' configs (a checkpoint carries
none), which must build the published models, and the pieces its layouts cut the file's tensors
into (Note [Single-file layouts])."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")
safetensors = pytest.importorskip("safetensors.torch")

from qpool_export import single_file_configs as configs  # noqa: E402
from qpool_export import single_file_layouts as layouts  # noqa: E402
from qpool_export.stream_import import params_on_meta  # noqa: E402
from qpool_export.weights_file import SafetensorsReader  # noqa: E402

# The parameter counts of the reference models, as their model cards and diffusers count them.
PUBLISHED = {
    ("sd1", "unet"): 859_520_964, ("sd1", "text_encoder"): 123_060_480,
    ("sd1", "vae"): 83_653_863,
    ("sd2", "unet"): 865_910_724, ("sd2", "text_encoder"): 340_387_840,
    ("sdxl", "unet"): 2_567_463_684, ("sdxl", "text_encoder"): 123_060_480,
    ("sdxl", "text_encoder_2"): 694_659_840, ("sdxl", "vae"): 83_653_863,
    ("flux-dev", "transformer"): 11_901_408_320, ("flux-dev", "text_encoder_2"): 4_762_310_656,
    ("flux-dev", "vae"): 83_819_683, ("flux-schnell", "transformer"): 11_891_178_560,
}


def build(config, part):
    from diffusers import AutoencoderKL, FluxTransformer2DModel, UNet2DConditionModel
    from transformers import (CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection,
                              T5Config, T5EncoderModel)

    cls = {"unet": UNet2DConditionModel, "vae": AutoencoderKL,
           "transformer": FluxTransformer2DModel}.get(part)
    if cls is not None:
        return cls.from_config(config)
    if config.get("model_type") == "t5":
        return T5EncoderModel(T5Config.from_dict(config))
    projected = config["architectures"][0] == "CLIPTextModelWithProjection"
    return (CLIPTextModelWithProjection if projected else CLIPTextModel)(
        CLIPTextConfig.from_dict(config))


@pytest.mark.parametrize("family,part", sorted(PUBLISHED))
def test_the_families_configs_build_the_published_models(family, part):
    with params_on_meta():  # sizes only
        model = build(configs.family(family)[part], part)
    assert sum(p.numel() for p in model.parameters()) == PUBLISHED[(family, part)]


def test_pieces_cut_swap_reshape_and_scale_the_files_tensors(tmp_path):
    qkv = torch.arange(24, dtype=torch.float32).reshape(6, 4)
    conv = torch.randn(3, 3, 1, 1)
    modulation = torch.arange(8, dtype=torch.float32)
    weight = torch.randn(4, 2)
    scale = torch.tensor([0.5, 2.0, 1.0, 4.0])
    path = tmp_path / "file.safetensors"
    safetensors.save_file({"qkv": qkv, "conv": conv, "mod": modulation,
                           "lin.weight": weight.to(torch.float8_e4m3fn),
                           "lin.scale_weight": scale, "proj": weight}, str(path))
    reader = SafetensorsReader(str(path))
    source = layouts.MappedTensors(reader, {
        "k": layouts.Piece("qkv", 2, 2), "flat": layouts.Piece("conv", shape=(3, 3)),
        "swapped": layouts.Piece("mod", swap=True), "scaled": layouts.Piece("lin.weight"),
        "transposed": layouts.Piece("proj", transpose=True)}, {"lin.weight": "lin.scale_weight"})
    assert source.shape("k") == (2, 4) and torch.equal(source.read("k"), qkv[2:4])
    assert source.shape("flat") == (3, 3) and torch.equal(source.read("flat"), conv[:, :, 0, 0])
    assert torch.equal(source.read("swapped"), torch.cat([modulation[4:], modulation[:4]]))
    stored = weight.to(torch.float8_e4m3fn).to(torch.float32)
    assert torch.equal(source.read("scaled"), stored * scale[:, None])
    assert source.shape("transposed") == (2, 4) and torch.equal(source.read("transposed"),
                                                                 weight.t())


def test_a_name_no_rule_maps_is_refused_with_the_first_ones(tmp_path):
    path = tmp_path / "file.safetensors"
    safetensors.save_file({"m.input_blocks.0.0.weight": torch.zeros(1),
                           "m.input_blocks.1.9.oops": torch.zeros(1)}, str(path))
    with pytest.raises(ValueError, match=r"1 tensor\(s\) of the UNet that qpool cannot map, "
                                         r"the first: m.input_blocks.1.9.oops"):
        layouts.mapped(SafetensorsReader(str(path)), "m.", layouts.unet_rule(2), {}, "UNet")


class MetaReader:
    """A checkpoint's names and sizes without data (SafetensorsReader's keys and shape)."""

    def __init__(self, tensors, path="full-size.safetensors"):
        self.tensors, self.path = tensors, path

    def keys(self):
        return list(self.tensors)

    def shape(self, key):
        return tuple(self.tensors[key].shape)

    def dtype(self, key):
        return self.tensors[key].dtype


@pytest.mark.parametrize("family", ["sd1", "sd2", "sdxl", "flux-dev"])
def test_the_layouts_map_a_full_size_checkpoint_onto_the_reference_models(family):
    """Every tensor of a full-size file in the published layout (the integration tests' writer,
    on meta tensors) lands on a tensor of the family's reference model, of its shape, and every
    tensor the model reads is given."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import single_file_import_bench as bench
    import single_file_writer as writer

    from qpool_export import single_file

    models = bench.meta_models(family)
    found = configs.family(family)
    opts = single_file.SingleFileOptions(checkpoint="full-size.safetensors", out="")
    if family.startswith("flux"):
        files = {"checkpoint": writer.bfl_flux(models.transformer),
                 "clip_l": writer.hf_clip(models.text_encoder, ""),
                 "t5": {k: v for k, v in models.text_encoder_2.state_dict().items()
                        if k != "encoder.embed_tokens.weight"},
                 "vae": writer.ldm_vae(models.vae, "")}
        readers = {k: MetaReader(v, f"{k}.safetensors") for k, v in files.items()}
        opts.clip_l, opts.t5, opts.vae = "clip_l", "t5", "vae"
    else:
        readers = {"checkpoint": MetaReader(writer.sd_checkpoint(models, family))}
    sources, _ = single_file._sources(opts, family, readers["checkpoint"], found,
                                      opener=lambda path, what: readers[path])
    for part, source in sources.items():
        model = getattr(models, part)
        own = {k[len("text_model."):] if k.startswith("text_model.") and
               not hasattr(model, "text_model") else k: tuple(v.shape)
               for k, v in model.state_dict().items()}
        names = {k[len("text_model."):] if k not in own and k.startswith("text_model.") else k
                 for k in source.keys()}
        read = {n for n in own if not n.endswith("position_ids") and
                not n.startswith(("encoder.", "quant_conv.") if part == "vae" else "\0")
                and n != "encoder.embed_tokens.weight"}
        assert names == read, (part, sorted(names ^ read)[:5])
        for key in source.keys():
            name = key if key in own else key[len("text_model."):]
            assert source.shape(key) == own[name], (part, key)
