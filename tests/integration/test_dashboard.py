"""The Grafana dashboard deploy/grafana/qpool.json, checked without Grafana: every PromQL query
it holds (panel targets, template variable queries, annotations) parses, names only metrics a
freshly started server exports, and evaluates without error in a real Prometheus scraping a
real server that has served requests and loaded and unloaded a pipeline; the key panels
return data and every legend names labels the query keeps.

Needs promtool and prometheus (Debian package prometheus, which scripts/setup.sh installs).
Everything runs on loopback; the module takes a few seconds of real time.
"""

import json
import math
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest
import yaml

from conftest import scrape

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
GRAFANA = REPO_ROOT / "deploy" / "grafana"
DASHBOARD = GRAFANA / "qpool.json"
VARIABLES = ("instance", "device", "pipeline")
# Grafana's interval variables, replaced by durations that cover the whole test: Prometheus
# starts with the module, so every sample it has lies in the last minute.
INTERVALS = {"__rate_interval": "1m", "__interval": "1m", "__range": "5m"}
# Exported on GPUs only (cudaMemGetInfo, and request memory measured by the CUDA allocator).
GPU_ONLY = {"qpool_device_memory_total_bytes", "qpool_device_memory_free_bytes",
            "qpool_request_working_memory_bytes", "qpool_request_peak_memory_bytes",
            "qpool_device_memory_workspace_bytes", "qpool_device_memory_graph_pool_allocated_bytes",
            "qpool_device_memory_graph_pool_reserved_bytes", "qpool_device_driver_process_bytes",
            "qpool_device_cuda_context_bytes", "qpool_device_memory_outside_allocator_bytes"}
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
# Words of PromQL that are not metric names: aggregations (followed by `by` or `without` rather
# than a parenthesis), set and grouping keywords.
PROMQL_WORDS = {"sum", "min", "max", "avg", "count", "group", "stddev", "stdvar", "topk",
                "bottomk", "quantile", "count_values", "by", "without", "on", "ignoring",
                "group_left", "group_right", "bool", "and", "or", "unless", "offset", "atan2"}
SCRAPE_INTERVAL = "1s"
PROMETHEUS_START_S = 30
DATA_WAIT_S = 20
GENERATES = 3


# ------------------------------------------------------------------ the dashboard's queries


def dashboard():
    return json.loads(DASHBOARD.read_text())


def all_panels(panels):
    """Every panel, those inside collapsed rows included."""
    for panel in panels:
        yield panel
        yield from all_panels(panel.get("panels", []))


class Query:
    """One PromQL expression of the dashboard: where it is, the expression with Grafana's
    variables still in it, and its legend."""

    def __init__(self, where, expr, legend="", panel=None):
        self.where, self.expr, self.legend, self.panel = where, expr, legend, panel

    def __repr__(self):
        return f"{self.where}: {self.expr}"


def variable_selector(query):
    """The series selector of a `label_values(selector, label)` variable query, and the label;
    (None, label) for `label_values(label)`."""
    text = query["query"] if isinstance(query, dict) else query
    match = re.fullmatch(r"\s*label_values\((.*),\s*([A-Za-z_]\w*)\s*\)\s*", text, re.S)
    if match:
        return match.group(1), match.group(2)
    match = re.fullmatch(r"\s*label_values\(\s*([A-Za-z_]\w*)\s*\)\s*", text)
    assert match, f"variable query {text!r}: only label_values() is checked here"
    return None, match.group(1)


def queries():
    """Every PromQL expression of the dashboard."""
    model = dashboard()
    found = []
    for panel in all_panels(model["panels"]):
        for target in panel.get("targets", []):
            found.append(Query(f'panel "{panel["title"]}" target {target["refId"]}',
                               target["expr"], target.get("legendFormat", ""), panel))
    for variable in model["templating"]["list"]:
        if variable["type"] == "query":
            selector, _ = variable_selector(variable["query"])
            if selector is not None:
                found.append(Query(f"variable {variable['name']}", selector))
    for annotation in model["annotations"]["list"]:
        if "expr" in annotation:
            found.append(Query(f'annotation "{annotation["name"]}"', annotation["expr"],
                               annotation.get("titleFormat", "")))
    return found


def regex_value(text):
    """`text` as Grafana puts a selected value into a regex matcher: regex-escaped, and the
    backslashes escaped again for the PromQL string."""
    return re.escape(text).replace("\\", "\\\\")


def substitute(expr, values):
    """`expr` with $var, ${var} and ${var:format} replaced from `values` (variables of the
    dashboard, then Grafana's intervals); an unknown variable fails the test."""
    def replace(match):
        name = match.group(1) or match.group(2)
        if name in values:
            return values[name]
        if name in INTERVALS:
            return INTERVALS[name]
        pytest.fail(f"{expr!r} uses ${name}, which is neither a variable of the dashboard nor "
                    f"one of Grafana's intervals {sorted(INTERVALS)}")
    return re.sub(r"\$(?:\{(\w+)(?::\w+)?\}|(\w+))", replace, expr)


def metric_names(expr):
    """The metric names a PromQL expression selects (strings, label matchers, ranges and label
    lists removed; words before a parenthesis are functions)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", r" \1 ", text)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        if match.start() > 0 and (text[match.start() - 1].isdigit() or
                                  text[match.start() - 1] == "."):
            continue  # the exponent or unit of a number
        if text[match.end():].lstrip().startswith("(") or match.group(0) in PROMQL_WORDS:
            continue
        names.add(match.group(0))
    return names


def legend_labels(legend):
    return set(re.findall(r"\{\{\s*([A-Za-z_]\w*)\s*\}\}", legend or ""))


# ------------------------------------------------------------------ checks of the JSON itself


def test_dashboard_model():
    model = dashboard()
    assert model["uid"] == "qpool" and model["title"]
    assert model["schemaVersion"] >= 41, "export it from a current Grafana"
    assert model["id"] is None, "a provisioned or imported dashboard must not carry a database id"
    variables = {v["name"]: v for v in model["templating"]["list"]}
    assert set(variables) == {"datasource", *VARIABLES}
    source = variables["datasource"]
    assert (source["type"], source["query"]) == ("datasource", "prometheus")
    for name in VARIABLES:
        variable = variables[name]
        assert variable["type"] == "query" and variable["multi"] and variable["includeAll"]
        # "All" must be a regex matching everything, not Grafana's default list of every value
        # (which can exceed URL limits on large fleets).
        assert variable["allValue"] == ".*"
        assert variable["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert variable_selector(variable["query"])[1] == name
    ids = []
    for panel in all_panels(model["panels"]):
        ids.append(panel["id"])
        where = panel["title"]
        position = panel["gridPos"]
        assert 0 <= position["x"] < position["x"] + position["w"] <= 24, where
        if panel["type"] == "row":
            continue
        assert panel.get("description"), f"{where}: say what the panel shows"
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, where
        assert panel["targets"], where
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"], where
            assert target["expr"].strip(), where
    assert len(ids) == len(set(ids)), "panel ids repeat"
    titles = [p["title"] for p in all_panels(model["panels"])]
    assert len(titles) == len(set(titles)), "panel titles repeat"
    for annotation in model["annotations"]["list"]:
        if "expr" in annotation:
            assert annotation["datasource"] == {"type": "prometheus", "uid": "${datasource}"}


def test_provisioning_points_at_the_dashboard():
    datasources = yaml.safe_load((GRAFANA / "provisioning/datasources/prometheus.yaml").read_text())
    assert datasources["apiVersion"] == 1
    assert [d["type"] for d in datasources["datasources"]] == ["prometheus"]
    providers = yaml.safe_load((GRAFANA / "provisioning/dashboards/qpool.yaml").read_text())
    assert providers["apiVersion"] == 1
    [provider] = providers["providers"]
    assert provider["type"] == "file"
    # The README's docker command mounts qpool.json into the provider's folder.
    readme = (GRAFANA / "README.md").read_text()
    assert f'{provider["options"]["path"]}/qpool.json' in readme


def test_every_expression_parses(tmp_path):
    # promtool has no command that only parses an expression, so each one becomes a recording
    # rule and `promtool check rules` parses it with Prometheus' own parser.
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: run scripts/setup.sh (Debian package prometheus)"
    values = {"instance": regex_value("10.0.0.7:9100"), "device": regex_value("cuda:0"),
              "pipeline": regex_value("sd-turbo.int8")}
    found = queries()
    rules = [{"record": f"dashboard:query_{i}", "expr": substitute(q.expr, values)}
             for i, q in enumerate(found)]
    path = tmp_path / "dashboard-rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True,
                            text=True, timeout=60)
    output = result.stdout + result.stderr
    failed = [q for i, q in enumerate(found) if re.search(rf"\bdashboard:query_{i}\b", output)]
    assert result.returncode == 0, "\n".join(map(repr, failed)) + "\n" + output
    assert f"SUCCESS: {len(rules)} rules found" in output, output


# The driver-bytes panel on two GPUs' figures (MiB as plain numbers): cuda:0 holds two
# components, one with a CUDA graph whose pool holds 150 (100 in use), and a request's 17 of
# working memory; cuda:1 holds no pipeline, only its cuBLAS workspace.
DRIVER_STACK = "Driver bytes on $device, by owner (GPUs)"
DRIVER_SERIES = {
    "cuda:0": {"qpool_device_memory_allocated_bytes": 800, "qpool_device_memory_reserved_bytes":
               1000, "qpool_device_memory_workspace_bytes": 33,
               "qpool_device_memory_graph_pool_allocated_bytes": 100,
               "qpool_device_memory_graph_pool_reserved_bytes": 150,
               "qpool_device_cuda_context_bytes": 680,
               "qpool_device_memory_outside_allocator_bytes": 80,
               "qpool_device_driver_process_bytes": 1760},
    "cuda:1": {"qpool_device_memory_allocated_bytes": 33, "qpool_device_memory_reserved_bytes":
               40, "qpool_device_memory_workspace_bytes": 33,
               "qpool_device_memory_graph_pool_allocated_bytes": 0,
               "qpool_device_memory_graph_pool_reserved_bytes": 0,
               "qpool_device_cuda_context_bytes": 680,
               "qpool_device_memory_outside_allocator_bytes": 70,
               "qpool_device_driver_process_bytes": 790}}
DRIVER_PIPELINE_SERIES = [  # (component, kind, bytes) of one pipeline on cuda:0
    ("unet", "weights", 600), ("unet", "graph", 150), ("vae", "other", 50)]
DRIVER_PARTS = {  # legend suffix: {device: expected}; the stack's sum is the driver's figure
    "tensors": {"cuda:0": 650, "cuda:1": 0}, "graph pools in use": {"cuda:0": 100, "cuda:1": 0},
    "workspaces": {"cuda:0": 33, "cuda:1": 33}, "working": {"cuda:0": 17, "cuda:1": 0},
    "cached": {"cuda:0": 200, "cuda:1": 7}, "context": {"cuda:0": 680, "cuda:1": 680},
    "outside the allocator": {"cuda:0": 80, "cuda:1": 70},
    "driver (nvidia-smi)": {"cuda:0": 1760, "cuda:1": 790}}


def test_driver_stack_adds_up_to_the_driver_line(tmp_path):
    # promtool's rule unit tests evaluate each of the panel's queries on the figures above with
    # Prometheus' own engine (no server needed): every part is what docs/metrics.md says, the
    # stacked parts sum to the unstacked driver line.
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: run scripts/setup.sh (Debian package prometheus)"
    panel = next(p for p in all_panels(dashboard()["panels"]) if p["title"] == DRIVER_STACK)
    assert panel["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] == "normal"
    unstacked = [o["matcher"]["options"] for o in panel["fieldConfig"]["overrides"]
                 if {"id": "custom.stacking", "value": {"group": "A", "mode": "none"}}
                 in o["properties"]]
    instance = "10.0.0.7:9100"
    labels = f'instance="{instance}", job="qpool"'
    series = [{"series": f'{name}{{{labels}, device="{device}"}}', "values": f"{value}x2"}
              for device, figures in DRIVER_SERIES.items() for name, value in figures.items()]
    series += [{"series": f'qpool_pipeline_memory_bytes{{{labels}, pipeline="sdxl", '
                          f'component="{component}", device="cuda:0", kind="{kind}"}}',
                "values": f"{value}x2"} for component, kind, value in DRIVER_PIPELINE_SERIES]
    values = {"instance": regex_value(instance), "device": ".*", "pipeline": ".*"}
    tests, legends = [], []
    for target in panel["targets"]:
        legend = target["legendFormat"].removeprefix("{{device}} ")
        legends.append(legend)
        expected = DRIVER_PARTS[legend]
        tests.append({"expr": substitute(target["expr"], values), "eval_time": "1m",
                      "exp_samples": [{"labels": f'{{device="{d}", instance="{instance}"}}',
                                       "value": v} for d, v in sorted(expected.items())]})
        if legend == "driver (nvidia-smi)":
            assert unstacked == [target["refId"]], "only the driver's line is drawn unstacked"
    assert legends == list(DRIVER_PARTS)
    for device in DRIVER_SERIES:
        parts = [DRIVER_PARTS[legend][device] for legend in legends[:-1]]
        assert sum(parts) == DRIVER_PARTS["driver (nvidia-smi)"][device]
    path = tmp_path / "driver-stack.test.yaml"
    path.write_text(yaml.safe_dump({"rule_files": [], "evaluation_interval": "1m", "tests": [
        {"interval": "1m", "input_series": series, "promql_expr_test": tests}]}))
    result = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_expression_selects_qpool_metrics():
    for query in queries():
        names = metric_names(query.expr)
        assert names, f"{query!r}: no metric found"
        strangers = {n for n in names if not n.startswith("qpool_")}
        assert not strangers, f"{query!r}: {sorted(strangers)} are not qpool-server metrics"


# ------------------------------------------------------------------ a real server


@pytest.fixture(scope="module")
def server(make_server):
    """A server with `tiny` loaded and `spare` (a copy) not, and its /metrics text before any
    request."""
    client = make_server(pipelines=("tiny", ("tiny", "spare")), load="tiny")
    return client, scrape(client)


def exposition(text):
    """{family: type} from the TYPE lines, and the sample names that have a series."""
    types, samples = {}, set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            types[name] = kind
        elif line and not line.startswith("#"):
            samples.add(re.match(r"[A-Za-z_:][A-Za-z0-9_:]*", line).group(0))
    return types, samples


def test_every_metric_has_a_series_from_start_up(server):
    client, text = server
    types, samples = exposition(text)
    on_gpu = client.server.device.startswith("cuda")
    problems = []
    for query in queries():
        for name in sorted(metric_names(query.expr)):
            base = next((name[:-len(s)] for s in HISTOGRAM_SUFFIXES if name.endswith(s) and (
                types.get(name[:-len(s)]) == "histogram" or name[:-len(s)] in GPU_ONLY)), name)
            if types.get(name) == "histogram":
                problems.append(f"{query!r}: {name} is a histogram; select its _bucket, _sum "
                                f"or _count")
            elif name in samples:
                continue
            elif base in GPU_ONLY and not on_gpu:
                continue
            else:
                problems.append(f"{query!r}: no {name} series in /metrics at start-up")
    # A counter must have its series (at 0) before its first event, or rate() and increase()
    # see no data at first and miss that event.
    assert not problems, "\n".join(problems) + "\n\n/metrics at start-up:\n" + text


# ------------------------------------------------------------------ a real Prometheus


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Prometheus:
    """/usr/bin/prometheus on 127.0.0.1:<free port>, scraping `target` every second."""

    def __init__(self, binary, workdir, target):
        self.workdir = pathlib.Path(workdir)
        self.config = self.workdir / "prometheus.yml"
        self.config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": SCRAPE_INTERVAL, "evaluation_interval": "10s"},
            "scrape_configs": [{"job_name": "qpool",
                                "static_configs": [{"targets": [target]}]}]}))
        self.log_path = self.workdir / "prometheus.log"
        self.binary = binary
        self.process = None
        self.url = None

    def start(self):
        deadline = time.monotonic() + PROMETHEUS_START_S
        while True:  # another process may take the free port before Prometheus binds it
            port = free_port()
            self.url = f"http://127.0.0.1:{port}"
            with open(self.log_path, "wb") as log:
                self.process = subprocess.Popen(
                    [self.binary, f"--config.file={self.config}",
                     f"--storage.tsdb.path={self.workdir / 'data'}",
                     f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                    stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
            while time.monotonic() < deadline and self.process.poll() is None:
                try:
                    with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as r:
                        if r.status == 200:
                            return self
                except OSError:
                    time.sleep(0.1)
            self.stop()
            log = self.log()
            if "address already in use" not in log or time.monotonic() >= deadline:
                pytest.fail(f"prometheus did not become ready in {PROMETHEUS_START_S} s:\n{log}")

    def log(self):
        return self.log_path.read_text(errors="replace")[-4000:]

    def query(self, expr):
        """(status, data or error, warnings) of an instant query at the current time."""
        url = self.url + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                answer = json.load(r)
        except urllib.error.HTTPError as e:
            answer = json.load(e)
        if answer["status"] != "success":
            return answer["status"], f'{answer.get("errorType")}: {answer.get("error")}', []
        return "success", answer["data"], answer.get("warnings", [])

    def value(self, expr):
        """The single value of a query returning one series, or None."""
        status, data, _ = self.query(expr)
        assert status == "success", data
        return float(data["result"][0]["value"][1]) if data["result"] else None

    def wait_for(self, expr, minimum, what):
        deadline = time.monotonic() + DATA_WAIT_S
        while True:
            value = self.value(expr)
            if value is not None and value >= minimum:
                return
            if time.monotonic() > deadline:
                pytest.fail(f"Prometheus did not see {what} ({expr} >= {minimum}, last {value}) "
                            f"within {DATA_WAIT_S} s:\n{self.log()}")
            time.sleep(0.2)

    def stop(self):
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@pytest.fixture(scope="module")
def prometheus(server, tmp_path_factory):
    binary = shutil.which("prometheus")
    assert binary, "prometheus is missing: run scripts/setup.sh (Debian package prometheus)"
    client, _ = server
    instance = Prometheus(binary, tmp_path_factory.mktemp("prometheus"),
                          client.server.metrics_address)
    try:
        yield instance.start()
    finally:
        instance.stop()


@pytest.fixture(scope="module")
def served(server, prometheus):
    """After Prometheus' first scrape: Generate and Encode calls, and a load and
    unload of `spare`; returns once Prometheus has scraped all of it. The values of the
    dashboard's variables that select this server."""
    client, _ = server
    prometheus.wait_for('up{job="qpool"}', 1, "its first scrape of the server")
    for seed in range(GENERATES):
        client.generate_one(pipeline="tiny", prompt="a fox", steps=2, seed=seed)
    client.inference.Encode(client.pb2.EncodeRequest(pipeline="tiny", prompts=["a fox"]),
                            timeout=60)
    client.models.LoadPipeline(client.pb2.LoadPipelineRequest(name="spare"), timeout=60)
    client.models.UnloadPipeline(client.pb2.UnloadPipelineRequest(name="spare"), timeout=60)
    prometheus.wait_for('sum(qpool_requests_total{pipeline="tiny", rpc="generate", status="OK"})',
                        GENERATES, "the Generate calls")
    prometheus.wait_for('sum(qpool_memory_events_total{kind="unload", outcome="ok"})', 1,
                        "the unload")
    return {"instance": regex_value(client.server.metrics_address),
            "device": regex_value(client.server.device), "pipeline": regex_value("tiny")}


@pytest.fixture(scope="module")
def results(prometheus, served):
    """{Query: (status, data or error, warnings)} for every query of the dashboard."""
    return {query: prometheus.query(substitute(query.expr, served)) for query in queries()}


def test_every_expression_evaluates(results):
    failed = [f"{query!r}\n    -> {answer}" for query, (status, answer, _) in results.items()
              if status != "success"]
    assert not failed, "\n".join(failed)


def test_legends_name_labels_the_query_keeps(results):
    problems = []
    for query, (status, data, _) in results.items():
        wanted = legend_labels(query.legend)
        for series in data["result"] if status == "success" else []:
            missing = wanted - set(series["metric"])
            if missing:
                problems.append(f"{query!r}: legend {query.legend!r} names {sorted(missing)}, "
                                f"which the result {series['metric']} lacks")
    assert not problems, "\n".join(problems)


def panel_results(results, title):
    """The series of every target of the panel called `title`."""
    found = [(q, r) for q, r in results.items() if q.panel and q.panel["title"] == title]
    assert found, f"no panel {title!r} in the dashboard"
    series = []
    for query, (status, data, _) in found:
        assert status == "success", f"{query!r}: {data}"
        series += data["result"]
    return series


def values(series):
    return [float(s["value"][1]) for s in series]


def test_device_memory_panels_show_the_server(results, server):
    client, _ = server
    allocated = [s for s in panel_results(results, "Memory on $device")
                 if s["metric"].get("__name__") == "qpool_device_memory_allocated_bytes"]
    assert [s["metric"]["device"] for s in allocated] == [client.server.device]
    assert values(allocated)[0] > 0
    assert panel_results(results, "Fragmentation")


def test_pipeline_panels_show_what_tiny_holds(results, server):
    client, _ = server
    held = {c.name: c.weight_bytes + c.quant_state_bytes + c.other_bytes + c.graph_bytes
            for c in client.pipelines()["tiny"].components}
    by_kind = panel_results(results, "Bytes by pipeline and kind")
    assert {s["metric"]["pipeline"] for s in by_kind} == {"tiny"}
    assert sum(values(by_kind)) == sum(held.values())
    residency = [s for s in panel_results(results, "Bytes by residency")
                 if "pipeline" in s["metric"]]
    assert sum(values(residency)) == sum(held.values())
    components = panel_results(results, "Bytes by component and kind")
    assert {s["metric"]["component"] for s in components} == set(held)


def test_request_panels_show_the_calls(results):
    series = panel_results(results, "Request rate by pipeline and status")
    rates = {(s["metric"]["pipeline"], s["metric"]["rpc"], s["metric"]["status"]): v
             for s, v in zip(series, values(series))}
    assert rates[("tiny", "generate", "OK")] > 0
    assert rates[("tiny", "encode", "OK")] > 0
    latency = values(panel_results(results, "Latency (successful calls)"))
    assert latency and any(math.isfinite(v) and v > 0 for v in latency), latency
    assert any(math.isfinite(v) for v in values(panel_results(results, "Queue wait")))
    batches = [s for s in panel_results(results, "Batch sizes")
               if s["metric"]["pipeline"] == "tiny"]
    assert any(abs(v - 1) < 1e-9 for v in values(batches)), batches
    assert panel_results(results, "Queue depth")
    assert values(panel_results(results, "Servers")) == [1]


def test_memory_event_panels_and_annotations_show_the_load_and_unload(results):
    events = {(s["metric"]["kind"], s["metric"]["outcome"])
              for s in panel_results(results, "Memory events")}
    assert {("load", "ok"), ("unload", "ok")} <= events, events
    residency = [r for q, r in results.items() if q.where == 'annotation "Residency changes"']
    [(status, data, _)] = residency
    assert {(s["metric"]["kind"], s["metric"]["outcome"]) for s in data["result"]} >= \
        {("load", "ok"), ("unload", "ok")}
    # Nothing leaked and nothing ran out of memory: those panels show zeros, not "no data".
    assert values(panel_results(results, "Leaked bytes per device")) == [0]
    assert values(panel_results(results, "Leaked bytes")) == [0]
    failures = [r for q, r in results.items() if q.where == 'annotation "OOMs, leaks and failures"']
    assert failures[0][1]["result"] == []


def test_variables_list_this_server(prometheus, served, server):
    client, _ = server
    expected = {"instance": client.server.metrics_address, "device": client.server.device,
                "pipeline": "tiny"}
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] != "query":
            continue
        selector, label = variable_selector(variable["query"])
        status, data, _ = prometheus.query(substitute(selector, served))
        assert status == "success", data
        assert expected[variable["name"]] in {s["metric"].get(label) for s in data["result"]}
