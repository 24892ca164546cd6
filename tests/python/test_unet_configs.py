"""UNet configs diffusers runs that qpool imports, each checked by the importer's full path
against diffusers' own module on random inputs (diffusers_components.build_unet, which raises
when qpool's module differs): diffusers' own test pipeline's UNet (4 channels in a block without
attention, where 8 heads would not divide them), no mid block, upcast_attention, and a
cross_attention_dim given per block."""

import pytest

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")

from qpool_export.diffusers_components import build_unet  # noqa: E402

# diffusers' tests/pipelines/stable_diffusion: get_dummy_components' UNet.
DIFFUSERS_TEST = dict(block_out_channels=(4, 8), layers_per_block=1, sample_size=32,
                      in_channels=4, out_channels=4, down_block_types=("DownBlock2D",
                                                                       "CrossAttnDownBlock2D"),
                      up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
                      cross_attention_dim=32, norm_num_groups=2)


@pytest.mark.parametrize("changes", [
    {}, {"mid_block_type": None}, {"upcast_attention": True},
    {"cross_attention_dim": [32, 32]}, {"attention_head_dim": 2, "mid_block_type": None},
], ids=["diffusers' test UNet", "no mid block", "upcast_attention", "cross_attention_dim list",
        "no mid block, 2 heads"])
def test_unet_configs_diffusers_runs_import_equal_to_diffusers(tmp_path, changes):
    torch.manual_seed(0)
    unet = diffusers.UNet2DConditionModel(**{**DIFFUSERS_TEST, **changes})
    unet.save_pretrained(tmp_path / "unet")
    built = build_unet(str(tmp_path), "sd", (7, 32), 0, torch.Generator().manual_seed(1))
    assert built.max_diff is not None and built.max_diff < 1e-4
    assert hasattr(built.module, "mid_block") == (changes.get("mid_block_type", 1) is not None)


def test_another_mid_block_is_refused_naming_the_field(tmp_path):
    unet = diffusers.UNet2DConditionModel(**DIFFUSERS_TEST, mid_block_type="UNetMidBlock2D")
    unet.save_pretrained(tmp_path / "unet")
    with pytest.raises(ValueError, match="field 'mid_block_type' is 'UNetMidBlock2D'"):
        build_unet(str(tmp_path), "sd", (7, 32), 0, torch.Generator().manual_seed(1))
