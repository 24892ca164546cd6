"""bench/flop_share.py: the kinds of a UNet step's FLOPs, counted on the meta device."""
import pathlib
import sys

import pytest

pytest.importorskip("diffusers")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench"))
import flop_share  # noqa: E402


@pytest.mark.parametrize("model", ["sd15", "sdxl"])
def test_every_flop_of_a_unet_is_a_linear_convolution_or_attention_one(model):
    counted = flop_share.count(model, 256, 1)
    assert counted["other_share"] == 0
    assert counted["linear_share"] + counted["conv_share"] + counted["attention_share"] == \
        pytest.approx(1)
    assert min(counted["linear_share"], counted["conv_share"], counted["attention_share"]) > 0


def test_flops_grow_with_the_images_and_the_side():
    one = flop_share.count("sd15", 256, 1)
    assert one["unet_batch"] == 2  # CFG: the conditional and unconditional halves
    assert flop_share.count("sd15", 256, 2)["gflop"] == pytest.approx(2 * one["gflop"])
    # Convolutions and linear layers grow with the pixels, attention faster (its products are
    # quadratic in the tokens), so four times the pixels cost more than four times the FLOPs.
    assert flop_share.count("sd15", 512, 1)["gflop"] > 4 * one["gflop"]
