"""The OpenAI images API over HTTP (--http-listen, Note [OpenAI images edge]) against a real
qpool-server, with the official `openai` package as the client: images as b64_json, the same
PNG bytes as gRPC for the same request and seed, OpenAI error objects with the mapped HTTP codes,
bearer tokens, a client that hangs up cancelling its generation, and hostile input (bad JSON,
wrong content types and methods, huge bodies, a thousand idle connections) that leaves the
server serving."""

import base64
import http.client
import json
import resource
import signal
import socket
import time

import pytest

from conftest import (TINY_DEFAULT_SIZE, parse_samples, run_concurrently, scrape, set_limits,
                      wait_idle)

openai = pytest.importorskip("openai", reason="the openai package is not installed")

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
LONG = dict(prompt="long", steps=50, size="256x256", seed=4)


@pytest.fixture(scope="module")
def client(make_server):
    # tiny, and `short`: a copy of it that queues at most 2 requests.
    return make_server(pipelines=("tiny", ("tiny", "short")),
                       setup=lambda repository: set_limits(repository / "short", max_queue=2),
                       extra_args=["--http-listen", "127.0.0.1:0"])


@pytest.fixture(scope="module")
def api(client):
    return openai.OpenAI(base_url=f"http://{client.server.http_address}/v1", api_key="none",
                         max_retries=0, timeout=120)


def request(client, method, path, body=None, headers=None):
    """(status, headers, parsed JSON body) of one raw HTTP request."""
    connection = http.client.HTTPConnection(client.server.http_address, timeout=60)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), json.loads(response.read() or b"{}")
    finally:
        connection.close()


def post_json(client, fields, **headers):
    return request(client, "POST", "/v1/images/generations", json.dumps(fields).encode(),
                   {"Content-Type": "application/json", **headers})


def test_openai_client_gets_the_grpc_images_for_the_same_seed(client, api):
    reply = api.images.generate(model="tiny", prompt="a red square", n=2, size="64x48",
                                response_format="b64_json", extra_body={"seed": 7, "steps": 2})
    pngs = [base64.b64decode(d.b64_json) for d in reply.data]
    assert len(pngs) == 2 and all(p.startswith(PNG_MAGIC) for p in pngs) and pngs[0] != pngs[1]
    qpool = reply.model_extra["qpool"]
    assert (qpool["seed"], qpool["steps"], qpool["width"], qpool["height"]) == (7, 2, 64, 48)
    assert qpool["device"] == "cpu" and qpool["timings"]["total_seconds"] > 0
    assert abs(reply.created - time.time()) < 600
    grpc_result = client.generate_one(pipeline="tiny", prompt="a red square", num_images=2,
                                      width=64, height=48, seed=7, steps=2)
    assert [i.png for i in grpc_result.images] == pngs


def test_defaults_come_from_the_manifest(api):
    reply = api.images.generate(model="tiny", prompt="defaults", extra_body={"steps": 1})
    assert len(reply.data) == 1
    qpool = reply.model_extra["qpool"]
    assert qpool["width"] == qpool["height"] == TINY_DEFAULT_SIZE


def test_models_and_health(client, api):
    models = {m.id: m for m in api.models.list()}
    assert set(models) == {"tiny", "short"}
    assert models["tiny"].owned_by == "qpool" and models["tiny"].model_extra["state"] == "loaded"
    assert request(client, "GET", "/health/live")[0] == 200
    assert request(client, "GET", "/health/ready")[:3:2] == (200, {"status": "ready"})


@pytest.mark.parametrize("fields, code, says", [
    (dict(model="nope", prompt="x"), 404, "nope"),
    (dict(model="tiny", prompt="x", size="64"), 400, "WIDTHxHEIGHT"),
    (dict(model="tiny", prompt="x", size="0x64"), 400, "WIDTHxHEIGHT"),
    (dict(model="tiny", prompt="x", response_format="url"), 400, "b64_json"),
    (dict(model="tiny", prompt="x", step=3), 400, "unknown field 'step'"),
    (dict(model="tiny", prompt="x", steps=-1), 400, "'steps'"),
    (dict(model="tiny", prompt="x", steps="4"), 400, "'steps'"),
    (dict(model="tiny", prompt="x", seed=2 ** 64), 400, "'seed'"),
    (dict(model="tiny", prompt="x", guidance_scale="high"), 400, "'guidance_scale'"),
    (dict(model="tiny", prompt="x", steps=10 ** 6), 400, "steps"),
    (dict(model="tiny", prompt=7), 400, "'prompt'"),
    (dict(model="tiny", prompt="x", n=99), 400, "99"),
    (dict(model="tiny", prompt="x", stream="no"), 400, "'stream'"),
    (dict(prompt="x"), 400, "'model'"),
    (dict(model="tiny"), 400, "'prompt'"),
])
def test_bad_requests_get_openai_errors(client, fields, code, says):
    status, _, body = post_json(client, fields)
    assert status == code, body
    assert says in body["error"]["message"] and body["error"]["code"] in (
        "INVALID_ARGUMENT", "NOT_FOUND")


def test_the_openai_client_raises_the_mapped_errors(api):
    with pytest.raises(openai.NotFoundError):
        api.images.generate(model="nope", prompt="x")
    with pytest.raises(openai.BadRequestError, match="WIDTHxHEIGHT"):
        api.images.generate(model="tiny", prompt="x", size="huge")


def test_malformed_http_is_refused_and_the_server_keeps_serving(client, api):
    json_type = {"Content-Type": "application/json"}
    assert request(client, "POST", "/v1/images/generations", b"{not json", json_type)[0] == 400
    assert request(client, "POST", "/v1/images/generations", b"[1, 2]", json_type)[0] == 400
    assert request(client, "POST", "/v1/images/generations", b"{}", {"Content-Type": "text/plain"}
                   )[0] == 415
    status, headers, _ = request(client, "GET", "/v1/images/generations")
    assert status == 405 and headers["Allow"] == "POST"
    assert request(client, "DELETE", "/v1/models")[0] == 405
    assert request(client, "GET", "/v1/elsewhere")[0] == 404
    # A body past the limit: announced (Content-Length), 413 before it is read; streamed
    # (chunked), 413 or the connection closed while it arrives (the peer's reset may overtake the
    # reply), the rest never read.
    head = b"POST /v1/images/generations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    assert raw_status(client, head + b"Content-Length: %d\r\n\r\n" % (2 << 20)) == 413
    chunk = b"%x\r\n%s\r\n" % (64 << 10, b" " * (64 << 10))
    assert raw_status(client, head + b"Transfer-Encoding: chunked\r\n\r\n", chunk) in (413, None)
    assert len(api.images.generate(model="tiny", prompt="still here",
                                   extra_body={"steps": 1}).data) == 1


def raw_status(client, head, chunk=b""):
    """The HTTP status code a raw request gets (None if the connection closes without one):
    `head`, then `chunk` sent until the server answers or closes."""
    host, port = client.server.http_address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(head)
        try:
            for _ in range(64 if chunk else 0):
                s.sendall(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
        reply = b""
        try:
            while b"\r\n" not in reply:
                data = s.recv(4096)
                if not data:
                    break
                reply += data
        except ConnectionResetError:
            pass
    return int(reply.split(b" ", 2)[1]) if reply else None


def test_a_thousand_idle_connections_leave_the_server_serving(client, api):
    # The server raises its own soft limit on open files; this process needs room for its end.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1200 <= hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1200, hard))
    count = 1000 if hard >= 1200 else max(hard - 200, 100)  # a machine capped below 1200
    host, port = client.server.http_address.rsplit(":", 1)
    idle = [socket.create_connection((host, int(port)), timeout=10) for _ in range(count)]
    try:
        idle[0].sendall(b"POST /v1/images/generations HTTP/1.1\r\nHost: x\r\n")  # and stops
        reply = api.images.generate(model="tiny", prompt="past the idle ones",
                                    extra_body={"steps": 1})
        assert len(reply.data) == 1
    finally:
        for s in idle:
            s.close()


def cancelled_requests(client):
    samples = parse_samples(scrape(client))
    return sum(v for (name, labels), v in samples.items()
               if name == "qpool_requests_total" and ("status", "CANCELLED") in labels)


def load_signals(client):
    """Note [Load signals]: tiny's waiting and running requests, and the server's."""
    samples = parse_samples(scrape(client))
    tiny = frozenset({("pipeline", "tiny")})
    return tuple(int(samples[key]) for key in (
        ("qpool_pipeline_requests_waiting", tiny), ("qpool_pipeline_requests_running", tiny),
        ("qpool_requests_waiting", frozenset()), ("qpool_requests_running", frozenset())))


def send_long(client, stream):
    host, port = client.server.http_address.rsplit(":", 1)
    body = json.dumps(dict(model="tiny", stream=stream, **LONG)).encode()
    s = socket.create_connection((host, int(port)), timeout=10)
    s.sendall(b"POST /v1/images/generations HTTP/1.1\r\nHost: x\r\nContent-Type: "
              b"application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" +
              body)
    return s


def wait_for(condition, timeout=10):
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
    return condition()


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_hangs_up_cancels_its_generation(client, stream):
    """Waiting for the whole reply, or between two events of a stream; a second request waits
    behind the first meanwhile, and the load signals a router reads count both."""
    before = cancelled_requests(client)
    assert load_signals(client) == (0, 0, 0, 0)
    first = send_long(client, stream)
    assert wait_for(lambda: client.pipelines()["tiny"].in_flight == 1)
    second = send_long(client, stream)
    assert wait_for(lambda: load_signals(client) == (1, 1, 1, 1)), load_signals(client)
    if stream:
        assert first.recv(4096).startswith(b"HTTP/1.1 200")  # the stream has begun
    first.close()
    second.close()
    assert wait_for(lambda: cancelled_requests(client) == before + 2)
    assert client.pipelines()["tiny"].in_flight == 0 and load_signals(client) == (0, 0, 0, 0)


def test_bearer_tokens_guard_inference_when_protected(make_server, tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text("s3cret-token-of-enough-length-0123456789\n")
    guarded = make_server(extra_args=["--http-listen", "127.0.0.1:0", "--admin-token-file",
                                      str(tokens), "--protect", "inference"])
    base = f"http://{guarded.server.http_address}/v1"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=base, api_key="wrong", max_retries=0).images.generate(
            model="tiny", prompt="x", extra_body={"steps": 1})
    status, headers, _ = post_json(guarded, dict(model="tiny", prompt="x"))
    assert status == 401 and headers["WWW-Authenticate"] == "Bearer"
    api = openai.OpenAI(base_url=base, api_key="s3cret-token-of-enough-length-0123456789",
                        max_retries=0)
    assert len(api.images.generate(model="tiny", prompt="x", extra_body={"steps": 1}).data) == 1
    assert [m.id for m in api.models.list()] == ["tiny"]  # read is not protected


def test_a_full_queue_is_429_with_retry_after(client):
    replies = run_concurrently(8, lambda i: post_json(client, dict(
        model="short", prompt="queue", steps=20, seed=i)))[0]
    codes = sorted(status for status, _, _ in replies.values())
    assert 200 in codes and 429 in codes and set(codes) == {200, 429}, codes
    for status, headers, body in replies.values():
        if status == 429:
            assert headers["Retry-After"] == "1" and body["error"]["type"] == "rate_limit_error"
            assert "limits.max_queue 2" in body["error"]["message"]
    assert wait_idle(client, "short") == 0


def test_draining_is_503_on_ready_and_on_new_generations(make_server):
    """SIGTERM with a generation in flight: /health/ready turns 503 from the drain notice on,
    and once the drain begins a new generation is 503 (retry elsewhere) while the one in flight
    still runs; then the server exits 0 (the fixture checks)."""
    draining = make_server(extra_args=["--http-listen", "127.0.0.1:0", "--drain-notice-seconds",
                                       "1", "--drain-seconds", "20"])
    running = draining.inference.Generate(draining.pb2.GenerateRequest(
        pipeline="tiny", prompt="long", steps=50, width=256, height=256, num_images=4, seed=1),
        timeout=120)
    assert next(running).WhichOneof("event") == "progress"
    draining.server.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    while request(draining, "GET", "/health/ready")[0] != 503 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert request(draining, "GET", "/health/ready")[2] == {"status": "draining"}
    # Past the 1 s notice the pool refuses at once (a generation sent during the notice would
    # be served, queued behind the running one).
    time.sleep(1.5)
    status, headers, body = post_json(draining, dict(model="tiny", prompt="x", steps=1))
    assert status == 503 and headers["Retry-After"] == "1", body
    assert "draining" in body["error"]["message"] and body["error"]["code"] == "UNAVAILABLE"
    running.cancel()  # the drain then ends at once


def sse_events(text):
    """[(event, data as parsed JSON)] of a text/event-stream body."""
    events = []
    for block in text.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.split("\n"))
        events.append((fields["event"], json.loads(fields["data"])))
    return events


def curl_stream(client, fields):
    """(HTTP status, content type, body) of a streamed generation, read by curl as it comes."""
    import shutil
    import subprocess
    if shutil.which("curl") is None:
        pytest.fail("curl is missing: run scripts/setup.sh (Debian package curl)")
    out = subprocess.run(
        ["curl", "-sN", "--max-time", "120", "-w", "\n%{http_code} %{content_type}",
         "-H", "Content-Type: application/json", "-d", json.dumps(fields),
         f"http://{client.server.http_address}/v1/images/generations"],
        capture_output=True, text=True, timeout=150, check=True).stdout
    body, _, status = out.rpartition("\n")
    code, content_type = status.split(" ", 1)
    return int(code), content_type, body


def test_stream_sends_each_step_then_each_image(client, api):
    """Note [Image events], read with curl: one progress event per step, then one completed
    event per image, with the PNGs of the same request unstreamed."""
    fields = dict(model="tiny", prompt="streamed", n=2, size="64x64", seed=11, steps=3)
    code, content_type, body = curl_stream(client, dict(fields, stream=True))
    assert (code, content_type) == (200, "text/event-stream")
    events = sse_events(body)
    assert [e for e, _ in events] == ["progress"] * 3 + ["image_generation.completed"] * 2
    assert [(d["step"], d["total"]) for _, d in events[:3]] == [(1, 3), (2, 3), (3, 3)]
    done = [d for _, d in events[3:]]
    assert [d["index"] for d in done] == [0, 1] and {d["size"] for d in done} == {"64x64"}
    assert done[0]["qpool"]["seed"] == 11 and done[0]["output_format"] == "png"
    whole = api.images.generate(model="tiny", prompt="streamed", n=2, size="64x64",
                                extra_body={"seed": 11, "steps": 3})
    assert [d["b64_json"] for d in done] == [d.b64_json for d in whole.data]


def test_a_stream_refused_at_once_is_a_plain_error(client):
    code, content_type, body = curl_stream(client, dict(model="nope", prompt="x", stream=True))
    assert (code, content_type) == (404, "application/json")
    assert json.loads(body)["error"]["code"] == "NOT_FOUND"
