"""TLS, mTLS and admin credentials end to end (docs/security.md), with grpcio and the C++ CLI.

Certificates come from a throwaway PKI the module builds with the openssl command line: a CA, a
second CA the server does not trust, a server certificate for localhost/127.0.0.1 and client
certificates for "admin" and "viewer" (plus an "admin" from the untrusted CA).
"""

import os
import shutil
import ssl
import subprocess
import time
import urllib.error
import urllib.request

import grpc
import pytest

from conftest import QpoolServer, copy_pipeline, parse_samples, rpc_error

TOKEN = "s3cr3t-0123456789abcdef0123456789"
OTHER_TOKEN = "rotated-fedcba9876543210fedcba98"


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


class Pki:
    """A CA-signed set of PEM files under `root`."""

    def __init__(self, root):
        self.root = root
        self.ca("ca")
        self.ca("other-ca")
        self.issue("server", "ca", "localhost", "DNS:localhost,IP:127.0.0.1")
        self.issue("server-other", "other-ca", "localhost", "DNS:localhost,IP:127.0.0.1")
        self.issue("admin", "ca", "admin")
        self.issue("viewer", "ca", "viewer")
        self.issue("stranger", "other-ca", "admin")
        # Certificates that must name no admin: two CNs, e-mail and IP SANs only.
        self.issue("two-cns", "ca", "viewer/CN=admin")
        self.issue("mailer", "ca", "mailer", "email:admin@example.com,IP:10.0.0.9")

    def path(self, name):
        return str(self.root / name)

    def read(self, name):
        return (self.root / name).read_bytes()

    def ca(self, name):
        openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2",
                "-subj", f"/CN=qpool test {name}", cwd=self.root)

    def issue(self, name, ca, common_name, san=None):
        openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={common_name}",
                cwd=self.root)
        extra = []
        if san:
            (self.root / f"{name}.ext").write_text(f"subjectAltName={san}\n")
            extra = ["-extfile", f"{name}.ext"]
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
                "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", *extra, cwd=self.root)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.fail("the openssl command is missing: run scripts/setup.sh (Debian package openssl)")
    pki = Pki(tmp_path_factory.mktemp("pki"))
    tokens = pki.root / "tokens"
    tokens.write_text(f"# qpool admin tokens\n{TOKEN}\n")
    tokens.chmod(0o600)
    return pki


@pytest.fixture(scope="module")
def start(server_bin, source_repository, tmp_path_factory):
    """start(*flags, load="tiny", pipelines=("tiny",)) -> QpoolServer; each must exit 0 on
    SIGTERM at teardown."""
    servers = []

    def factory(*flags, load="tiny", pipelines=("tiny",)):
        workdir = tmp_path_factory.mktemp("qpool_server")
        repository = workdir / "models"
        repository.mkdir()
        for name in pipelines:
            copy_pipeline(source_repository, repository, name)
        server = QpoolServer(server_bin, repository, workdir, load=load, extra_args=flags)
        servers.append(server)
        return server.start()

    yield factory
    codes = [(server.stop(), server) for server in servers]
    failed = [s.stderr_text() for code, s in codes if code != 0 and s.address is not None]
    assert not failed, "a qpool-server did not exit 0 after SIGTERM:\n" + "\n".join(failed)


def channel(server, pki=None, ca="ca.pem", client=None):
    """A grpcio channel: plaintext without `pki`, else TLS trusting `ca`, presenting `client`'s
    certificate when given."""
    if pki is None:
        return grpc.insecure_channel(server.address)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=pki.read(ca),
        private_key=pki.read(f"{client}.key") if client else None,
        certificate_chain=pki.read(f"{client}.pem") if client else None)
    return grpc.secure_channel(server.address, credentials)


def stubs(pb, chan):
    return (pb.qpool_pb2_grpc.ModelServiceStub(chan), pb.qpool_pb2_grpc.InferenceServiceStub(chan))


def bearer(token):
    return (("authorization", f"Bearer {token}"),)


def cli(cli_bin, server, *args, env=None):
    full_env = {k: v for k, v in os.environ.items() if k != "QPOOL_TOKEN_FILE"}
    full_env.update(env or {})
    return subprocess.run([str(cli_bin), "--server", server.address, "--connect-timeout", "10",
                           *args], capture_output=True, text=True, timeout=120, env=full_env)


def admin_calls(pb2):
    """Every admin RPC with a valid request for the pipeline "tiny", by name."""
    return {
        "LoadPipeline": pb2.LoadPipelineRequest(name="tiny"),
        "UnloadPipeline": pb2.UnloadPipelineRequest(name="tiny"),
        "OffloadPipeline": pb2.OffloadPipelineRequest(name="tiny"),
        "OnloadPipeline": pb2.OnloadPipelineRequest(name="tiny"),
        "MovePipeline": pb2.MovePipelineRequest(name="tiny", device="cpu"),
        "SetOffloadPolicy": pb2.SetOffloadPolicyRequest(
            name="tiny", policy=pb2.OffloadPolicy(policy="none")),
        "EmptyCache": pb2.EmptyCacheRequest(),
        "GetAllocatorSnapshot": pb2.GetAllocatorSnapshotRequest(),
    }


def denied_counts(server, scheme="http", context=None):
    url = f"{scheme}://{server.metrics_address}/metrics"
    with urllib.request.urlopen(url, timeout=10, context=context) as response:
        samples = parse_samples(response.read().decode())
    return {(dict(labels)["class"], dict(labels)["code"]): value
            for (name, labels), value in samples.items() if name == "qpool_denied_calls_total"}


def metric(server, name):
    """The value of the unlabelled sample `name` on the server's /metrics (plain HTTP)."""
    url = f"http://{server.metrics_address}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        samples = parse_samples(response.read().decode())
    return next(value for (sample, _), value in samples.items() if sample == name)


def tiny_request(pb2):
    return pb2.GenerateRequest(pipeline="tiny", prompt="a red cube", seed=7)


def generate_png(inference, pb2, metadata=None):
    results = [r.result for r in inference.Generate(tiny_request(pb2), timeout=120,
                                                    metadata=metadata)
               if r.WhichOneof("event") == "result"]
    assert len(results) == 1 and results[0].images[0].png.startswith(b"\x89PNG")


def test_tls_serves_grpcio_and_the_cli_and_metrics_over_https(start, pki, pb, cli_bin):
    server = start("--tls-cert", pki.path("server.pem"), "--tls-key", pki.path("server.key"),
                   "--metrics-tls", "on", "--http-listen", "127.0.0.1:0")
    models, inference = stubs(pb, channel(server, pki))
    names = [p.name for p in models.ListPipelines(pb.qpool_pb2.ListPipelinesRequest(),
                                                  timeout=30).pipelines]
    assert names == ["tiny"]
    generate_png(inference, pb.qpool_pb2)

    # Plaintext, or TLS trusting another CA: no connection, so no call.
    for chan in (channel(server), channel(server, pki, ca="other-ca.pem")):
        error = rpc_error(stubs(pb, chan)[0].ListPipelines, pb.qpool_pb2.ListPipelinesRequest(),
                          timeout=10)
        assert error.code() == grpc.StatusCode.UNAVAILABLE

    listed = cli(cli_bin, server, "--ca", pki.path("ca.pem"), "list")
    assert listed.returncode == 0, listed.stderr
    assert "tiny" in listed.stdout
    health = cli(cli_bin, server, "--ca", pki.path("ca.pem"), "health")
    assert health.returncode == 0 and "SERVING" in health.stdout, health.stderr
    plain = cli(cli_bin, server, "list")
    assert plain.returncode == 3 and "pass --tls or --ca" in plain.stderr
    untrusted = cli(cli_bin, server, "--ca", pki.path("other-ca.pem"), "list")
    assert untrusted.returncode == 3, untrusted.stderr

    context = ssl.create_default_context(cafile=pki.path("ca.pem"))
    assert denied_counts(server, "https", context)[("admin", "UNAUTHENTICATED")] == 0
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        denied_counts(server, "http")

    # The HTTP API serves HTTPS only, with the same certificate.
    openai = pytest.importorskip("openai", reason="the openai package is not installed")
    https = openai.OpenAI(base_url=f"https://{server.http_address}/v1", api_key="none",
                          max_retries=0, http_client=openai.DefaultHttpxClient(verify=context))
    assert [m.id for m in https.models.list()] == ["tiny"]
    plain = openai.OpenAI(base_url=f"http://{server.http_address}/v1", api_key="none",
                          max_retries=0, timeout=10)
    with pytest.raises(openai.APIConnectionError):
        plain.models.list()


def test_mtls_admits_only_certificates_of_the_client_ca(start, pki, pb, cli_bin):
    server = start("--tls-cert", pki.path("server.pem"), "--tls-key", pki.path("server.key"),
                   "--tls-client-ca", pki.path("ca.pem"))
    request = pb.qpool_pb2.ListPipelinesRequest()
    for client in (None, "stranger"):  # no certificate; "admin" signed by an untrusted CA
        error = rpc_error(stubs(pb, channel(server, pki, client=client))[0].ListPipelines,
                          request, timeout=10)
        assert error.code() == grpc.StatusCode.UNAVAILABLE, client
    models, inference = stubs(pb, channel(server, pki, client="viewer"))
    assert len(models.ListPipelines(request, timeout=30).pipelines) == 1
    generate_png(inference, pb.qpool_pb2)

    ok = cli(cli_bin, server, "--ca", pki.path("ca.pem"), "--cert", pki.path("viewer.pem"),
             "--key", pki.path("viewer.key"), "list")
    assert ok.returncode == 0 and "tiny" in ok.stdout, ok.stderr
    refused = cli(cli_bin, server, "--ca", pki.path("ca.pem"), "list")
    assert refused.returncode == 3, refused.stderr


def test_admin_calls_need_a_valid_bearer_token(start, pki, pb, cli_bin, tmp_path):
    token_file = tmp_path / "tokens"
    shutil.copy(pki.path("tokens"), token_file)
    server = start("--admin-token-file", str(token_file))
    pb2 = pb.qpool_pb2
    models, inference = stubs(pb, channel(server))

    denied = 0
    for method, request in admin_calls(pb2).items():
        for metadata in (None, bearer("not-the-token-0123456789"), (("authorization", TOKEN),)):
            error = rpc_error(getattr(models, method), request, timeout=30, metadata=metadata)
            assert error.code() == grpc.StatusCode.UNAUTHENTICATED, (method, metadata)
            assert method in error.details()
            denied += 1
    # Refused calls did nothing: tiny is still loaded and served.
    assert models.ListPipelines(pb2.ListPipelinesRequest(), timeout=30).pipelines[0].state == \
        pb2.PIPELINE_STATE_LOADED
    counts = denied_counts(server)
    assert counts[("admin", "UNAUTHENTICATED")] == denied
    assert counts[("inference", "UNAUTHENTICATED")] == 0

    # Inference and read-only calls stay open (--protect admin, the default).
    generate_png(inference, pb2)
    assert models.GetMemoryReport(pb2.GetMemoryReportRequest(), timeout=30).devices

    # With the token every admin call runs.
    for method in ("SetOffloadPolicy", "EmptyCache", "UnloadPipeline", "LoadPipeline"):
        getattr(models, method)(admin_calls(pb2)[method], timeout=120, metadata=bearer(TOKEN))

    # The CLI: refused with a hint without the token, accepted with --token-file or the variable.
    refused = cli(cli_bin, server, "unload", "tiny")
    assert refused.returncode == 1
    assert "UNAUTHENTICATED" in refused.stderr and "--token-file" in refused.stderr
    flag = cli(cli_bin, server, "--token-file", str(token_file), "unload", "tiny")
    assert flag.returncode == 0, flag.stderr
    env = cli(cli_bin, server, "load", "tiny", env={"QPOOL_TOKEN_FILE": str(token_file)})
    assert env.returncode == 0, env.stderr

    # Rotation without a restart: the new token works at once, the removed one stops working.
    staged = tmp_path / "tokens.new"
    staged.write_text(f"{OTHER_TOKEN}\n")
    os.replace(staged, token_file)
    models.EmptyCache(pb2.EmptyCacheRequest(), timeout=30, metadata=bearer(OTHER_TOKEN))
    error = rpc_error(models.EmptyCache, pb2.EmptyCacheRequest(), timeout=30,
                      metadata=bearer(TOKEN))
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED

    # Revocation fails closed: an empty, comments-only, partly malformed or deleted file leaves
    # no token valid, until a good file is read again.
    for text in ("", "# revoked\n", f"{OTHER_TOKEN}\nnot-a-token\n", None):
        if text is None:
            token_file.unlink()
        else:
            staged.write_text(text)
            os.replace(staged, token_file)
        error = rpc_error(models.EmptyCache, pb2.EmptyCacheRequest(), timeout=30,
                          metadata=bearer(OTHER_TOKEN))
        assert error.code() == grpc.StatusCode.UNAUTHENTICATED, repr(text)
    staged.write_text(f"{OTHER_TOKEN}\n")
    os.replace(staged, token_file)
    models.EmptyCache(pb2.EmptyCacheRequest(), timeout=30, metadata=bearer(OTHER_TOKEN))
    assert any("no token is valid until a good file is read" in line
               for line in server.stdout_lines)


def test_protect_adds_classes_and_admin_stays_protected(start, pki, pb):
    server = start("--admin-token-file", pki.path("tokens"), "--protect", "read", load="")
    pb2 = pb.qpool_pb2
    models, _ = stubs(pb, channel(server))
    for call, request in ((models.EmptyCache, pb2.EmptyCacheRequest()),
                          (models.ListPipelines, pb2.ListPipelinesRequest())):
        assert rpc_error(call, request, timeout=30).code() == grpc.StatusCode.UNAUTHENTICATED
        call(request, timeout=30, metadata=bearer(TOKEN))


def test_client_certificates_on_the_allow_list_make_admin_calls(start, pki, pb, cli_bin):
    server = start("--tls-cert", pki.path("server.pem"), "--tls-key", pki.path("server.key"),
                   "--tls-client-ca", pki.path("ca.pem"), "--admin-clients", "admin",
                   "--admin-token-file", pki.path("tokens"), "--metrics-tls", "on")
    pb2 = pb.qpool_pb2
    admin, _ = stubs(pb, channel(server, pki, client="admin"))
    viewer, viewer_inference = stubs(pb, channel(server, pki, client="viewer"))
    calls = admin_calls(pb2)

    error = rpc_error(viewer.UnloadPipeline, calls["UnloadPipeline"], timeout=30)
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "'viewer'" in error.details() and "admin calls" in error.details()
    generate_png(viewer_inference, pb2)  # inference is open to every verified client
    admin.UnloadPipeline(calls["UnloadPipeline"], timeout=120)
    viewer.LoadPipeline(calls["LoadPipeline"], timeout=120, metadata=bearer(TOKEN))

    context = ssl.create_default_context(cafile=pki.path("ca.pem"))
    assert denied_counts(server, "https", context)[("admin", "PERMISSION_DENIED")] == 1

    tls = ["--ca", pki.path("ca.pem")]
    as_admin = tls + ["--cert", pki.path("admin.pem"), "--key", pki.path("admin.key")]
    as_viewer = tls + ["--cert", pki.path("viewer.pem"), "--key", pki.path("viewer.key")]
    assert cli(cli_bin, server, *as_admin, "unload", "tiny").returncode == 0
    refused = cli(cli_bin, server, *as_viewer, "load", "tiny")
    assert refused.returncode == 1 and "PERMISSION_DENIED" in refused.stderr
    assert cli(cli_bin, server, *as_admin, "load", "tiny").returncode == 0


def test_only_a_leaf_certificates_dns_uri_or_single_cn_names_an_admin(start, pki, pb):
    """Note [Admin credentials]: a CA certificate presented as a client's, a subject with two CNs
    (one of them on the list) and e-mail or IP SANs on the list are no admin's identity."""
    server = start("--tls-cert", pki.path("server.pem"), "--tls-key", pki.path("server.key"),
                   "--tls-client-ca", pki.path("ca.pem"),
                   "--admin-clients", "admin,admin@example.com,10.0.0.9,qpool test ca", load="")
    request = pb.qpool_pb2.EmptyCacheRequest()
    for client, why in (("ca", "is a CA certificate"), ("two-cns", "names no client"),
                        ("mailer", "'mailer' is not allowed")):
        models, _ = stubs(pb, channel(server, pki, client=client))
        error = rpc_error(models.EmptyCache, request, timeout=30)
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED, client
        assert why in error.details(), (client, error.details())
    stubs(pb, channel(server, pki, client="admin"))[0].EmptyCache(request, timeout=30)


def test_protect_all_guards_every_call_but_health(start, pki, pb):
    server = start("--admin-token-file", pki.path("tokens"), "--protect", "all")
    pb2 = pb.qpool_pb2
    chan = channel(server)
    models, inference = stubs(pb, chan)
    calls = [
        (models.ListPipelines, pb2.ListPipelinesRequest()),
        (models.GetMemoryReport, pb2.GetMemoryReportRequest()),
        (inference.Encode, pb2.EncodeRequest(pipeline="tiny", prompts=["a cube"])),
    ]
    for call, request in calls:
        assert rpc_error(call, request, timeout=30).code() == grpc.StatusCode.UNAUTHENTICATED
        call(request, timeout=120, metadata=bearer(TOKEN))
    generate = lambda m: inference.Generate(tiny_request(pb2), timeout=30, metadata=m)
    watch = lambda m: models.WatchMemory(pb2.WatchMemoryRequest(), timeout=30, metadata=m)
    for stream in (generate, watch):
        with pytest.raises(grpc.RpcError) as error:
            next(iter(stream(None)))
        assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
    generate_png(inference, pb2, metadata=bearer(TOKEN))
    watcher = watch(bearer(TOKEN))
    models.UnloadPipeline(pb2.UnloadPipelineRequest(name="tiny"), timeout=60,
                          metadata=bearer(TOKEN))
    assert next(iter(watcher)).kind  # the unload's memory event
    watcher.cancel()
    counts = denied_counts(server)
    assert counts[("read", "UNAUTHENTICATED")] == 3 and counts[("inference", "UNAUTHENTICATED")] == 2

    health_pb2 = pytest.importorskip("grpc_health.v1.health_pb2")
    from grpc_health.v1 import health_pb2_grpc

    check = health_pb2_grpc.HealthStub(chan).Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert check.status == health_pb2.HealthCheckResponse.SERVING


def test_a_renewed_certificate_serves_new_connections_without_a_restart(start, pki, pb,
                                                                         tmp_path):
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    shutil.copy(pki.path("server.pem"), cert)
    shutil.copy(pki.path("server.key"), key)
    server = start("--tls-cert", str(cert), "--tls-key", str(key), "--tls-reload-seconds", "1",
                   load="")
    request = pb.qpool_pb2.ListPipelinesRequest()
    stubs(pb, channel(server, pki))[0].ListPipelines(request, timeout=30)

    # The renewal, as cert-manager writes a Secret: new files renamed over the old ones.
    for source, target in ((pki.path("server-other.key"), key), (pki.path("server-other.pem"), cert)):
        shutil.copy(source, f"{target}.new")
        os.replace(f"{target}.new", target)
    deadline = time.monotonic() + 20
    while True:
        try:
            stubs(pb, channel(server, pki, ca="other-ca.pem"))[0].ListPipelines(request, timeout=5)
            break
        except grpc.RpcError as error:
            assert error.code() == grpc.StatusCode.UNAVAILABLE
            assert time.monotonic() < deadline, "the renewed certificate was not served in 20 s"
            time.sleep(0.5)
    error = rpc_error(stubs(pb, channel(server, pki))[0].ListPipelines, request, timeout=10)
    assert error.code() == grpc.StatusCode.UNAVAILABLE

    # Note [TLS renewal]: renewals that do not validate (garbage, a truncated chain, the key of
    # another certificate) are refused and counted; the last good pair keeps serving new clients.
    good_cert = cert.read_bytes()
    broken = [(cert, b"not a certificate\n"), (cert, good_cert[: len(good_cert) // 2]),
              (key, pki.read("server.key"))]
    for failures, (target, content) in enumerate(broken, start=1):
        if target == key:
            cert.write_bytes(good_cert)  # back to the good certificate, with the wrong key
        target.with_name(target.name + ".new").write_bytes(content)
        os.replace(target.with_name(target.name + ".new"), target)
        deadline = time.monotonic() + 20
        while metric(server, "qpool_tls_reload_failures_total") < failures:
            assert time.monotonic() < deadline, f"renewal {failures} was not refused in 20 s"
            time.sleep(0.2)
        stubs(pb, channel(server, pki, ca="other-ca.pem"))[0].ListPipelines(request, timeout=10)
    assert metric(server, "qpool_tls_certificate_expiry_seconds") > 86400


@pytest.mark.parametrize("case", ["key-of-another-certificate", "missing-certificate",
                                  "short-token", "protect-without-credentials",
                                  "allow-list-without-client-ca", "protect-nothing",
                                  "protect-commas", "empty-allow-list", "empty-token-file"])
def test_start_up_refuses_credentials_that_cannot_work(server_bin, pki, tmp_path, case):
    short = tmp_path / "short-tokens"
    short.write_text("# too short\nabc\n")
    flags, expected = {
        "key-of-another-certificate": (
            ["--tls-cert", pki.path("server.pem"), "--tls-key", pki.path("admin.key")],
            "admin.key is not the private key of the certificate in"),
        "missing-certificate": (
            ["--tls-cert", str(tmp_path / "none.pem"), "--tls-key", pki.path("server.key")],
            "none.pem"),
        "short-token": (["--admin-token-file", str(short)], "short-tokens line 2"),
        "protect-without-credentials": (["--protect", "inference"], "no credential is configured"),
        "allow-list-without-client-ca": (["--admin-clients", "admin"],
                                         "--admin-clients needs --tls-client-ca"),
        "protect-nothing": (["--admin-token-file", pki.path("tokens"), "--protect", ""],
                            "--protect takes one or more"),
        "protect-commas": (["--admin-token-file", pki.path("tokens"), "--protect", ","],
                           "--protect takes one or more"),
        "empty-allow-list": (["--admin-clients", ""], "--admin-clients takes one or more"),
        "empty-token-file": (["--admin-token-file", ""], "--admin-token-file needs a value"),
    }[case]
    (tmp_path / "models").mkdir()
    result = subprocess.run([str(server_bin), "--model-repository", str(tmp_path / "models"),
                             "--listen", "127.0.0.1:0", *flags], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    assert expected in result.stderr
    assert "listening" not in result.stdout
