"""Warm-up at load (execution.warmup, Note [Warm-up at load] in server/pool/pipeline_registry.h):
a replica makes one image at the pipeline's defaults before its load ends, counted as component
forwards but not as a request; its later images are those of an unwarmed copy; and a pipeline
whose defaults cannot run fails its load instead of its first request."""

import grpc

from conftest import parse_samples, rpc_error, scrape

WARMUP = "execution:\n  warmup: true\n"


def _setup(repository):
    (repository / "tiny-warm" / "pipeline.yaml").open("a").write(WARMUP)
    # Latents of 3 channels for a UNet of 4: every file loads, the first denoising step fails.
    broken = repository / "tiny-broken" / "pipeline.yaml"
    text = broken.read_text()
    assert "  channels: 4\n" in text
    broken.write_text(text.replace("  channels: 4\n", "  channels: 3\n") + WARMUP)


def _client(make_server):
    return make_server(pipelines=("tiny", ("tiny", "tiny-warm"), ("tiny", "tiny-broken")),
                       load="tiny,tiny-warm", setup=_setup)


def _counters(client, metric):
    out = {}
    for (name, labels), value in parse_samples(scrape(client)).items():
        if name == metric:
            out[frozenset(labels)] = value
    return out


def _forwards(client, pipeline):
    return {dict(labels)["component"]: value
            for labels, value in _counters(client, "qpool_component_forwards_total").items()
            if dict(labels)["pipeline"] == pipeline}


def test_a_warmed_replica_has_run_its_components_and_served_no_request(make_server):
    client = _client(make_server)
    # Two steps of one (CFG-batched) denoiser forward each, one text encoding, one decode.
    assert _forwards(client, "tiny-warm") == {"text_encoder": 1, "unet": 2, "vae_decoder": 1}
    assert set(_forwards(client, "tiny").values()) <= {0}
    requests = _counters(client, "qpool_requests_total")
    assert not [v for labels, v in requests.items()
                if dict(labels)["pipeline"] == "tiny-warm" and v != 0]
    log = client.server.stderr_text() + "\n".join(client.server.stdout_lines)
    assert "warmed up pipeline 'tiny-warm' on cpu" in log

    # Its images are the unwarmed copy's, bit for bit.
    for seed in (0, 7):
        warm = client.generate_one(pipeline="tiny-warm", prompt="a red fox", steps=3, seed=seed)
        cold = client.generate_one(pipeline="tiny", prompt="a red fox", steps=3, seed=seed)
        assert warm.images[0].png == cold.images[0].png, f"seed {seed}"

    # A pipeline whose defaults cannot run fails its load, naming the warm-up; nothing of it
    # stays loaded.
    pb2 = client.pb2
    error = rpc_error(client.models.LoadPipeline, pb2.LoadPipelineRequest(name="tiny-broken"),
                      timeout=120)
    assert error.code() == grpc.StatusCode.INTERNAL  # a component's forward failed
    assert "warm-up of 'tiny-broken' on cpu (execution.warmup) failed" in error.details()
    assert "to have 4 channels, but got 3" in error.details()
    listed = client.models.ListPipelines(pb2.ListPipelinesRequest(), timeout=30)
    (broken,) = [p for p in listed.pipelines if p.name == "tiny-broken"]
    assert not broken.replicas
    report = client.models.GetMemoryReport(pb2.GetMemoryReportRequest(max_events=100), timeout=30)
    (event,) = [e for e in report.events if e.pipeline == "tiny-broken"]
    assert (event.kind, event.outcome, event.attributed_delta_bytes) == ("load", "error", 0)
    assert "warm-up" in event.message
    assert "tiny-broken" not in {p.name for p in report.pipelines}
