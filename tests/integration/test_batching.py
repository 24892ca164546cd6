"""Dynamic batching on the CPU (Note [Dynamic batching] in server/pool/batch_queue.h): concurrent
compatible Generate requests of one replica share a denoising loop, each keeps its own seed,
prompt and guidance, a cancelled one leaves the batch without stopping the others, and
incompatible ones run apart. `tiny` (no batching) and `batched` load the same files, so the same
request gives the unbatched image on one and the batched image on the other."""

import threading

import grpc
import pytest
import yaml

from conftest import parse_samples, promtool_check, run_concurrently, scrape, wait_idle
from png_reader import max_abs_diff, read_png

MAX_BATCH = 4
# Long enough that requests sent together always meet in one batch, even on a loaded CI machine;
# a full batch does not wait for it.
MAX_DELAY_MS = 1500
# A batch changes a request's image only by the rounding of the UNet's kernels, which BLAS picks
# per batch size (last bits of float32 values); one 8-bit level is what such a difference can
# flip after rounding to pixels. A wrong seed, prompt or guidance would differ by far more.
PIXEL_TOLERANCE = 1


def enable_batching(pipeline_dir, **batching):
    path = pipeline_dir / "pipeline.yaml"
    manifest = yaml.safe_load(path.read_text())
    manifest["batching"] = batching
    path.write_text(yaml.safe_dump(manifest, sort_keys=False))


def setup_repository(repository):
    enable_batching(repository / "batched", max_batch=MAX_BATCH, max_delay_ms=MAX_DELAY_MS)


@pytest.fixture(scope="module")
def client(make_server):
    return make_server(pipelines=("tiny", ("tiny", "batched")), load="tiny,batched",
                       setup=setup_repository)


def requests_for(n, **common):
    """n different requests: own prompt, seed and (for odd i) guidance scale."""
    return [dict(prompt=f"a lighthouse, take {i}", seed=500 + 7 * i,
                 guidance_scale=7.5 if i % 2 == 0 else 3.0, steps=4, **common)
            for i in range(n)]


def pixels(result):
    return [read_png(image.png) for image in result.images]


def test_batched_images_are_each_requests_own(client):
    requests = requests_for(MAX_BATCH)
    batched, errors = run_concurrently(
        MAX_BATCH, lambda i: client.generate_one(pipeline="batched", **requests[i]))
    assert not errors, {i: e.details() for i, e in errors.items()}
    alone = [client.generate_one(pipeline="tiny", **r) for r in requests]
    for i in range(MAX_BATCH):
        assert batched[i].batch_size == MAX_BATCH, [r.batch_size for r in batched.values()]
        assert alone[i].batch_size == 1
        assert batched[i].seed == requests[i]["seed"]
        assert batched[i].guidance_scale == pytest.approx(requests[i]["guidance_scale"])
        # Its own image: within rounding of the unbatched run of the same request...
        diff = max_abs_diff(pixels(batched[i])[0], pixels(alone[i])[0])
        assert diff <= PIXEL_TOLERANCE, (i, diff)
        # ...and far from every other request's.
        for j in range(MAX_BATCH):
            if j != i:
                assert max_abs_diff(pixels(batched[i])[0], pixels(alone[j])[0]) > 16, (i, j)
    # One denoising loop: every member reports the same denoising time.
    assert len({round(r.timings.denoise_seconds, 6) for r in batched.values()}) == 1


def test_batch_counts_images_not_requests(client):
    # 3 + 1 images fill a batch of 4; each request gets its own images back.
    counts = [3, 1]
    results, errors = run_concurrently(
        2, lambda i: client.generate_one(pipeline="batched", prompt=f"boats {i}", steps=2,
                                         seed=40 + 10 * i, num_images=counts[i]))
    assert not errors, {i: e.details() for i, e in errors.items()}
    for i, count in enumerate(counts):
        assert results[i].batch_size == 2
        assert len(results[i].images) == count
        alone = client.generate_one(pipeline="tiny", prompt=f"boats {i}", steps=2,
                                    seed=40 + 10 * i, num_images=count)
        for got, want in zip(pixels(results[i]), pixels(alone)):
            assert max_abs_diff(got, want) <= PIXEL_TOLERANCE


def test_incompatible_requests_run_in_separate_batches(client):
    # Two sizes, two requests each: two batches of two, each waiting out max_delay_ms for the
    # batch to fill.
    sizes = [(64, 64), (64, 128), (64, 64), (64, 128)]
    results, errors = run_concurrently(
        4, lambda i: client.generate_one(pipeline="batched", prompt="dunes", steps=2, seed=i,
                                         width=sizes[i][0], height=sizes[i][1]))
    assert not errors, {i: e.details() for i, e in errors.items()}
    for i, (w, h) in enumerate(sizes):
        assert (results[i].images[0].width, results[i].images[0].height) == (w, h)
        assert results[i].batch_size == 2, [r.batch_size for r in results.values()]
    assert wait_idle(client, "batched") == 0


# dpmpp_2m keeps each row's previous prediction: the cancelled row's must leave with it; euler_a
# draws each step's noise from each image's own generator, the cancelled one's no longer.
@pytest.mark.parametrize("scheduler", ["ddim", "dpmpp_2m", "euler_a", "dpmpp_2m_sde", "unipc"])
def test_cancelled_member_leaves_the_batch_the_others_finish(client, scheduler):
    requests = requests_for(MAX_BATCH, width=128, height=128, scheduler=scheduler)
    for r in requests:
        r["steps"] = 40
    cancelled = threading.Event()

    def run(i):
        if i != 0:
            return client.generate_one(pipeline="batched", **requests[i])
        stream = client.inference.Generate(
            client.pb2.GenerateRequest(pipeline="batched", **requests[0]), timeout=300)
        for response in stream:
            if response.WhichOneof("event") == "progress" and response.progress.step == 2:
                stream.cancel()
                cancelled.set()
        return None

    results, errors = run_concurrently(MAX_BATCH, run)
    assert cancelled.is_set()
    assert list(errors) == [0] and errors[0].code() == grpc.StatusCode.CANCELLED
    for i in range(1, MAX_BATCH):
        result = results[i]
        assert result.batch_size == MAX_BATCH and result.seed == requests[i]["seed"]
        alone = client.generate_one(pipeline="tiny", **requests[i])
        assert max_abs_diff(pixels(result)[0], pixels(alone)[0]) <= PIXEL_TOLERANCE
    assert wait_idle(client, "batched") == 0


def test_batch_size_metric(client):
    text = scrape(client)
    promtool_check(text)
    samples = [(name, dict(labels), value)
               for (name, labels), value in parse_samples(text).items()]

    def value(name, pipeline, **labels):
        return sum(v for n, l, v in samples if n == name and l["pipeline"] == pipeline
                   and all(l.get(k) == want for k, want in labels.items()))

    # Earlier tests ran batches of 4, 2, 2, 2 and 4 on `batched`; every `tiny` request ran alone.
    assert value("qpool_batch_size_count", "batched") >= 5
    assert value("qpool_batch_size_sum", "batched") >= 14
    assert value("qpool_batch_size_bucket", "batched", le="1") == 0
    assert value("qpool_batch_size_bucket", "batched", le="4") == \
        value("qpool_batch_size_count", "batched")
    assert value("qpool_batch_size_count", "tiny") >= 1
    assert value("qpool_batch_size_sum", "tiny") == value("qpool_batch_size_count", "tiny")


def test_list_shows_batching(client):
    pipelines = client.pipelines()
    assert pipelines["batched"].max_batch == MAX_BATCH
    assert pipelines["batched"].max_batch_delay_ms == MAX_DELAY_MS
    assert pipelines["tiny"].max_batch == 1 and pipelines["tiny"].max_batch_delay_ms == 0
