"""The sequential offload policy through the real server: streamed pipelines (full precision,
NF4 quantized at load, and prequantized W8A8, whose UNet's norms hold the linears that read them:
Note [Norm linear op]) give the same images as resident ones, every request (Encode alone
included) ends with everything on the host, each streamed run is a memory event, and the
settings show in ListPipelines."""

import re

import grpc
import pytest

from conftest import parse_samples, promtool_check, rpc_error, scrape


def streamed(name, group_mib=0, prefetch=1, resident_mib=0):
    """setup(): makes the copied pipeline `name` stream (finest groups by default)."""

    def setup(repository):
        manifest = repository / name / "pipeline.yaml"
        text = manifest.read_text()
        assert "offload:" not in text, text
        manifest.write_text(text + f"offload:\n  policy: sequential\n  group_mib: {group_mib}\n"
                            f"  prefetch: {prefetch}\n  resident_mib: {resident_mib}\n")

    return setup


def setups(*fns):
    def setup(repository):
        for fn in fns:
            fn(repository)

    return setup


@pytest.fixture(scope="module")
def client(make_server):  # the fixture's servers export /metrics
    return make_server(
        pipelines=("tiny", ("tiny", "tiny-seq"), "tiny-nf4", ("tiny-nf4", "tiny-nf4-seq"),
                   ("tiny", "tiny-seq-coarse"), "tiny-w8a8", ("tiny-w8a8", "tiny-w8a8-seq")),
        setup=setups(streamed("tiny-seq"), streamed("tiny-nf4-seq", prefetch=2, resident_mib=1),
                     streamed("tiny-seq-coarse", group_mib=64), streamed("tiny-w8a8-seq")))


def events_since(client, sequence):
    report = client.models.GetMemoryReport(client.pb2.GetMemoryReportRequest(max_events=200),
                                           timeout=30)
    return [e for e in report.events if e.sequence > sequence]


def last_sequence(client):
    return client.models.GetMemoryReport(client.pb2.GetMemoryReportRequest(), timeout=30
                                         ).last_sequence


@pytest.mark.parametrize("resident,streaming", [("tiny", "tiny-seq"), ("tiny", "tiny-seq-coarse"),
                                                ("tiny-nf4", "tiny-nf4-seq"),
                                                ("tiny-w8a8", "tiny-w8a8-seq")])
def test_streamed_pipelines_give_the_same_images(client, resident, streaming):
    fields = dict(prompt="a red fox in the snow", seed=11, steps=3, num_images=2)
    expected = client.generate_one(pipeline=resident, **fields)
    start = last_sequence(client)
    got = client.generate_one(pipeline=streaming, **fields)
    assert [i.png for i in got.images] == [i.png for i in expected.images]
    info = client.pipelines()[streaming]
    assert {c.residency for c in info.components} == {"host"}
    events = [e for e in events_since(client, start) if e.pipeline == streaming]
    streams = {e.component: e for e in events if e.kind == "stream"}
    assert set(streams) == {"text_encoder", "unet", "vae_decoder"}, [e.kind for e in events]
    for e in streams.values():
        assert e.outcome == "ok" and e.device == "cpu" and e.from_device == "host"
        assert e.copied_bytes == int(re.match(r"streamed (\d+) bytes", e.message).group(1))
        copied, copies, runs, peak = map(int, re.match(
            r"streamed (\d+) bytes in (\d+) copies for (\d+) group runs; at most (\d+) bytes",
            e.message).groups())
        assert copies >= 1 and runs >= 1 and 0 < peak <= copied, e.message
    # The UNet ran 3 steps x (uncond + cond in one batch): each group entered once per step.
    unet = streams["unet"]
    runs = int(re.search(r"for (\d+) group runs", unet.message).group(1))
    assert runs % 3 == 0, unet.message
    # Fine groups hold a small part of the UNet at once; one 64 MiB group holds all of it.
    unet_bytes = sum(c.weight_bytes + c.quant_state_bytes + c.other_bytes
                     for c in info.components if c.name == "unet")
    peak = int(re.search(r"at most (\d+) bytes", unet.message).group(1))
    copies = int(re.search(r"in (\d+) copies", unet.message).group(1))
    if streaming == "tiny-seq-coarse":
        # (the block's trailing alignment padding is not copied)
        assert runs == 3 and unet_bytes - 256 < peak <= unet_bytes
    elif streaming == "tiny-nf4-seq":
        # resident_mib 1: the first MiB of groups is copied once, not at every step.
        assert copies < runs and peak < unet_bytes, (copies, runs, peak, unet_bytes)
    else:
        assert peak < unet_bytes / 2, (peak, unet_bytes)
        assert copies >= runs, (copies, runs)


def test_encode_alone_streams_the_text_encoder_only(client):
    start = last_sequence(client)
    expected = client.inference.Encode(client.pb2.EncodeRequest(pipeline="tiny", prompts=["a"]),
                                       timeout=60)
    got = client.inference.Encode(client.pb2.EncodeRequest(pipeline="tiny-seq", prompts=["a"]),
                                  timeout=60)
    assert got.embeddings.data == expected.embeddings.data
    assert {c.residency for c in client.pipelines()["tiny-seq"].components} == {"host"}
    kinds = [(e.kind, e.component) for e in events_since(client, start)
             if e.pipeline == "tiny-seq"]
    assert kinds == [("stream", "text_encoder")], kinds


def test_a_cancelled_request_ends_on_the_host(client):
    call = client.inference.Generate(client.pb2.GenerateRequest(
        pipeline="tiny-seq", prompt="x", seed=1, steps=50, width=256, height=256), timeout=120)
    for response in call:
        if response.WhichOneof("event") == "progress" and response.progress.step >= 2:
            call.cancel()
            break
    with pytest.raises(grpc.RpcError) as error:
        for _ in call:
            pass
    assert error.value.code() == grpc.StatusCode.CANCELLED
    # The worker settles the pipeline right after the cancelled step.
    import time

    deadline = time.time() + 30
    while time.time() < deadline:
        info = client.pipelines()["tiny-seq"]
        if info.in_flight == 0 and {c.residency for c in info.components} == {"host"}:
            break
        time.sleep(0.1)
    assert {c.residency for c in info.components} == {"host"}


def test_the_cli_shows_the_streaming_settings(client, cli_bin):
    import subprocess

    r = subprocess.run([str(cli_bin), "--server", client.server.address, "list"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    rows = {line.split()[0]: line for line in r.stdout.splitlines()[1:] if line.strip()}
    assert "sequential 0MiB+2 keep 1MiB" in rows["tiny-nf4-seq"], r.stdout
    assert "sequential 64MiB+1" in rows["tiny-seq-coarse"], r.stdout


def test_list_shows_the_policy_and_policy_changes(client):
    pb2 = client.pb2
    info = client.pipelines()["tiny-nf4-seq"]
    assert info.offload_policy.policy == "sequential"
    assert info.offload_policy.group_mib == 0 and info.offload_policy.prefetch == 2
    assert info.offload_policy.resident_mib == 1
    # Loaded for streaming: it can go resident and come back to streaming.
    changed = client.models.SetOffloadPolicy(pb2.SetOffloadPolicyRequest(
        name="tiny-nf4-seq", policy=pb2.OffloadPolicy(policy="none")), timeout=60)
    assert {c.residency for c in changed.pipeline.components} == {"device"}
    changed = client.models.SetOffloadPolicy(pb2.SetOffloadPolicyRequest(
        name="tiny-nf4-seq", policy=pb2.OffloadPolicy(policy="sequential")), timeout=60)
    assert changed.pipeline.offload_policy.policy == "sequential"
    assert changed.pipeline.offload_policy.prefetch == 2  # the manifest's, kept
    assert {c.residency for c in changed.pipeline.components} == {"host"}
    error = rpc_error(client.models.SetOffloadPolicy, pb2.SetOffloadPolicyRequest(
        name="tiny", policy=pb2.OffloadPolicy(policy="sequential")))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_streamed_bytes_are_exported(client):
    before = parse_samples(scrape(client))
    start = last_sequence(client)
    client.generate_one(pipeline="tiny-seq", prompt="x", seed=2, steps=2)
    copied = {e.component: e.copied_bytes for e in events_since(client, start)
              if e.kind == "stream" and e.pipeline == "tiny-seq"}
    text = scrape(client)
    promtool_check(text)
    after = parse_samples(text)
    for component, n in copied.items():
        key = ("qpool_streamed_bytes_total",
               frozenset({("pipeline", "tiny-seq"), ("component", component), ("device", "cpu")}))
        assert after[key] - before.get(key, 0) == n > 0, component
