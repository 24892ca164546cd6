"""Offline checks of deploy/: the Kubernetes overlays, the Grafana dashboard's ConfigMap and the
Prometheus alert rules.

Each overlay of deploy/kubernetes, and deploy/grafana, is rendered by a small kustomize subset
(render() below). It refuses any kustomization feature it does not implement, so it cannot
silently differ from kustomize, and is compared with `kubectl kustomize` where kubectl is
installed. Every object is validated against the Kubernetes 1.33 schema, and the properties
qpool depends on are asserted: GPUs, probes, drain time, flags, security context, TLS and tokens
from Secrets, the NetworkPolicy, the autoscaling examples, the dashboard ConfigMap carrying
deploy/grafana/qpool.json. The rules of deploy/prometheus go through
`promtool check rules` and their unit tests, and every metric they use must be documented in
docs/metrics.md. (tests/integration/test_dashboard.py checks the dashboard's queries.)

Run: .venv/bin/python -m pytest tests/python/test_deploy.py
"""

import copy
import functools
import json
import os
import pathlib
import re
import shutil
import subprocess

import jsonpatch
import kubernetes_validate
import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
KUBE = ROOT / "deploy" / "kubernetes"
GRAFANA = ROOT / "deploy" / "grafana"
DASHBOARD_CONFIGMAP = "qpool-grafana-dashboard"
RULES = ROOT / "deploy" / "prometheus" / "qpool-rules.yaml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "qpool-rules.test.yaml"
K8S_VERSION = "1.33.0"
# Prometheus Operator kinds: no schema in kubernetes_validate, checked structurally instead.
OPERATOR_KINDS = {"ServiceMonitor", "PrometheusRule"}
# overlay: (GPUs per pod, QPOOL_DEVICES, image tag suffix, TLS and tokens (the secure component))
OVERLAYS = {
    "gpu-1": (1, "cuda", "", True),
    "gpu-2": (2, "cuda:0,cuda:1", "", True),
    "cpu": (None, "cpu", "-cpu", False),
}
SECURE_OVERLAYS = sorted(o for o, (*_, secure) in OVERLAYS.items() if secure)
GRPC_PORT = 50051
HTTP_PORT = 8080
METRICS_PORT = 9100
# What deploy/kubernetes/secure mounts: Secret name -> the keys the server reads.
SECRETS = {"qpool-tls": {"tls.crt", "tls.key"}, "qpool-tokens": {"tokens"}}
# The NetworkPolicy's peers: the client label, and Prometheus in the monitoring namespace.
CLIENT_LABEL = {"qpool.io/client": "true"}
PROMETHEUS_PEER = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}

# ---------------------------------------------------------------------------------------------
# A kustomize subset: resources (files or directories), configMapGenerator entries made of files
# in the kustomization's folder (with generatorOptions that turn the name hash off), components,
# JSON 6902 patches with a kind/name target and an inline list of ops, and images. Order as
# kustomize's: resources and generated ConfigMaps, then components (their resources join, their
# patches and images apply to everything so far), then this kustomization's patches, then its
# images.

KUSTOMIZATION_KEYS = {"apiVersion", "kind", "resources", "configMapGenerator", "generatorOptions",
                      "components", "patches", "images"}
API_VERSIONS = {"Kustomization": "kustomize.config.k8s.io/v1beta1",
                "Component": "kustomize.config.k8s.io/v1alpha1"}


class UnsupportedKustomization(Exception):
    pass


def read_kustomization(directory, kind):
    path = directory / "kustomization.yaml"
    spec = yaml.safe_load(path.read_text())
    unknown = set(spec) - KUSTOMIZATION_KEYS
    if unknown:
        raise UnsupportedKustomization(
            f"{path}: {sorted(unknown)} not implemented by this test's renderer; implement them "
            "in tests/python/test_deploy.py or keep to its subset")
    if (spec.get("kind"), spec.get("apiVersion")) != (kind, API_VERSIONS[kind]):
        raise UnsupportedKustomization(f"{path}: expected kind {kind}, {API_VERSIONS[kind]}")
    return spec


def object_id(obj):
    return obj["kind"], obj["metadata"]["name"]


def apply_patch(entry, objects, where):
    if set(entry) != {"target", "patch"} or set(entry["target"]) != {"kind", "name"}:
        raise UnsupportedKustomization(f"{where}: patches need exactly target (kind, name) and "
                                       f"an inline patch, got {entry}")
    ops = yaml.safe_load(entry["patch"])
    if not isinstance(ops, list) or not all(isinstance(op, dict) and "op" in op for op in ops):
        raise UnsupportedKustomization(f"{where}: only JSON 6902 patches (a list of ops)")
    target = entry["target"]
    hits = [i for i, o in enumerate(objects)
            if o["kind"] == target["kind"] and o["metadata"]["name"] == target["name"]]
    assert hits, f"{where}: patch target {target} matches no object"
    for i in hits:
        objects[i] = jsonpatch.JsonPatch(ops).apply(objects[i])


def split_image(image):
    """'registry:5000/qpool:0.1.0' -> ('registry:5000/qpool', '0.1.0'); no tag -> None."""
    name, sep, tag = image.rpartition(":")
    return (name, tag) if sep and "/" not in tag else (image, None)


def set_images(entry, objects, where):
    if not set(entry) <= {"name", "newName", "newTag"} or "name" not in entry:
        raise UnsupportedKustomization(f"{where}: images entries take name, newName, newTag")
    matched = False
    for obj in objects:
        pod = obj.get("spec", {}).get("template", {}).get("spec", {})
        for container in pod.get("containers", []) + pod.get("initContainers", []):
            name, tag = split_image(container["image"])
            if name == entry["name"]:
                tag = entry.get("newTag", tag)
                container["image"] = entry.get("newName", name) + (f":{tag}" if tag else "")
                matched = True
    assert matched, f"{where}: image {entry['name']} is used by no container"


def generate_config_maps(spec, directory):
    """The ConfigMaps of spec's configMapGenerator: one data key per file, named after it."""
    options = spec.get("generatorOptions", {})
    entries = spec.get("configMapGenerator", [])
    if not set(options) <= {"disableNameSuffixHash", "labels", "annotations"}:
        raise UnsupportedKustomization(f"{directory}: generatorOptions {sorted(options)}")
    if entries and options.get("disableNameSuffixHash") is not True:
        # kustomize appends a hash of the content to the name; this renderer does not compute it.
        raise UnsupportedKustomization(f"{directory}: configMapGenerator needs generatorOptions "
                                       "disableNameSuffixHash: true here")
    generated = []
    for entry in entries:
        if set(entry) != {"name", "files"}:
            raise UnsupportedKustomization(f"{directory}: configMapGenerator entries take name "
                                           f"and files only, got {sorted(entry)}")
        data = {}
        for name in entry["files"]:
            path = (directory / name).resolve()
            # kustomize's default load restrictor: nothing outside the kustomization's folder.
            if "=" in name or path.parent != directory.resolve():
                raise UnsupportedKustomization(f"{directory}: configMapGenerator file {name!r}: "
                                               "only files of the kustomization's folder")
            data[path.name] = path.read_text()
        metadata = {"name": entry["name"]}
        for key in ("labels", "annotations"):
            if options.get(key):
                metadata[key] = dict(options[key])
        generated.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata,
                          "data": data})
    return generated


def render(directory, kind="Kustomization", objects=None):
    """The objects kustomize builds from directory (a Kustomization, or a Component applied to
    objects)."""
    spec = read_kustomization(directory, kind)
    objects = [] if objects is None else objects
    for entry in spec.get("resources", []):
        path = directory / entry
        if path.is_dir():
            objects.extend(render(path))
        else:
            objects.extend(doc for doc in yaml.safe_load_all(path.read_text()) if doc)
    objects.extend(generate_config_maps(spec, directory))
    for entry in spec.get("components", []):
        render(directory / entry, "Component", objects)
    for entry in spec.get("patches", []):
        apply_patch(entry, objects, directory)
    for entry in spec.get("images", []):
        set_images(entry, objects, directory)
    ids = [object_id(o) for o in objects]
    assert len(ids) == len(set(ids)), f"{directory}: an object appears twice: {sorted(ids)}"
    return objects


@functools.lru_cache(maxsize=None)
def _rendered(relative):
    return render(KUBE / relative)


def rendered(relative):
    return copy.deepcopy(_rendered(relative))


def find(objects, kind, name):
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


def pod_spec(objects):
    return find(objects, "Deployment", "qpool")["spec"]["template"]["spec"]


def server_container(objects):
    containers = pod_spec(objects)["containers"]
    assert [c["name"] for c in containers] == ["qpool"]
    return containers[0]


def config(objects):
    return find(objects, "ConfigMap", "qpool-config")["data"]


def expand(text, env):
    """Kubernetes' $(VAR) expansion in command and args; unknown references stay as written."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)),
                  text)


def container_env(objects):
    container = server_container(objects)
    env = {}
    for source in container.get("envFrom", []):
        env.update(find(objects, "ConfigMap", source["configMapRef"]["name"])["data"])
    env.update({e["name"]: e["value"] for e in container.get("env", [])})
    return env


def server_args(objects):
    env = container_env(objects)
    return [expand(a, env) for a in server_container(objects)["args"]]


def flag_value(args, flag):
    values = [a.split("=", 1)[1] for a in args if a.startswith(flag + "=")]
    assert len(values) == 1, f"{flag} given {len(values)} times in {args}"
    return values[0]


def labels_match(selector, labels):
    return all(labels.get(k) == v for k, v in selector.items())


def mounted_secret_file(objects, path):
    """(volume mount, secret volume source, key) of the Secret key the server reads at path."""
    mounts = [m for m in server_container(objects)["volumeMounts"]
              if path.startswith(m["mountPath"].rstrip("/") + "/")]
    assert len(mounts) == 1, f"{path}: mounted by {mounts}"
    volumes = {v["name"]: v for v in pod_spec(objects)["volumes"]}
    secret = volumes[mounts[0]["name"]]["secret"]
    relative = path[len(mounts[0]["mountPath"].rstrip("/")) + 1:]
    keys = [i["key"] for i in secret.get("items", []) if i["path"] == relative]
    assert len(keys) == 1, f"{path}: no single item of Secret {secret['secretName']} lands there"
    return mounts[0], secret, keys[0]


def documented_metrics():
    """The metric names docs/metrics.md lists, each in backquotes."""
    return set(re.findall(r"`(qpool_[a-z0-9_]+)`", (ROOT / "docs" / "metrics.md").read_text()))


def example(name):
    return [d for d in yaml.safe_load_all((KUBE / "examples" / name).read_text()) if d]


def token_lines(text):
    """The lines of a --admin-token-file that the server takes as tokens (docs/security.md)."""
    return [line.strip() for line in text.splitlines()
            if line.strip() and not line.strip().startswith("#")]


def project_version():
    cmake = (ROOT / "CMakeLists.txt").read_text()
    return re.search(r"project\(qpool VERSION (\S+)", cmake).group(1)


def server_binary():
    path = pathlib.Path(os.environ.get("QPOOL_SERVER_BIN", ROOT / "build/server/qpool-server"))
    return path if path.is_file() and os.access(path, os.X_OK) else None


def validate(obj):
    try:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        return
    except kubernetes_validate.ValidationError as e:  # its text prints the whole schema
        problem = f"{e.message} at /{'/'.join(str(p) for p in e.absolute_path)}"
    pytest.fail(f"{obj['kind']}/{obj['metadata']['name']}: {problem}")


def rule_groups():
    return yaml.safe_load(RULES.read_text())["groups"]


def alerts():
    return [rule for group in rule_groups() for rule in group["rules"] if "alert" in rule]


def promtool():
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool not found: install the Debian package 'prometheus' "
                    "(scripts/setup.sh does)")
    return path


# ---------------------------------------------------------------------------------------------
# The renderer itself.

def test_renderer_refuses_kustomize_features_it_does_not_implement(tmp_path):
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "secretGenerator": [{"name": "x", "literals": ["A=1"]}]}))
    with pytest.raises(UnsupportedKustomization, match="secretGenerator"):
        render(tmp_path)


@pytest.mark.parametrize("generator, options", [
    ({"name": "x", "literals": ["A=1"]}, {"disableNameSuffixHash": True}),
    ({"name": "x", "files": ["a.json"]}, {}),
    ({"name": "x", "files": ["../a.json"]}, {"disableNameSuffixHash": True}),
])
def test_renderer_refuses_config_maps_it_cannot_generate_like_kustomize(tmp_path, generator,
                                                                          options):
    (tmp_path / "a.json").write_text("{}")
    (tmp_path / "k").mkdir()
    (tmp_path / "k" / "a.json").write_text("{}")
    (tmp_path / "k" / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "generatorOptions": options, "configMapGenerator": [generator]}))
    with pytest.raises(UnsupportedKustomization, match="configMapGenerator"):
        render(tmp_path / "k")


def test_renderer_refuses_strategic_merge_patches(tmp_path):
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [str(KUBE / "base")],
        "patches": [{"target": {"kind": "Deployment", "name": "qpool"},
                     "patch": "spec:\n  replicas: 2\n"}]}))
    with pytest.raises(UnsupportedKustomization, match="JSON 6902"):
        render(tmp_path)


@pytest.mark.parametrize("directory",
                         ["base", "../grafana"] + [f"overlays/{o}" for o in sorted(OVERLAYS)])
def test_renderer_agrees_with_kubectl_kustomize(directory):
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("no kubectl: the renderer is checked against kustomize where one is installed")
    result = subprocess.run([kubectl, "kustomize", str(KUBE / directory)], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    theirs = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    assert sorted(rendered(directory), key=object_id) == sorted(theirs, key=object_id)


# ---------------------------------------------------------------------------------------------
# Kubernetes objects.

def test_base_validates_without_prometheus_operator_kinds():
    objects = rendered("base")
    assert not [o for o in objects if o["kind"] in OPERATOR_KINDS]
    for obj in objects:
        validate(obj)


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_overlay_objects_pass_the_kubernetes_schema(overlay):
    objects = rendered(f"overlays/{overlay}")
    assert sorted(object_id(o) for o in objects) == sorted([
        ("ConfigMap", "qpool-config"), ("Deployment", "qpool"), ("Service", "qpool"),
        ("Service", "qpool-metrics"), ("PodDisruptionBudget", "qpool"),
        ("PersistentVolumeClaim", "qpool-models"), ("NetworkPolicy", "qpool"),
        ("ServiceMonitor", "qpool"), ("PrometheusRule", "qpool"),
        ("ConfigMap", DASHBOARD_CONFIGMAP)])
    for obj in objects:
        if obj["kind"] not in OPERATOR_KINDS:
            validate(obj)


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_gpu_limit_and_devices_match_the_overlay(overlay):
    gpus, devices, _, _ = OVERLAYS[overlay]
    objects = rendered(f"overlays/{overlay}")
    resources = server_container(objects)["resources"]
    if gpus:
        assert str(resources["limits"]["nvidia.com/gpu"]) == str(gpus)
    else:
        assert "nvidia.com/gpu" not in resources["limits"]
    assert "nvidia.com/gpu" not in resources.get("requests", {})
    assert flag_value(server_args(objects), "--devices") == devices
    # Host memory: requested as much as the limit (pinned host copies must not be reclaimed).
    assert resources["requests"]["memory"] == resources["limits"]["memory"]


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_pod_runs_unprivileged_with_a_read_only_root(overlay):
    objects = rendered(f"overlays/{overlay}")
    pod = pod_spec(objects)
    assert pod["securityContext"] == {
        "runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001, "fsGroup": 10001,
        "seccompProfile": {"type": "RuntimeDefault"}}
    security = server_container(objects)["securityContext"]
    assert security["runAsNonRoot"] is True
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "privileged" not in security and "add" not in security["capabilities"]
    mounts = {m["mountPath"]: m for m in server_container(objects)["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[mounts["/tmp"]["name"]]["emptyDir"]["sizeLimit"]
    models = volumes[mounts["/models"]["name"]]["persistentVolumeClaim"]
    assert mounts["/models"]["readOnly"] is True and models["readOnly"] is True
    find(objects, "PersistentVolumeClaim", models["claimName"])


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_probes_ask_the_http_health_endpoints_in_https_under_tls(overlay):
    objects = rendered(f"overlays/{overlay}")
    container = server_container(objects)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"grpc": GRPC_PORT, "http": HTTP_PORT, "metrics": METRICS_PORT}
    args = server_args(objects)
    assert flag_value(args, "--listen") == f"0.0.0.0:{GRPC_PORT}"
    assert flag_value(args, "--http-listen") == f"0.0.0.0:{HTTP_PORT}"
    assert flag_value(args, "--metrics-listen") == f"0.0.0.0:{METRICS_PORT}"
    # With --tls-cert the HTTP port serves HTTPS only (docs/http-api.md): a plain probe would fail.
    scheme = "HTTPS" if any(a.startswith("--tls-cert=") for a in args) else "HTTP"
    assert scheme == ("HTTPS" if OVERLAYS[overlay][3] else "HTTP")
    # Ready: start-up pipelines loaded and not draining. Live: serving HTTP, draining included.
    for probe, path in (("startupProbe", "/health/ready"), ("readinessProbe", "/health/ready"),
                        ("livenessProbe", "/health/live")):
        assert {"grpc", "exec", "tcpSocket"}.isdisjoint(container[probe]), probe
        assert container[probe]["httpGet"] == {"path": path, "port": "http", "scheme": scheme}, \
            probe
    startup = container["startupProbe"]
    # Pipelines load before /health/ready answers 200: allow minutes, not the default 30 s.
    assert startup["failureThreshold"] * startup["periodSeconds"] >= 300
    assert container["readinessProbe"]["periodSeconds"] == 5


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_grace_period_outlasts_the_drain(overlay):
    objects = rendered(f"overlays/{overlay}")
    drain = int(config(objects)["QPOOL_DRAIN_SECONDS"])
    assert flag_value(server_args(objects), "--drain-seconds") == str(drain)
    # The drain, then unloading every pipeline with its leak check.
    assert pod_spec(objects)["terminationGracePeriodSeconds"] >= drain + 10


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_arg_references_are_defined_by_the_configmap(overlay):
    objects = rendered(f"overlays/{overlay}")
    container = server_container(objects)
    assert [s["configMapRef"]["name"] for s in container["envFrom"]] == ["qpool-config"]
    data = config(objects)
    for arg in container.get("command", []) + container["args"]:
        for var in re.findall(r"\$\(([^)]*)\)", arg):
            assert var in data, f"{arg}: $({var}) is not in ConfigMap qpool-config"
    assert all(isinstance(v, str) for v in data.values())


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_args_are_qpool_server_flags(overlay):
    objects = rendered(f"overlays/{overlay}")
    container = server_container(objects)
    assert container["command"] == ["qpool-server"]
    args = server_args(objects)
    assert all(a.startswith("--") and "=" in a for a in args), args
    binary = server_binary()
    if binary is None:
        pytest.skip("no qpool-server binary (QPOOL_SERVER_BIN or build/server/qpool-server)")
    usage = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=60)
    known = set(re.findall(r"^\s+(--[a-z][a-z-]*)", usage.stdout + usage.stderr, re.M))
    assert "--drain-seconds" in known, usage.stdout + usage.stderr
    assert {a.split("=", 1)[0] for a in args} <= known
    # The server's own parser takes every flag and value before it reaches --help.
    parsed = subprocess.run([binary, *args, "--help"], capture_output=True, text=True,
                            timeout=60)
    assert parsed.returncode == 0 and "usage:" in parsed.stdout + parsed.stderr, \
        parsed.stdout + parsed.stderr


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_images_carry_the_project_version(overlay):
    objects = rendered(f"overlays/{overlay}")
    suffix = OVERLAYS[overlay][2]
    # The images deploy/kubernetes/README.md builds ("Images"), with the Dockerfile's variants.
    readme = (KUBE / "README.md").read_text()
    built = {tag: variant for variant, tag in re.findall(
        r"docker build (?:--build-arg QPOOL_VARIANT=(\w+) )?-t qpool:(\S+) \.", readme)}
    variants = re.search(r"ARG QPOOL_VARIANT=(\w+)", (ROOT / "Dockerfile").read_text())
    for container in pod_spec(objects)["containers"]:
        name, tag = split_image(container["image"])
        assert name == "qpool"
        assert tag not in (None, "latest"), container["image"]
        assert tag == project_version() + suffix
        assert tag in built, f"deploy/kubernetes/README.md builds no {container['image']}"
        assert (built[tag] or variants.group(1)) == ("cpu" if suffix == "-cpu" else "cuda")


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_services_select_the_server_pods(overlay):
    objects = rendered(f"overlays/{overlay}")
    pod_labels = find(objects, "Deployment", "qpool")["spec"]["template"]["metadata"]["labels"]
    grpc = find(objects, "Service", "qpool")["spec"]
    assert grpc["clusterIP"] == "None"
    assert labels_match(grpc["selector"], pod_labels)
    http = "https" if OVERLAYS[overlay][3] else "http"
    assert [(p["name"], p["port"], p["targetPort"], p.get("appProtocol")) for p in grpc["ports"]] \
        == [("grpc", GRPC_PORT, "grpc", "grpc"), ("http", HTTP_PORT, "http", http)]
    metrics = find(objects, "Service", "qpool-metrics")["spec"]
    assert labels_match(metrics["selector"], pod_labels)
    assert [(p["name"], p["port"], p["targetPort"]) for p in metrics["ports"]] == \
        [("metrics", METRICS_PORT, "metrics")]
    budget = find(objects, "PodDisruptionBudget", "qpool")["spec"]
    assert budget["maxUnavailable"] == 1
    assert labels_match(budget["selector"]["matchLabels"], pod_labels)


# ---------------------------------------------------------------------------------------------
# TLS and tokens (deploy/kubernetes/secure), and the NetworkPolicy.

def test_overlays_with_gpus_are_secure_by_default():
    assert SECURE_OVERLAYS == sorted(o for o, (gpus, *_) in OVERLAYS.items() if gpus)
    for overlay in OVERLAYS:
        spec = yaml.safe_load((KUBE / "overlays" / overlay / "kustomization.yaml").read_text())
        assert ("../../secure" in spec.get("components", [])) == OVERLAYS[overlay][3], overlay


@pytest.mark.parametrize("overlay", SECURE_OVERLAYS)
def test_secure_pods_mount_the_secrets_read_only_and_pass_matching_flags(overlay):
    objects = rendered(f"overlays/{overlay}")
    args = server_args(objects)
    mounted = {}
    for flag, secret_name, key in (("--tls-cert", "qpool-tls", "tls.crt"),
                                   ("--tls-key", "qpool-tls", "tls.key"),
                                   ("--admin-token-file", "qpool-tokens", "tokens")):
        mount, secret, mounted_key = mounted_secret_file(objects, flag_value(args, flag))
        assert (secret["secretName"], mounted_key) == (secret_name, key), flag
        assert mount["readOnly"] is True, flag
        # A subPath mount never sees the Secret change: no token rotation, no renewal.
        assert "subPath" not in mount and "subPathExpr" not in mount, flag
        # 0440: root and the pod's fsGroup (the server's group) only; no item widens it.
        assert secret["defaultMode"] == 0o440 and "optional" not in secret, flag
        assert all("mode" not in item for item in secret["items"]), flag
        mounted[secret_name] = {item["key"] for item in secret["items"]}
    # Only the keys the server reads: cert-manager's ca.crt stays out of the pod.
    assert mounted == SECRETS
    assert not any(a.startswith("--tls-client-ca=") for a in args)
    protect = set(flag_value(args, "--protect").split(","))
    assert protect >= {"inference", "read"} or "all" in protect, protect
    # Plaintext behind the NetworkPolicy (the metrics port reads the certificate at start-up only).
    assert flag_value(args, "--metrics-tls") == "off"
    for obj in objects:
        if obj["kind"] not in OPERATOR_KINDS:
            validate(obj)


def test_plain_overlays_name_no_credentials():
    for overlay in sorted(set(OVERLAYS) - set(SECURE_OVERLAYS)):
        objects = rendered(f"overlays/{overlay}")
        args = {a.split("=", 1)[0] for a in server_args(objects)}
        assert not args & {"--tls-cert", "--tls-key", "--admin-token-file", "--protect"}, overlay
        volumes = pod_spec(objects)["volumes"]
        assert not [v for v in volumes if "secret" in v], overlay


def test_secure_component_patches_fail_rather_than_edit_the_wrong_entry():
    objects = rendered("base")
    service = find(objects, "Service", "qpool")
    service["spec"]["ports"].reverse()
    with pytest.raises(jsonpatch.JsonPatchTestFailed):
        render(KUBE / "secure", "Component", objects)


def test_no_kustomization_applies_a_secret_or_an_example():
    for path in (ROOT / "deploy").rglob("kustomization.yaml"):
        spec = yaml.safe_load(path.read_text())
        for entry in spec.get("resources", []) + spec.get("components", []):
            target = (path.parent / entry).resolve()
            assert KUBE / "examples" not in [target, *target.parents], f"{path}: {entry}"
    for directory in ["base"] + [f"overlays/{o}" for o in OVERLAYS]:
        assert not [o for o in rendered(directory) if o["kind"] == "Secret"], directory
    for path in (ROOT / "deploy").rglob("*"):
        if path.is_file():
            text = path.read_text(errors="replace")
            assert "PRIVATE KEY-----" not in text and "BEGIN CERTIFICATE" not in text, path


def test_secret_examples_are_placeholders_the_server_refuses():
    secrets = {s["metadata"]["name"]: s for s in example("secrets.yaml")}
    assert set(secrets) == set(SECRETS)
    for name, secret in secrets.items():
        validate(secret)
        assert set(secret["stringData"]) == SECRETS[name]
    assert secrets["qpool-tls"]["type"] == "kubernetes.io/tls"
    # Comments only: the server holds no token and refuses to start (docs/security.md).
    assert token_lines(secrets["qpool-tokens"]["stringData"]["tokens"]) == []
    assert "REPLACE" in secrets["qpool-tokens"]["stringData"]["tokens"]
    for value in secrets["qpool-tls"]["stringData"].values():
        assert "-----BEGIN" not in value and "REPLACE" in value


def test_certificate_example_writes_the_tls_secret_for_every_service_name():
    docs = {(d["kind"], d["metadata"]["name"]): d for d in example("certificate.yaml")}
    for doc in docs.values():
        assert doc["apiVersion"] == "cert-manager.io/v1"
    certificate = docs[("Certificate", "qpool-tls")]["spec"]
    assert certificate["secretName"] == "qpool-tls" and "qpool-tls" in SECRETS
    service = find(rendered("base"), "Service", "qpool")["metadata"]["name"]
    assert certificate["dnsNames"] == [
        service, f"{service}.NAMESPACE", f"{service}.NAMESPACE.svc",
        f"{service}.NAMESPACE.svc.cluster.local"]
    assert "server auth" in certificate["usages"]
    # The key type and encoding that tests/integration/test_security.py serves with.
    assert certificate["privateKey"]["encoding"] == "PKCS8"
    assert (certificate["privateKey"]["algorithm"], certificate["privateKey"]["size"]) == \
        ("ECDSA", 256)
    # Each issuer the chain names is in the file.
    for doc in docs.values():
        if doc["kind"] == "Certificate":
            issuer = doc["spec"]["issuerRef"]
            assert (issuer["kind"], issuer["name"]) in docs, issuer
    ca = docs[("Issuer", certificate["issuerRef"]["name"])]["spec"]["ca"]["secretName"]
    assert docs[("Certificate", ca)]["spec"]["isCA"] is True


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_network_policy_admits_exactly_the_container_ports(overlay):
    objects = rendered(f"overlays/{overlay}")
    [policy] = [o for o in objects if o["kind"] == "NetworkPolicy"]
    spec = policy["spec"]
    pod_labels = find(objects, "Deployment", "qpool")["spec"]["template"]["metadata"]["labels"]
    assert set(spec["podSelector"]) == {"matchLabels"} and spec["podSelector"]["matchLabels"]
    assert labels_match(spec["podSelector"]["matchLabels"], pod_labels)
    # Egress listed with no rule: none at all (qpool-server opens no connection).
    assert sorted(spec["policyTypes"]) == ["Egress", "Ingress"]
    assert not spec.get("egress")
    container_ports = {p["name"]: p["protocol"] for p in server_container(objects)["ports"]}
    peers_of = {}
    for rule in spec["ingress"]:
        # A rule without `from` or `ports`, an empty selector or an ipBlock would open more.
        assert rule.get("from") and rule.get("ports"), rule
        for peer in rule["from"]:
            assert set(peer) <= {"podSelector", "namespaceSelector"} and peer, peer
            for selector in peer.values():
                assert set(selector) == {"matchLabels"} and selector["matchLabels"], peer
        for port in rule["ports"]:
            assert set(port) == {"port", "protocol"} and port["port"] in container_ports, port
            assert port["protocol"] == container_ports[port["port"]]
            assert port["port"] not in peers_of, f"{port['port']} is in two rules"
            peers_of[port["port"]] = rule["from"]
    assert set(peers_of) == set(container_ports)
    clients = [{"podSelector": {"matchLabels": CLIENT_LABEL}},
               {"namespaceSelector": {"matchLabels": CLIENT_LABEL}}]
    assert peers_of == {"grpc": clients, "http": clients, "metrics": [PROMETHEUS_PEER]}
    validate(policy)


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_service_monitor_scrapes_the_metrics_service(overlay):
    objects = rendered(f"overlays/{overlay}")
    monitor = find(objects, "ServiceMonitor", "qpool")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert set(monitor["spec"]["selector"]) == {"matchLabels"}
    assert labels_match(selector, find(objects, "Service", "qpool-metrics")["metadata"]["labels"])
    assert not labels_match(selector, find(objects, "Service", "qpool")["metadata"]["labels"])
    metric_ports = {p["name"] for p in find(objects, "Service", "qpool-metrics")["spec"]["ports"]}
    assert [(e["port"], e["interval"]) for e in monitor["spec"]["endpoints"]] == \
        [("metrics", "15s")]
    assert monitor["spec"]["endpoints"][0]["port"] in metric_ports
    # Without jobLabel the Operator names the job after the Service, which QpoolNotServing matches.
    assert "jobLabel" not in monitor["spec"]
    not_serving = next(a for a in alerts() if a["alert"] == "QpoolNotServing")
    job = re.search(r'job=~"([^"]*)"', not_serving["expr"]).group(1)
    assert re.fullmatch(job, "qpool-metrics")


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_prometheus_rule_carries_the_rule_file(overlay):
    rule = find(rendered(f"overlays/{overlay}"), "PrometheusRule", "qpool")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["spec"] == {"groups": rule_groups()}, \
        "deploy/kubernetes/monitoring/prometheusrule.yaml differs from " \
        "deploy/prometheus/qpool-rules.yaml"


@pytest.mark.parametrize("directory", ["../grafana"] + [f"overlays/{o}" for o in sorted(OVERLAYS)])
def test_dashboard_config_map_carries_the_dashboard_for_the_grafana_sidecar(directory):
    dashboard = (GRAFANA / "qpool.json").read_text()
    config_map = find(rendered(directory), "ConfigMap", DASHBOARD_CONFIGMAP)
    validate(config_map)
    # The label Grafana's sidecar looks for (kube-prometheus-stack and the Grafana chart).
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["data"] == {"qpool.json": dashboard}
    assert json.loads(dashboard)["uid"] == "qpool"
    # `kubectl apply` keeps the whole object in an annotation, and annotations may hold 256 KiB.
    assert len(dashboard.encode()) < 200 * 1024


def test_hpa_example_scales_the_deployment_on_queue_depth():
    docs = [d for d in yaml.safe_load_all((KUBE / "examples" / "hpa.yaml").read_text()) if d]
    assert len(docs) == 1
    hpa = docs[0]
    validate(hpa)
    assert hpa["apiVersion"] == "autoscaling/v2"
    target = hpa["spec"]["scaleTargetRef"]
    find(rendered("base"), target["kind"], target["name"])
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 8)
    [metric] = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods"
    assert metric["pods"]["metric"]["name"] == "qpool_device_queue_depth"
    assert "qpool_device_queue_depth" in documented_metrics()
    assert metric["pods"]["target"] == {"type": "AverageValue", "averageValue": "2"}
    assert hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 300


def test_keda_example_scales_the_deployment_on_documented_request_gauges():
    [scaled] = example("keda-scaledobject.yaml")
    assert (scaled["apiVersion"], scaled["kind"]) == ("keda.sh/v1alpha1", "ScaledObject")
    spec = scaled["spec"]
    target = spec["scaleTargetRef"]
    assert target["apiVersion"] == "apps/v1"
    find(rendered("base"), target["kind"], target["name"])
    hpa = example("hpa.yaml")[0]["spec"]
    assert target == hpa["scaleTargetRef"]
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == \
        (hpa["minReplicas"], hpa["maxReplicas"])
    assert spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"] == hpa["behavior"]
    [trigger] = spec["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
    metadata = trigger["metadata"]
    assert metadata["threshold"] == "2"
    # A lost target is an error (KEDA holds the fallback), not 0 (which would scale down).
    assert metadata["ignoreNullValues"] == "false" and spec["fallback"]["replicas"] >= 1
    query = metadata["query"]
    names = re.findall(r"\b(qpool_[a-z0-9_]+)\b", query)
    assert sorted(names) == ["qpool_requests_running", "qpool_requests_waiting"]
    assert set(names) <= documented_metrics()
    # Each selects the ServiceMonitor's job (the metrics Service's name) in qpool's namespace.
    metrics_service = find(rendered("base"), "Service", "qpool-metrics")["metadata"]["name"]
    selectors = re.findall(r"qpool_[a-z_]+\{([^}]*)\}", query)
    assert selectors == [f'job="{metrics_service}", namespace="NAMESPACE"'] * 2
    assert re.fullmatch(r"sum\(qpool_requests_waiting\{[^}]*\}\)\s*\+\s*"
                        r"sum\(qpool_requests_running\{[^}]*\}\)", query.strip())


# ---------------------------------------------------------------------------------------------
# Prometheus rules.

def test_bench_job_example_targets_the_headless_service_and_is_not_its_endpoint():
    docs = [d for d in yaml.safe_load_all((KUBE / "examples" / "bench-job.yaml").read_text()) if d]
    assert len(docs) == 1
    job = docs[0]
    validate(job)
    assert job["kind"] == "Job"
    base = rendered("base")
    services = [o for o in base if o["kind"] == "Service"]
    headless = [s for s in services if s["spec"].get("clusterIP") == "None"]
    assert len(headless) == 1
    grpc_port = next(p["port"] for p in headless[0]["spec"]["ports"] if p["name"] == "grpc")
    script = job["spec"]["template"]["spec"]["containers"][0]["args"][0]
    assert f"dns:///{headless[0]['metadata']['name']}." in script and f":{grpc_port}\"" in script
    assert " bench " in script and "--out /report" in script
    # The bench pod must not become an endpoint of the Services it loads, nor count for the PDB.
    labels = job["spec"]["template"]["metadata"]["labels"]
    selectors = [s["spec"]["selector"] for s in services]
    selectors += [o["spec"]["selector"]["matchLabels"] for o in base
                  if o["kind"] == "PodDisruptionBudget"]
    for selector in selectors:
        assert not all(labels.get(k) == v for k, v in selector.items()), (selector, labels)
    # The NetworkPolicy admits it to the gRPC port as a client of qpool's namespace.
    assert labels_match(CLIENT_LABEL, labels)
    # A secure server's CA and token, when the optional Secret qpool-client holds them.
    pod = job["spec"]["template"]["spec"]
    [volume] = [v for v in pod["volumes"] if "secret" in v]
    client = volume["secret"]
    assert client["optional"] is True and client["secretName"] not in SECRETS
    [mount] = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == volume["name"]]
    assert mount["readOnly"] is True
    for item in client["items"]:
        path = f"{mount['mountPath']}/{item['path']}"
        assert f"[ -f {path} ]" in script and re.search(rf"--(ca|token-file) {path}\b", script)


def test_rules_pass_promtool_check():
    result = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_rule_unit_tests_pass():
    result = subprocess.run([promtool(), "test", "rules", str(RULE_TESTS)], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_firing_and_a_quiet_unit_test():
    cases = [case for test in yaml.safe_load(RULE_TESTS.read_text())["tests"]
             for case in test.get("alert_rule_test", [])]
    for name in (a["alert"] for a in alerts()):
        expected = [case.get("exp_alerts") or [] for case in cases if case["alertname"] == name]
        assert any(expected), f"{name}: no unit test where it fires"
        assert not all(expected), f"{name}: no unit test where it stays quiet"


def test_alerts_carry_severity_summary_and_description():
    for alert in alerts():
        assert alert["labels"]["severity"] in {"critical", "warning", "info"}, alert["alert"]
        assert set(alert["annotations"]) >= {"summary", "description"}, alert["alert"]


def test_rule_metrics_are_documented():
    documented = (ROOT / "docs" / "metrics.md").read_text()
    for alert in alerts():
        names = set(re.findall(r"\b(qpool_[a-z0-9_]+|up)\b", alert["expr"]))
        assert names, f"{alert['alert']}: no metric found in {alert['expr']!r}"
        for name in names - {"up"}:
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            assert f"`{name}`" in documented or f"`{base}`" in documented, \
                f"{alert['alert']} uses {name}, which docs/metrics.md does not list"
