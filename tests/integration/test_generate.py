"""InferenceService/Generate against the real server with the exported `tiny` pipeline."""

import pytest

from conftest import TINY_DEFAULT_SIZE, TINY_DEFAULT_STEPS
from png_reader import max_abs_diff, read_png


@pytest.fixture(scope="module")
def client(make_server):
    return make_server(pipelines=("tiny",), load="tiny")


def png_bytes(result):
    return [image.png for image in result.images]


def test_images_are_pngs_of_the_requested_size_and_count(client):
    result = client.generate_one(pipeline="tiny", prompt="a red cube", steps=2, width=64,
                                 height=32, num_images=2, seed=11)
    assert len(result.images) == 2
    for image in result.images:
        assert (image.width, image.height) == (64, 32)
        png = read_png(image.png)
        assert (png.width, png.height) == (64, 32)
        assert png.color_type == 2, "expected 8-bit RGB"
        values = {b for row in png.rows for b in row}
        assert len(values) > 1, "the image is one flat color"
    assert result.images[0].png != result.images[1].png, "image 1 must use seed + 1"


def test_progress_events_count_and_order(client):
    progress, results = client.generate(pipeline="tiny", prompt="a cat", steps=3, seed=1)
    assert [p.step for p in progress] == [1, 2, 3]
    assert all(p.total == 3 for p in progress)
    elapsed = [p.elapsed_seconds for p in progress]
    assert elapsed == sorted(elapsed) and elapsed[0] >= 0
    assert len(results) == 1, "exactly one result, after all progress events"
    assert results[0].steps == 3


def test_defaults_come_from_the_manifest(client):
    progress, results = client.generate(pipeline="tiny", prompt="defaults", seed=2)
    assert len(progress) == TINY_DEFAULT_STEPS
    (result,) = results
    assert result.steps == TINY_DEFAULT_STEPS
    assert result.scheduler == "ddim"
    assert result.guidance_scale == pytest.approx(7.5)
    assert len(result.images) == 1
    png = read_png(result.images[0].png)
    assert (png.width, png.height) == (TINY_DEFAULT_SIZE, TINY_DEFAULT_SIZE)


def test_result_reports_device_and_timings(client):
    result = client.generate_one(pipeline="tiny", prompt="timed", steps=2, seed=3)
    assert result.device in ("cpu",) or result.device.startswith("cuda:")
    t = result.timings
    assert t.total_seconds > 0
    stages = (t.queue_seconds, t.encode_seconds, t.denoise_seconds, t.decode_seconds,
              t.png_seconds)
    for part in stages:
        assert 0 <= part <= t.total_seconds + 1e-6
    assert t.denoise_seconds > 0 and t.decode_seconds > 0 and t.png_seconds > 0
    # The stages follow one another: together they fit in the request's time.
    assert sum(stages) <= t.total_seconds + 1e-6


def test_same_seed_gives_identical_bytes(client):
    a = client.generate_one(pipeline="tiny", prompt="a lighthouse", steps=3, seed=1234)
    b = client.generate_one(pipeline="tiny", prompt="a lighthouse", steps=3, seed=1234)
    assert a.seed == b.seed == 1234
    assert png_bytes(a) == png_bytes(b)


def test_different_seeds_give_different_images(client):
    a = client.generate_one(pipeline="tiny", prompt="a lighthouse", steps=3, seed=1)
    b = client.generate_one(pipeline="tiny", prompt="a lighthouse", steps=3, seed=2)
    assert png_bytes(a) != png_bytes(b)


def test_image_i_uses_seed_plus_i(client):
    batch = client.generate_one(pipeline="tiny", prompt="seeds", steps=2, num_images=2, seed=40)
    single = client.generate_one(pipeline="tiny", prompt="seeds", steps=2, num_images=1, seed=41)
    # Batched and single runs may differ by float rounding; the decoded pixels stay close.
    diff = max_abs_diff(read_png(batch.images[1].png), read_png(single.images[0].png))
    assert diff <= 3, f"image 1 of seed 40 differs from image 0 of seed 41 by {diff}"


def test_absent_seed_is_random_and_returned(client):
    a = client.generate_one(pipeline="tiny", prompt="random", steps=1)
    b = client.generate_one(pipeline="tiny", prompt="random", steps=1)
    assert a.seed != b.seed, "two unseeded requests got the same seed"
    replay = client.generate_one(pipeline="tiny", prompt="random", steps=1, seed=a.seed)
    assert png_bytes(replay) == png_bytes(a), "the returned seed does not reproduce the image"


def test_prompt_changes_the_image(client):
    a = client.generate_one(pipeline="tiny", prompt="a dog", steps=2, seed=5)
    b = client.generate_one(pipeline="tiny", prompt="a spaceship over the sea", steps=2, seed=5)
    assert png_bytes(a) != png_bytes(b)


@pytest.mark.parametrize("scheduler", ["ddim", "euler", "euler_a", "dpmpp_2m", "dpmpp_2m_karras",
                                       "dpmpp_2m_sde", "dpmpp_2m_sde_karras", "unipc",
                                       "unipc_karras"])
def test_schedulers(client, scheduler):
    progress, results = client.generate(pipeline="tiny", prompt="a tree", steps=3, seed=9,
                                        scheduler=scheduler)
    assert len(progress) == 3
    (result,) = results
    assert result.scheduler == scheduler
    read_png(result.images[0].png)


def test_schedulers_differ(client):
    images = {name: tuple(png_bytes(client.generate_one(pipeline="tiny", prompt="a tree", steps=3,
                                                        seed=9, scheduler=name)))
              for name in ("ddim", "euler", "euler_a", "dpmpp_2m", "dpmpp_2m_karras",
                           "dpmpp_2m_sde", "dpmpp_2m_sde_karras", "unipc", "unipc_karras")}
    assert len(set(images.values())) == len(images)


def test_negative_prompt_is_used(client):
    plain = client.generate_one(pipeline="tiny", prompt="a house", steps=2, seed=6)
    negative = client.generate_one(pipeline="tiny", prompt="a house", negative_prompt="blurry",
                                   steps=2, seed=6)
    read_png(negative.images[0].png)
    assert png_bytes(plain) != png_bytes(negative), "the negative prompt had no effect"


def test_guidance_one_disables_cfg(client):
    no_cfg = client.generate_one(pipeline="tiny", prompt="a boat", steps=2, seed=8,
                                 guidance_scale=1.0)
    assert no_cfg.guidance_scale == pytest.approx(1.0)
    read_png(no_cfg.images[0].png)
    cfg = client.generate_one(pipeline="tiny", prompt="a boat", steps=2, seed=8,
                              guidance_scale=7.5)
    assert png_bytes(no_cfg) != png_bytes(cfg)
    # Without CFG the negative prompt is unused: the image must not depend on it.
    no_cfg_negative = client.generate_one(pipeline="tiny", prompt="a boat", steps=2, seed=8,
                                          guidance_scale=1.0, negative_prompt="ugly")
    assert png_bytes(no_cfg) == png_bytes(no_cfg_negative)
