"""Deploy artefacts: Helm chart, Kustomize, Tanka, Collector config, Grafana dashboards, alerts.

Real tools render and check them: kustomize, jsonnet and promtool, fetched from Debian by
scripts/deploy-tools.sh; kubernetes-validate checks every object against the Kubernetes API
schemas it bundles (offline). Helm is not installable here: `render_helm` says what that leaves
unverified.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from kubenpu.export import prometheus_name
from kubenpu.metrics import SPECS

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
CHART = DEPLOY / "helm" / "kubenpu"
KUSTOMIZE = DEPLOY / "kustomize"
TANKA = DEPLOY / "tanka"
GRAFANA = DEPLOY / "grafana"
K8S_VERSION = "1.33"
NAMESPACE = RELEASE = "kubenpu"

# The series the agent exports, as Prometheus names them: the one list the dashboard and alert
# checks read (docs/metrics.md, when present, must describe each).
# What the agent really exports, named as Prometheus shows them: the one source of truth.
EXPORTED_METRICS = {prometheus_name(spec) for spec in SPECS}
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
# Made by Prometheus itself for every scrape target.
SCRAPE_SERIES = {"up"}

# The node paths the agent reads, each mounted read-only; the CRI directory comes from values.
HOST_PATHS = {"/sys", "/sys/fs/cgroup", "/dev", "/lib/modules", "/usr/src"}
CAPABILITIES = ["SYS_ADMIN"]  # see daemonset.yaml for why; tests/test_least_privilege_vm.py
CR_KINDS = {"ServiceMonitor", "PrometheusRule"}  # CRDs: no bundled schema

pytestmark = pytest.mark.tools


@pytest.fixture(scope="session")
def tools() -> Path:
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "deploy-tools.sh")],
        check=True,
        capture_output=True,
        text=True,
    )
    return Path(out.stdout.strip().splitlines()[-1])


def run(tool: Path, *args: str | Path, cwd: Path = ROOT) -> str:
    proc = subprocess.run(
        [str(tool), *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, f"{tool.name} {args}: {proc.stdout}{proc.stderr}"
    return proc.stdout


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


# --- Helm, without helm ---------------------------------------------------------------------
#
# The templates keep to plain YAML plus a few actions, and this renders exactly those:
# `.Values.*`, `.Release.Name/Namespace`, `.Files.Get "..."`, the functions toYaml, nindent and
# quote, and `if ... end`. Any other action raises, so the templates cannot drift out of what is
# verified here. NOT verified: helm's own parser and engine (whitespace-trim semantics are
# emulated), `helm lint`, and the chart's packaging. toYaml here is PyYAML's, so only the parsed
# result is compared, never the text.

_ACTION = re.compile(r"\{\{(-)?\s*(.*?)\s*(-)?\}\}", re.S)


def _truthy(value: Any) -> bool:
    return value not in (None, False, 0, "", [], {})


def _lookup(ctx: dict[str, Any], path: str) -> Any:
    value: Any = ctx
    for key in path.strip(".").split("."):
        if not isinstance(value, dict) or key not in value:
            raise KeyError(f"template refers to missing {path}")
        value = value[key]
    return value


def _operand(ctx: dict[str, Any], words: list[str]) -> Any:
    if words[0] == ".Files.Get":
        return (CHART / json.loads(words[1])).read_text()
    if words[0].startswith('"'):
        return json.loads(words[0])
    if len(words) == 1 and words[0].startswith((".Values.", ".Release.")):
        return _lookup(ctx, words[0])
    raise ValueError(f"unsupported template operand: {' '.join(words)}")


def _apply(func: str, args: list[str], value: Any) -> Any:
    if func == "toYaml" and not args:
        return yaml.safe_dump(value, default_flow_style=False, sort_keys=True).rstrip("\n")
    if func == "nindent" and len(args) == 1:
        pad = " " * int(args[0])
        return "\n" + "\n".join(pad + line if line else line for line in str(value).split("\n"))
    if func == "quote" and not args:
        return json.dumps(str(value))
    raise ValueError(f"unsupported template function: {func} {args}")


FUNCTIONS = {"toYaml", "nindent", "quote"}


def _pipeline(ctx: dict[str, Any], expr: str) -> Any:
    first, *rest = (shlex.split(part, posix=False) for part in expr.split("|"))
    if first[0] in FUNCTIONS:  # `toYaml .Values.x`: a function applied to one operand
        value = _apply(first[0], [], _operand(ctx, first[1:]))
    else:
        value = _operand(ctx, first)
    for func, *args in rest:
        value = _apply(func, args, value)
    return value


def _text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def render_template(text: str, ctx: dict[str, Any]) -> str:
    parts = _ACTION.split(text)  # text, "-"?, action, "-"?, text, ...
    texts, actions = parts[0::4], list(zip(parts[1::4], parts[2::4], parts[3::4], strict=True))
    for i, (trim_left, _, trim_right, *_) in enumerate(actions):
        if trim_left:
            texts[i] = texts[i].rstrip()
        if trim_right:
            texts[i + 1] = texts[i + 1].lstrip()
    out: list[str] = []
    active = [True]
    for i, chunk in enumerate(texts):
        if active[-1]:
            out.append(chunk)
        if i == len(actions):
            break
        action = actions[i][1]
        if action.startswith("if "):
            active.append(active[-1] and _truthy(_pipeline(ctx, action[3:])))
        elif action == "end":
            active.pop()
        elif active[-1]:
            out.append(_text(_pipeline(ctx, action)))
    assert active == [True], "unbalanced if/end"
    return "".join(out)


def render_helm(values: dict[str, Any]) -> list[dict[str, Any]]:
    ctx = {"Values": values, "Release": {"Name": RELEASE, "Namespace": NAMESPACE}}
    docs: list[dict[str, Any]] = []
    for template in sorted((CHART / "templates").glob("*.yaml")):
        rendered = render_template(template.read_text(), ctx)
        docs += [d for d in yaml.safe_load_all(rendered) if d]
    return docs


def helm_values(**overrides: Any) -> dict[str, Any]:
    values = load_yaml(CHART / "values.yaml")
    for dotted, value in overrides.items():
        *parents, leaf = dotted.split("__")
        node = values
        for key in parents:
            node = node[key]
        node[leaf] = value
    return values


# --- the other renders ------------------------------------------------------------------------


def kustomize(tools: Path, tmp_path: Path, *components: str) -> list[dict[str, Any]]:
    """`kustomize build` of the base with the named components, through a throwaway overlay."""
    overlay = tmp_path / ("overlay-" + "-".join(components or ("base",)))
    overlay.mkdir()
    rel = lambda p: os.path.relpath(p, overlay)  # noqa: E731 - kustomize refuses absolute paths
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [rel(KUSTOMIZE / "base")],
                "components": [rel(KUSTOMIZE / "components" / c) for c in components],
            }
        )
    )
    return [d for d in yaml.safe_load_all(run(tools / "kustomize", "build", overlay)) if d]


def jsonnet(tools: Path, *args: str) -> Any:
    return json.loads(run(tools / "jsonnet", "-J", "lib", *args, cwd=TANKA))


def k8s_objects(tree: Any) -> Iterator[dict[str, Any]]:
    """The objects in a Tanka output, as tk finds them: any nested object with apiVersion+kind."""
    if isinstance(tree, dict):
        if "apiVersion" in tree and "kind" in tree:
            yield tree
        else:
            for value in tree.values():
                yield from k8s_objects(value)


def tanka(tools: Path) -> list[dict[str, Any]]:
    return list(k8s_objects(jsonnet(tools, "environments/default/main.jsonnet")))


def tanka_config(tools: Path, snippet: str) -> dict[str, Any]:
    return jsonnet(tools, "-e", snippet)


def by_kind(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["kind"]: d for d in docs}


def daemonset(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return by_kind(docs)["DaemonSet"]


def comparable(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """Objects keyed by kind and name, without what legitimately differs between installers:
    the Namespace object and metadata.namespace (Helm and Tanka take them from the command or
    the environment), and the config text (compared parsed)."""
    out = {}
    for doc in docs:
        if doc["kind"] == "Namespace":
            continue
        doc = copy.deepcopy(doc)
        doc["metadata"].pop("namespace", None)
        if doc["kind"] == "ConfigMap":
            doc["data"] = {k: yaml.safe_load(v) for k, v in doc["data"].items()}
        out[doc["kind"], doc["metadata"]["name"]] = doc
    return out


def security_and_mounts(ds: dict[str, Any]) -> dict[str, Any]:
    pod = ds["spec"]["template"]["spec"]
    (agent,) = pod["containers"]
    return {
        "hostPID": pod.get("hostPID", False),
        "securityContext": agent["securityContext"],
        "volumeMounts": agent["volumeMounts"],
        "volumes": pod["volumes"],
    }


# --- tests: the chart's values -----------------------------------------------------------------


def test_values_yaml_satisfies_values_schema() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    jsonschema.validate(load_yaml(CHART / "values.yaml"), schema)


@pytest.mark.parametrize(
    ("key", "bad"),
    [
        ("config__log_level", "verbose"),
        ("config__export__otlp__protocol", "thrift"),
        ("criSocketDir", "run/containerd"),
        ("serviceMonitor__enabled", "yes"),
        ("privileged", True),  # not a key: the chart has no way to ask for it
    ],
)
def test_values_schema_rejects_bad_values(key: str, bad: Any) -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(helm_values(**{key: bad}), schema)


def test_tanka_config_has_exactly_helms_values(tools: Path) -> None:
    defaults = tanka_config(tools, "(import 'kubenpu/kubenpu.libsonnet')._config")
    assert defaults == load_yaml(CHART / "values.yaml")


def test_container_config_is_the_same_everywhere() -> None:
    config = load_yaml(CHART / "values.yaml")["config"]
    assert load_yaml(KUSTOMIZE / "base" / "config.yaml") == config
    uri = config["attribution"]["cri"]["endpoint"]
    cri_dir = load_yaml(CHART / "values.yaml")["criSocketDir"]
    assert uri.removeprefix("unix://").startswith(cri_dir + "/"), "socket outside the mount"


def test_container_config_has_the_agents_keys() -> None:
    """Same key tree as the agent's documented config; loads with the agent's own loader."""
    agent_config = ROOT / "config" / "kubenpu.yaml"
    if not agent_config.exists():
        pytest.skip("config/kubenpu.yaml is not written yet")

    def keys(tree: Any, prefix: str = "") -> set[str]:
        if not isinstance(tree, dict) or not tree:
            return {prefix}
        return set().union(*(keys(v, f"{prefix}.{k}") for k, v in tree.items()))

    assert keys(load_yaml(CHART / "values.yaml")["config"]) == keys(load_yaml(agent_config))
    config_module = pytest.importorskip("kubenpu.config")
    config_module.load(KUSTOMIZE / "base" / "config.yaml")


# --- tests: renders, schemas, and the three installers agreeing ----------------------------------


def test_kustomize_builds_base_and_each_component(tools: Path, tmp_path: Path) -> None:
    base = kustomize(tools, tmp_path)
    assert {d["kind"] for d in base} == {"Namespace", "ConfigMap", "Service", "DaemonSet"}
    monitoring = by_kind(kustomize(tools, tmp_path, "servicemonitor"))
    assert monitoring.keys() >= CR_KINDS
    accel = daemonset(kustomize(tools, tmp_path, "accel"))["spec"]["template"]["spec"]
    assert accel["nodeSelector"]["kubenpu.io/accel"] == "true"
    assert {"name": "accel", "mountPath": "/host/dev/accel", "readOnly": True} in accel[
        "containers"
    ][0]["volumeMounts"]
    assert {"path": "/dev/accel", "type": "Directory"} in [
        v["hostPath"] for v in accel["volumes"] if "hostPath" in v
    ]
    assert len(kustomize(tools, tmp_path, "servicemonitor", "accel")) == len(base) + 2


@pytest.fixture(scope="session")
def every_render(tools: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, list]:
    tmp = tmp_path_factory.mktemp("kustomize")
    all_on = helm_values(
        serviceMonitor__enabled=True,
        prometheusRule__enabled=True,
        priorityClassName="system-node-critical",
        affinity={"nodeAffinity": {}},
        podAnnotations={"a": "b"},
        imagePullSecrets=[{"name": "regcred"}],
        extraEnv=[{"name": "OTEL_EXPORTER_OTLP_HEADERS", "value": "x=y"}],
    )
    return {
        "helm default": render_helm(helm_values()),
        "helm all options": render_helm(all_on),
        "kustomize all components": kustomize(tools, tmp, "servicemonitor", "accel"),
        "otel collector": [
            d for d in yaml.safe_load_all(run(tools / "kustomize", "build", DEPLOY / "otel")) if d
        ],
        "tanka default": tanka(tools),
    }


def test_every_render_passes_the_kubernetes_schemas(every_render: dict[str, list]) -> None:
    for name, docs in every_render.items():
        assert docs, name
        for doc in docs:
            if doc["kind"] in CR_KINDS:  # parsed only
                assert doc["apiVersion"] == "monitoring.coreos.com/v1" and doc["spec"], name
                continue
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_kubernetes_schema_check_can_fail() -> None:
    ds = daemonset(render_helm(helm_values()))
    ds["spec"]["template"]["spec"]["containers"][0]["securityContext"]["readOnlyRootFS"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(ds, K8S_VERSION, strict=True)


def test_helm_kustomize_and_tanka_share_securitycontext_and_mounts(
    tools: Path, tmp_path: Path
) -> None:
    helm = security_and_mounts(daemonset(render_helm(helm_values())))
    assert security_and_mounts(daemonset(kustomize(tools, tmp_path))) == helm
    assert security_and_mounts(daemonset(tanka(tools))) == helm


def test_kustomize_base_renders_the_charts_objects(tools: Path, tmp_path: Path) -> None:
    helm = render_helm(helm_values(serviceMonitor__enabled=True, prometheusRule__enabled=True))
    assert comparable(kustomize(tools, tmp_path, "servicemonitor")) == comparable(helm)


def test_tanka_environment_renders_the_charts_objects(tools: Path) -> None:
    """The environment's `_config`, given to the chart as values, gives the same objects."""
    values = tanka_config(tools, "(import 'environments/default/main.jsonnet')._config")
    assert values != load_yaml(CHART / "values.yaml"), "the environment overrides nothing"
    assert comparable(tanka(tools)) == comparable(render_helm(values))


def test_tanka_renders_monitoring_objects_when_enabled(tools: Path) -> None:
    snippet = """(import 'kubenpu/kubenpu.libsonnet') {
      _config+:: { serviceMonitor+: { enabled: true }, prometheusRule+: { enabled: true } } }"""
    docs = list(k8s_objects(jsonnet(tools, "-e", snippet)))
    helm = render_helm(helm_values(serviceMonitor__enabled=True, prometheusRule__enabled=True))
    assert comparable(docs) == comparable(helm)


# --- tests: what the agent needs, and nothing more -----------------------------------------------


def check_agent_daemonset(ds: dict[str, Any], cri_dir: str) -> None:
    pod = ds["spec"]["template"]["spec"]
    (agent,) = pod["containers"]
    sc = agent["securityContext"]
    assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"], "add": CAPABILITIES}
    assert not pod.get("hostPID") and not pod.get("hostNetwork") and not pod.get("hostIPC")
    host = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert set(host.values()) >= HOST_PATHS | {cri_dir}
    mounts = {m["name"]: m for m in agent["volumeMounts"]}
    for name in host:
        assert mounts[name].get("readOnly") is True, f"{name} is writable"
    assert mounts["cri"]["mountPath"] == cri_dir
    env = {e["name"]: e for e in agent["env"]}
    assert env["K8S_NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}


def test_agent_runs_unprivileged_with_read_only_node_mounts(every_render: dict) -> None:
    for name in ("helm default", "helm all options", "kustomize all components", "tanka default"):
        check_agent_daemonset(daemonset(every_render[name]), "/run/containerd")


def test_agent_check_catches_a_writable_mount() -> None:
    ds = daemonset(render_helm(helm_values()))
    ds["spec"]["template"]["spec"]["containers"][0]["volumeMounts"][2]["readOnly"] = False
    with pytest.raises(AssertionError, match="writable"):
        check_agent_daemonset(ds, "/run/containerd")


def test_chart_values_reach_the_objects() -> None:
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}]
            }
        }
    }
    values = helm_values(
        criSocketDir="/run/k3s/containerd",
        priorityClassName="system-node-critical",
        tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        nodeSelector={"accel": "yes"},
        affinity=affinity,
        resources={"limits": {"memory": "1Gi"}},
    )
    values["config"]["export"]["otlp"]["endpoint"] = "https://otel.example:4317"
    values["config"]["export"]["prometheus"]["port"] = 9400
    values["config"]["attribution"]["cri"]["endpoint"] = "unix:///run/k3s/containerd/c.sock"
    docs = by_kind(render_helm(values))
    pod = docs["DaemonSet"]["spec"]["template"]["spec"]
    check_agent_daemonset(docs["DaemonSet"], "/run/k3s/containerd")
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["tolerations"] == values["tolerations"]
    assert pod["nodeSelector"] == {"accel": "yes"}
    assert pod["affinity"] == affinity
    assert pod["containers"][0]["resources"] == {"limits": {"memory": "1Gi"}}
    assert pod["containers"][0]["ports"][0]["containerPort"] == 9400
    assert docs["Service"]["spec"]["ports"][0]["port"] == 9400
    config = yaml.safe_load(docs["ConfigMap"]["data"]["config.yaml"])
    assert config["export"]["otlp"]["endpoint"] == "https://otel.example:4317"
    assert "ServiceMonitor" not in docs and "PrometheusRule" not in docs


def test_chart_drops_metrics_port_and_probes_without_prometheus_export() -> None:
    values = helm_values()
    values["config"]["export"]["prometheus"]["enabled"] = False
    (agent,) = daemonset(render_helm(values))["spec"]["template"]["spec"]["containers"]
    assert not {"ports", "startupProbe", "livenessProbe"} & agent.keys()


def test_monitoring_objects_follow_their_values() -> None:
    values = helm_values(serviceMonitor__enabled=True, prometheusRule__enabled=True)
    values["serviceMonitor"]["labels"] = {"release": "kube-prometheus-stack"}
    docs = by_kind(render_helm(values))
    sm, service = docs["ServiceMonitor"], docs["Service"]
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert sm["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert sm["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]
    assert docs["PrometheusRule"]["spec"] == load_yaml(CHART / "files" / "rules.yaml")


# --- tests: alerts and dashboards ----------------------------------------------------------------


def rule_groups() -> dict[str, Any]:
    return load_yaml(CHART / "files" / "rules.yaml")


def test_alert_rules_are_the_same_everywhere(tools: Path) -> None:
    kustomized = load_yaml(KUSTOMIZE / "components" / "servicemonitor" / "prometheusrule.yaml")
    assert kustomized["spec"] == rule_groups()
    assert json.loads(run(tools / "jsonnet", TANKA / "lib" / "kubenpu" / "rules.libsonnet")) == (
        rule_groups()
    )
    alerts = {r["alert"] for g in rule_groups()["groups"] for r in g["rules"]}
    assert {"KubeNPUAgentDown", "KubeNPUEventsDropped", "KubeNPUAttributionFailing"} <= alerts


def test_promtool_checks_the_prometheusrule(
    tools: Path, tmp_path: Path, every_render: dict
) -> None:
    rule = by_kind(every_render["helm all options"])["PrometheusRule"]
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(rule["spec"]))
    assert "SUCCESS: 4 rules found" in run(tools / "promtool", "check", "rules", rules)


def test_promtool_unit_tests_of_the_alerts(tools: Path) -> None:
    run(tools / "promtool", "test", "rules", ROOT / "tests" / "deploy" / "alerts_test.yaml")


def dashboards(tools: Path) -> dict[str, dict[str, Any]]:
    """Each dashboard, rendered from its jsonnet, checked equal to its committed JSON."""
    out = {}
    for source in sorted(GRAFANA.glob("*.jsonnet")):
        rendered = json.loads(run(tools / "jsonnet", "-J", GRAFANA, source))
        committed = json.loads(source.with_suffix(".json").read_text())
        assert rendered == committed, f"re-render {source.name} (see docs/deploy.md)"
        out[source.stem] = rendered
    return out


def dashboard_queries(board: dict[str, Any]) -> Iterator[str]:
    for panel in board["panels"]:
        for target in panel["targets"]:
            yield target["expr"]
    for var in board["templating"]["list"]:
        if var["type"] == "query":
            yield var["query"]["query"]


def every_query(tools: Path) -> list[str]:
    alerts = [r["expr"] for g in rule_groups()["groups"] for r in g["rules"]]
    return alerts + [q for b in dashboards(tools).values() for q in dashboard_queries(b)]


def unknown_metrics(expr: str) -> set[str]:
    names = set(re.findall(r"\bkubenpu_\w+", expr))
    names |= {n for n in SCRAPE_SERIES if re.search(rf"\b{n}\{{", expr)}
    known = EXPORTED_METRICS | {m + s for m in EXPORTED_METRICS for s in HISTOGRAM_SUFFIXES}
    assert names, f"names no metric: {expr}"
    return names - known - SCRAPE_SERIES


def test_every_query_names_an_exported_metric(tools: Path) -> None:
    queries = every_query(tools)
    assert {q: unknown_metrics(q) for q in queries if unknown_metrics(q)} == {}
    used = set().union(*(re.findall(r"\bkubenpu_\w+", q) for q in queries))
    for metric in EXPORTED_METRICS:  # every series has a panel or an alert
        assert any(u.startswith(metric) for u in used), metric
    assert unknown_metrics("rate(kubenpu_ioctls_total[5m])") == {"kubenpu_ioctls_total"}


def test_dashboards_cover_the_required_views(tools: Path) -> None:
    boards = dashboards(tools)
    exprs = " ".join(q for b in boards.values() for q in dashboard_queries(b))
    for needle in (
        "sum by (namespace, pod, kind) (rate(kubenpu_ioctl_total",  # calls/s per pod by kind
        "topk by (node, device)",  # top pods per device
        "sum by (node, device, kind) (increase(kubenpu_ioctl_total",  # per-device totals
        "numa_node) (kubenpu_device_info",  # device info with NUMA
        "kubenpu_events_dropped_total",
        "kubenpu_cri_errors_total",
        "kubenpu_cgroup_index_rebuilds_total",
    ):
        assert needle in exprs, needle


def test_promtool_parses_every_dashboard_query(tools: Path, tmp_path: Path) -> None:
    """Grafana's variables replaced by values, each query becomes a recording rule to parse."""
    grafana_vars = {"$__rate_interval": "5m", "$__range": "1h", "$node": ".*", "$namespace": ".*"}
    rules = []
    for name, board in dashboards(tools).items():
        for i, panel in enumerate(board["panels"]):
            for target in panel["targets"]:
                expr = target["expr"]
                for var, value in grafana_vars.items():
                    expr = expr.replace(var, value)
                assert "$" not in expr, expr
                record = f"dashboard:{name.replace('-', '_')}:{i}{target['refId']}"
                rules.append({"record": record, "expr": expr})
    path = tmp_path / "dashboards.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    assert f"SUCCESS: {len(rules)} rules found" in run(tools / "promtool", "check", "rules", path)


def test_metrics_doc_describes_the_listed_metrics() -> None:
    doc = ROOT / "docs" / "metrics.md"
    assert {m for m in EXPORTED_METRICS if m not in doc.read_text()} == set()


# --- tests: the Collector and the image ----------------------------------------------------------


def test_collector_config_is_consistent() -> None:
    otel = DEPLOY / "otel"
    config = load_yaml(otel / "collector.yaml")
    pipeline = config["service"]["pipelines"]["metrics"]
    for section in ("receivers", "processors", "exporters"):
        assert set(pipeline[section]) <= config[section].keys(), section
    assert {"prometheusremotewrite", "otlp", "debug"} <= config["exporters"].keys()
    assert pipeline["processors"][0] == "memory_limiter" and pipeline["processors"][-1] == "batch"
    assert set(config["service"]["extensions"]) <= config["extensions"].keys()
    (collector,) = load_yaml(otel / "deployment.yaml")["spec"]["template"]["spec"]["containers"]
    env = {e["name"] for e in collector["env"]}
    used = set(re.findall(r"\$\{env:(\w+)\}", (otel / "collector.yaml").read_text()))
    assert used <= env, used - env
    # The agents' default OTLP endpoint is this Collector's Service.
    service = load_yaml(otel / "service.yaml")
    endpoint = load_yaml(CHART / "values.yaml")["config"]["export"]["otlp"]["endpoint"]
    ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    assert endpoint == f"http://{service['metadata']['name']}:{ports['otlp-grpc']}"
    receiver = config["receivers"]["otlp"]["protocols"]
    assert receiver["grpc"]["endpoint"].endswith(f":{ports['otlp-grpc']}")
    assert receiver["http"]["endpoint"].endswith(f":{ports['otlp-http']}")


def dockerfile() -> list[tuple[str, str]]:
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines()]
    return [tuple(line.split(None, 1)) for line in lines if line and not line.startswith("#")]


def test_dockerfile_builds_the_agent_image_as_specified() -> None:
    """Static checks only: no Docker daemon runs here, so the image is never built in tests."""
    steps = dockerfile()
    assert steps[0] == ("FROM", "debian:trixie-slim")
    runs = " ".join(arg for op, arg in steps if op == "RUN")
    assert re.search(
        r"apt-get install -y --no-install-recommends python3 python3-venv "
        r"python3-bpfcc\b",
        runs,
    )
    assert "venv --system-site-packages /opt/kubenpu" in runs
    assert '/opt/kubenpu/bin/pip install --no-cache-dir ".[agent]"' in runs
    entry = [json.loads(arg) for op, arg in steps if op == "ENTRYPOINT"]
    assert entry == [["kubenpu-agent", "--config", "/etc/kubenpu/config.yaml"]]
    allowed = (ROOT / ".dockerignore").read_text().splitlines()
    for op, arg in steps:
        if op == "COPY":
            *sources, _ = arg.split()
            for source in sources:
                assert (ROOT / source).exists(), source
                assert f"!{source}" in allowed, f".dockerignore hides {source}"
