"""Deploy artefacts: Helm chart, Kustomize, Tanka, Collector config, Grafana dashboards, alerts.

Real tools render and check them: helm and kubectl (scripts/k8s-tools.sh), Debian's kustomize,
jsonnet and promtool (scripts/deploy-tools.sh); kubernetes-validate checks every object against
the Kubernetes API schemas it bundles (offline). The chart is the one source of the objects: the
Kustomize files are rendered from it by scripts/gen-deploy.sh (checked here for staleness) and
the Tanka library renders it through Tanka's Helm support.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import _jsonnet
import jsonschema
import kubernetes_validate
import pytest
import yaml
from collector_path import Collector, Series, scrape_series, unmatched
from helpers import (
    CHART,
    NAMESPACE,
    RELEASE,
    helm,
    helm_values,
    k8s_tools,
    render_helm,
    script_output,
)

from kubenpu.metrics.catalogue import HW_ATTRIBUTES, K8S_ATTRIBUTES, SPECS

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
KUSTOMIZE = DEPLOY / "kustomize"
TANKA = DEPLOY / "tanka"
GRAFANA = DEPLOY / "grafana"
TESTDATA = ROOT / "tests" / "testdata"
K8S_VERSION = "1.33"

# The series the agent exports, named as Prometheus shows them: the one list the dashboard and
# alert checks read (docs/metrics.md must describe each).
EXPORTED_METRICS = {spec.prometheus_name for spec in SPECS}
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
# Made by Prometheus itself for every scrape target.
SCRAPE_SERIES = {"up"}

# The node paths the agent reads, each mounted read-only; the CRI directory comes from values.
# Of /dev only the DRM and accel node directories (discovery checks the nodes exist there).
HOST_PATHS = {
    "/sys",
    "/sys/fs/cgroup",
    "/dev/dri",
    "/dev/accel",
    "/proc",  # fdinfo
}
HEADERS = {"/lib/modules", "/usr/src"}  # only with bccFallback: BCC compiles against them
# What each probe.hook needs: daemonset.yaml says why; tests/test_least_privilege_vm.py measures
CAPABILITIES = {"security_file_ioctl": ["BPF", "PERFMON"], "drm_ioctl": ["SYS_ADMIN"]}
# What config.fdinfo.enabled (the default) adds: tests/test_least_privilege_vm.py measures
FDINFO_CAPABILITIES = ["SYS_PTRACE", "DAC_READ_SEARCH"]
DRM_IOCTL_HOOK = {"config": {"probe": {"hook": "drm_ioctl"}}}
BPFFS = "/sys/fs/bpf"  # mounted only with probe.pin_dir set (the default, docs/pinning.md)
# Mounted only with attribution.pod_resources enabled (the default, docs/allocations.md).
POD_RESOURCES = "/var/lib/kubelet/pod-resources"
WRITABLE = {"bpffs"}  # the probe is pinned there; every other node mount is ro
CR_KINDS = {"ServiceMonitor", "PrometheusRule"}  # CRDs: no bundled schema
DIGEST = "sha256:" + "ab" * 32
MONITORING = {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}}

# The knobs every peer chart has (nameOverride, service.*, ...), all set at once.
KNOBS: dict[str, Any] = {
    "nameOverride": "npu",
    "namespaceOverride": "observability",
    "podLabels": {"team": "ml"},
    "updateStrategy": {"type": "OnDelete"},
    "service": {
        "type": "ClusterIP",
        "clusterIP": "",
        "port": 9400,
        "annotations": {"a": "b"},
        "labels": {"tier": "node"},
    },
    "serviceMonitor": {
        "enabled": True,
        "scrapeTimeout": "5s",
        "metricRelabelings": [{"action": "drop", "regex": "kubenpu_build_info"}],
    },
    "extraVolumes": [{"name": "ca", "configMap": {"name": "otlp-ca"}}],
    "extraVolumeMounts": [{"name": "ca", "mountPath": "/etc/otlp-ca", "readOnly": True}],
    "runtimeClassName": "runc",
    "podSecurityContext": {"seLinuxOptions": {"type": "spc_t"}},
}

# The value sets the chart is linted, rendered and schema-checked with: every switch it has.
VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "monitoring": MONITORING,
    "otlp": {
        "config": {"export": {"otlp": {"enabled": True, "protocol": "http/protobuf"}}},
        "otlpHeadersSecret": {"name": "otlp-auth"},
    },
    "accel": {"accel": {"required": True}},
    "events mode": {"config": {"probe": {"mode": "events"}}},
    "drm_ioctl hook": DRM_IOCTL_HOOK,
    # Only BCC has the kprobe attach, and only the -bcc image has BCC (values.schema.json).
    "kprobe attach": {"bccFallback": True, "config": {"probe": {"attach": "kprobe"}}},
    "fentry attach": {"config": {"probe": {"attach": "fentry"}}},
    "no pinning": {"config": {"probe": {"pin_dir": ""}}},
    "bcc fallback": {"bccFallback": True},
    "tls and auth": {
        "metricsTLS": {"secretName": "metrics-tls"},
        "metricsAuth": {"secretName": "metrics-auth", "username": "prom", "bearerToken": True},
    },
    "no /metrics, no policy": {
        "config": {"export": {"prometheus": {"enabled": False}}},
        "networkPolicy": {"enabled": False},
    },
    "all options": {
        **MONITORING,
        "image": {"digest": DIGEST},
        "priorityClassName": "system-node-critical",
        "affinity": {"nodeAffinity": {}},
        "podAnnotations": {"a": "b"},
        "imagePullSecrets": [{"name": "regcred"}],
        "extraEnv": [{"name": "EXTRA", "value": "x"}],
    },
    "common knobs": KNOBS,
}

pytestmark = pytest.mark.tools


@pytest.fixture(scope="session")
def tools() -> Path:
    return Path(script_output("deploy-tools.sh"))


def run(tool: Path, *args: str | Path, cwd: Path = ROOT) -> str:
    proc = subprocess.run(
        [str(tool), *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, f"{tool.name} {args}: {proc.stdout}{proc.stderr}"
    return proc.stdout


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def docs_of(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


# --- the renders --------------------------------------------------------------------------------


def kustomize(build: Callable[[Path], str], tmp_path: Path, *components: str) -> list[dict]:
    """A kustomize build of the base with the named components, through a throwaway overlay."""
    overlay = tmp_path / ("overlay-" + "-".join(components or ("base",)))
    overlay.mkdir(exist_ok=True)
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
    return docs_of(build(overlay))


@pytest.fixture(scope="session")
def kustomizers(tools: Path) -> dict[str, Callable[[Path], str]]:
    """Both kustomize builds an operator may run: Debian's kustomize and `kubectl kustomize`."""
    return {
        "kustomize": lambda d: run(tools / "kustomize", "build", d),
        "kubectl kustomize": lambda d: run(k8s_tools() / "kubectl", "kustomize", d),
    }


NATIVE = "std.native('helmTemplate')"


def helm_template_native(name: str, chart: str, opts_json: str) -> dict[str, Any]:
    """Tanka's `helmTemplate` native function, as tk runs it: `helm template` with the values on
    stdin, the chart relative to opts.calledFrom, the objects keyed by kind and name. tk is not
    packaged by any registry reachable here, so this is the one stand-in (helm is real). Python's
    jsonnet passes only primitives to native functions, hence opts as JSON text."""
    opts = json.loads(opts_json)
    path = Path(opts["calledFrom"]).parent / chart
    objects = render_helm(
        opts.get("values"), chart=path, namespace=opts.get("namespace", ""), hooks=True
    )
    return {f"{o['kind']}_{o['metadata']['name']}".lower(): o for o in objects}


def tanka_import(base: str, rel: str) -> tuple[str, bytes]:
    """Imports as tk resolves them (lib/ and the Tanka root), with the one call to tk's native
    function routed to helm_template_native."""
    for root in (Path(base), TANKA / "lib", TANKA):
        path = root / rel
        if path.is_file():
            text = path.read_text()
            if NATIVE in text:
                assert text.count(NATIVE) == 1, path
                shim = "(function(n, c, o) std.native('helmJson')(n, c, std.manifestJson(o)))"
                text = text.replace(NATIVE, shim)
            return str(path), text.encode()
    raise RuntimeError(f"no such import: {rel}")


def tanka(snippet: str) -> list[dict[str, Any]]:
    """The objects of a Tanka environment or library snippet, as tk finds them."""
    return list(k8s_objects(json.loads(evaluate_jsonnet(snippet))))


def evaluate_jsonnet(snippet: str) -> str:
    return _jsonnet.evaluate_snippet(
        str(TANKA / "snippet"),
        snippet,
        import_callback=tanka_import,
        # One-letter names: the binding garbles longer ones ("binding parameter a second time").
        native_callbacks={"helmJson": (("r", "c", "o"), helm_template_native)},
    )


def k8s_objects(tree: Any) -> Iterator[dict[str, Any]]:
    """Any nested object with apiVersion and kind, as tk finds them."""
    if isinstance(tree, dict):
        if "apiVersion" in tree and "kind" in tree:
            yield tree
        else:
            for value in tree.values():
                yield from k8s_objects(value)


TANKA_LIB = "(import 'kubenpu/kubenpu.libsonnet')"
TANKA_ENV = "(import 'environments/default/main.jsonnet')"


def is_hook(doc: dict[str, Any]) -> bool:
    return "helm.sh/hook" in doc["metadata"].get("annotations", {})


def by_kind(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The release's objects by kind (Helm's hooks, run only by helm uninstall, aside)."""
    return {d["kind"]: d for d in docs if not is_hook(d)}


def hooks(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["kind"]: d for d in docs if is_hook(d)}


def daemonset(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return by_kind(docs)["DaemonSet"]


def agent_of(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (agent,) = daemonset(docs)["spec"]["template"]["spec"]["containers"]
    return agent


def agent_config(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return yaml.safe_load(by_kind(docs)["ConfigMap"]["data"]["config.yaml"])


CONFIG_HASH = re.compile(r"^(kubenpu-config)-[a-z0-9]{10}$")  # Kustomize's generator suffix


def unhashed(name: str) -> str:
    return CONFIG_HASH.sub(r"\1", name)


def comparable(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """Objects keyed by kind and name, without the Namespace object (Helm and Tanka take it from
    the command or the environment) and Helm's hooks, with the config text parsed and the pod's
    volumes and the containers' mounts in name order (a Kustomize patch moves what it patches or
    adds to the front; the order means nothing). What rolls the agents on a config change is
    each tool's own: Helm's checksum/config annotation, Kustomize's hash suffix on the
    ConfigMap's name (test_a_config_change_rolls_the_agents), so both are left out."""
    out = {}
    for doc in docs:
        if doc["kind"] == "Namespace" or is_hook(doc):
            continue
        doc = copy.deepcopy(doc)
        if doc["kind"] == "ConfigMap":
            doc["data"] = {k: yaml.safe_load(v) for k, v in doc["data"].items()}
            doc["metadata"]["name"] = unhashed(doc["metadata"]["name"])
        if doc["kind"] == "DaemonSet":
            template = doc["spec"]["template"]
            annotations = template["metadata"].pop("annotations", {})
            annotations.pop("checksum/config", None)
            if annotations:
                template["metadata"]["annotations"] = annotations
            pod = template["spec"]
            pod["volumes"].sort(key=lambda v: v["name"])
            for volume in pod["volumes"]:
                if "configMap" in volume:
                    volume["configMap"]["name"] = unhashed(volume["configMap"]["name"])
            for container in pod["containers"]:
                container["volumeMounts"].sort(key=lambda m: m["name"])
        out[doc["kind"], doc["metadata"]["name"]] = doc
    return out


def security_mounts_and_config(docs: list[dict[str, Any]]) -> dict[str, Any]:
    pod = daemonset(docs)["spec"]["template"]["spec"]
    (agent,) = pod["containers"]
    return {
        "hostPID": pod.get("hostPID", False),
        "securityContext": agent["securityContext"],
        "volumeMounts": agent["volumeMounts"],
        "volumes": [
            {**v, "configMap": {"name": unhashed(v["configMap"]["name"])}}
            if "configMap" in v
            else v
            for v in pod["volumes"]
        ],
        "config": agent_config(docs),
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
        ("image__digest", "latest"),
        ("networkPolicy__from", [{}]),  # an empty peer would admit every source
        ("networkPolicy__monitoringNamespaces", ["Monitoring"]),
        ("nameOverride", "Kube_NPU"),
        ("namespaceOverride", "x" * 64),
        ("updateStrategy", {"type": "Recreate"}),  # not a DaemonSet strategy
        ("service__port", 0),
        ("serviceMonitor__scrapeTimeout", "10 seconds"),
        ("extraVolumeMounts", [{"name": "ca"}]),  # no mountPath
        ("uninstallHook__timeoutSeconds", 0),
        ("privileged", True),  # not a key: the chart has no way to ask for it
    ],
)
def test_values_schema_rejects_bad_values(key: str, bad: Any) -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(helm_values(**{key: bad}), schema)
    assert helm("lint", "--strict", str(CHART), values=helm_values(**{key: bad})).returncode


@pytest.mark.parametrize("name", VALUE_SETS)
def test_helm_lint_passes(name: str) -> None:
    proc = helm("lint", "--strict", str(CHART), values=VALUE_SETS[name])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_container_config_has_the_agents_keys() -> None:
    """Same key tree as the agent's documented config; loads with the agent's own loader."""
    agent_config_file = ROOT / "config" / "kubenpu.yaml"

    def keys(tree: Any, prefix: str = "") -> set[str]:
        if not isinstance(tree, dict) or not tree:
            return {prefix}
        return set().union(*(keys(v, f"{prefix}.{k}") for k, v in tree.items()))

    # Opt-in sections the chart leaves out of its values, so its default render is unchanged
    # (values.yaml says how to set them; tests/test_placement.py renders them on).
    opt_in = {".placement.scheduler"}
    chart_keys = keys(load_yaml(CHART / "values.yaml")["config"])
    assert chart_keys == keys(load_yaml(agent_config_file)) - opt_in
    from kubenpu import config

    config.load(str(KUSTOMIZE / "base" / "config.yaml"), {"K8S_NODE_NAME": "n"})


def test_the_agent_names_its_host_by_the_node_the_chart_gives_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pod has no host network, so gethostname() is the pod's name: host.name, like
    k8s.node.name and service.instance.id, is the node's, from the downward API's
    spec.nodeName. It once was the pod's (kubenpu-x7k2p), a host no inventory knows."""
    from kubenpu import config, export

    docs = render_helm()
    env = {}
    for item in agent_of(docs)["env"]:
        ref = item.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        if ref == "spec.nodeName":  # what the kubelet puts there
            env[item["name"]] = "worker-3"
        elif "value" in item:
            env[item["name"]] = item["value"].replace("$(K8S_NODE_NAME)", env["K8S_NODE_NAME"])
    path = tmp_path / "config.yaml"
    path.write_text(by_kind(docs)["ConfigMap"]["data"]["config.yaml"])
    monkeypatch.setattr("socket.gethostname", lambda: "kubenpu-x7k2p")  # the pod's name
    for key, value in env.items():
        monkeypatch.setenv(key, value)  # OTEL_RESOURCE_ATTRIBUTES is read from the process
    attributes = export.build_resource(config.load(str(path), env)).attributes
    names = ("host.name", "k8s.node.name", "service.instance.id")
    assert {n: attributes[n] for n in names} == dict.fromkeys(names, "worker-3")


def test_cri_socket_is_inside_its_mount() -> None:
    values = helm_values()
    uri = values["config"]["attribution"]["cri"]["endpoint"]
    assert uri.removeprefix("unix://").startswith(values["criSocketDir"] + "/")


# --- tests: one source, and every render schema-valid ------------------------------------------


def test_generated_kustomize_files_are_current(tmp_path: Path) -> None:
    """scripts/gen-deploy.sh renders the Kustomize files from the chart: they are what it writes."""
    subprocess.run(["bash", ROOT / "scripts" / "gen-deploy.sh", tmp_path], check=True)
    generated = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    assert len(generated) >= 7
    stale = [str(p) for p in generated if (DEPLOY / p).read_text() != (tmp_path / p).read_text()]
    assert stale == [], "run scripts/gen-deploy.sh and commit: stale files"


@pytest.fixture(scope="session")
def every_render(kustomizers: dict, tools: Path, tmp_path_factory) -> dict[str, list]:
    tmp = tmp_path_factory.mktemp("kustomize")
    renders = {f"helm {name}": render_helm(values) for name, values in VALUE_SETS.items()}
    for tool, build in kustomizers.items():
        renders[f"{tool} all components"] = kustomize(
            build, tmp, "servicemonitor", "accel", "drm-ioctl-hook"
        )
    renders["otel collector"] = docs_of(run(tools / "kustomize", "build", DEPLOY / "otel"))
    renders["tanka default"] = tanka(TANKA_ENV)
    renders["tanka drm_ioctl hook"] = tanka(
        TANKA_LIB + " { _config+:: " + json.dumps(DRM_IOCTL_HOOK) + " }"
    )
    return renders


def test_every_render_passes_the_kubernetes_schemas(every_render: dict[str, list]) -> None:
    for name, docs in every_render.items():
        assert docs, name
        for doc in docs:
            if doc["kind"] in CR_KINDS:  # parsed only
                assert doc["apiVersion"] == "monitoring.coreos.com/v1" and doc["spec"], name
                continue
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_kubernetes_schema_check_can_fail() -> None:
    ds = daemonset(render_helm())
    ds["spec"]["template"]["spec"]["containers"][0]["securityContext"]["readOnlyRootFS"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(ds, K8S_VERSION, strict=True)


@pytest.mark.parametrize(
    ("components", "values"),
    [
        ((), {}),
        (("servicemonitor",), MONITORING),
        (("accel",), VALUE_SETS["accel"]),
        (("drm-ioctl-hook",), DRM_IOCTL_HOOK),
        (("bcc-fallback",), VALUE_SETS["bcc fallback"]),
    ],
)
def test_kustomize_renders_the_charts_objects(
    kustomizers: dict, tmp_path: Path, components: tuple[str, ...], values: dict
) -> None:
    helm_objects = comparable(render_helm(values))
    for tool, build in kustomizers.items():
        assert comparable(kustomize(build, tmp_path, *components)) == helm_objects, tool


def test_helm_kustomize_and_tanka_share_securitycontext_mounts_and_config(
    kustomizers: dict, tmp_path: Path
) -> None:
    helm_view = security_mounts_and_config(render_helm())
    for tool, build in kustomizers.items():
        assert security_mounts_and_config(kustomize(build, tmp_path)) == helm_view, tool
    assert security_mounts_and_config(tanka(TANKA_LIB)) == helm_view


def test_tanka_passes_its_config_to_the_chart_as_values() -> None:
    """The environment's `_config` are chart values: the same objects as helm with them."""
    values = json.loads(evaluate_jsonnet(TANKA_ENV + "._config"))
    assert values, "the environment overrides nothing"
    objects = tanka(TANKA_ENV)
    assert comparable(objects) == comparable(render_helm(values))
    assert agent_config(objects)["export"]["otlp"]["enabled"] is True
    monitoring = tanka(TANKA_LIB + " { _config+:: " + json.dumps(MONITORING) + " }")
    assert comparable(monitoring) == comparable(render_helm(MONITORING))


# --- tests: what the agent needs, and nothing more -----------------------------------------------


def check_agent_daemonset(
    ds: dict[str, Any], cri_dir: str, hook: str = "security_file_ioctl", headers: bool = False
) -> None:
    pod = ds["spec"]["template"]["spec"]
    (agent,) = pod["containers"]
    sc = agent["securityContext"]
    assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    add = CAPABILITIES[hook] + FDINFO_CAPABILITIES
    assert sc["capabilities"] == {"drop": ["ALL"], "add": add}
    assert not pod.get("hostPID") and not pod.get("hostNetwork") and not pod.get("hostIPC")
    host = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    want = HOST_PATHS | {cri_dir} | (HEADERS if headers else set())
    assert set(host.values()) - {BPFFS, POD_RESOURCES} == want, "a host path too many or missing"
    mounts = {m["name"]: m for m in agent["volumeMounts"]}
    for name in host:
        assert (mounts[name].get("readOnly") is True) != (name in WRITABLE), f"{name} is writable"
    assert mounts["cri"]["mountPath"] == cri_dir
    env = {e["name"]: e for e in agent["env"]}
    assert env["K8S_NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}


def test_agent_runs_unprivileged_with_read_only_node_mounts(every_render: dict) -> None:
    for name, docs in every_render.items():
        if name != "otel collector":
            probe = agent_config(docs)["probe"]
            headers = probe["loader"] != "core"  # the BCC fallback compiles against them
            check_agent_daemonset(daemonset(docs), "/run/containerd", probe["hook"], headers)


def test_capabilities_follow_the_hook() -> None:
    """The least-privilege hook by default; drm_ioctl (drm.ko's BTF object) needs SYS_ADMIN."""
    for values, hook in (({}, "security_file_ioctl"), (DRM_IOCTL_HOOK, "drm_ioctl")):
        docs = render_helm(values)
        assert agent_config(docs)["probe"]["hook"] == hook
        sc = daemonset(docs)["spec"]["template"]["spec"]["containers"][0]["securityContext"]
        assert sc["capabilities"]["add"] == CAPABILITIES[hook] + FDINFO_CAPABILITIES
    with pytest.raises(AssertionError):
        check_agent_daemonset(daemonset(render_helm(DRM_IOCTL_HOOK)), "/run/containerd")


def test_gpu_jobs_are_on_by_default_and_add_no_capability() -> None:
    """config.probe.jobs: raw tracepoints and the gpu_sched module's BTF from sysfs need no more
    than the hook's capabilities (tests/test_least_privilege_vm.py, tests/test_node_vm.py)."""
    assert agent_config(render_helm())["probe"]["jobs"] is True
    for hook in ("security_file_ioctl", "drm_ioctl"):
        for jobs in (True, False):
            docs = render_helm({"config": {"probe": {"hook": hook, "jobs": jobs}}})
            assert agent_config(docs)["probe"]["jobs"] is jobs
            sc = daemonset(docs)["spec"]["template"]["spec"]["containers"][0]["securityContext"]
            assert sc["capabilities"]["add"] == CAPABILITIES[hook] + FDINFO_CAPABILITIES


def test_the_guard_is_off_by_default_renders_as_before_and_adds_no_capability() -> None:
    """config.guard: off leaves the agent's config without the key (the render without the
    guard); a mode changes the config alone: BPF + PERFMON (or SYS_ADMIN) are the hook's already
    (docs/guard.md, tests/test_guard_vm.py)."""
    default = render_helm()
    assert "guard" not in agent_config(default)
    for hook in ("security_file_ioctl", "drm_ioctl"):
        off = render_helm({"config": {"probe": {"hook": hook}}})
        for mode in ("audit", "enforce"):
            on = render_helm({"config": {"probe": {"hook": hook}, "guard": {"mode": mode}}})
            assert agent_config(on)["guard"]["mode"] == mode
            assert agent_of(on)["securityContext"] == agent_of(off)["securityContext"]
            assert agent_of(on)["volumeMounts"] == agent_of(off)["volumeMounts"]
    by_namespace = render_helm({"config": {"guard": {"namespaces": {"ml": "enforce"}}}})
    assert agent_config(by_namespace)["guard"]["namespaces"] == {"ml": "enforce"}
    values = {"config": {"guard": {"mode": "audit"}, "attribution": {"pod_resources": {}}}}
    values["config"]["attribution"]["pod_resources"]["enabled"] = False
    proc = helm("template", str(CHART), values=values)
    assert proc.returncode != 0 and "needs config.attribution.pod_resources.enabled" in proc.stderr


def test_agent_check_catches_a_writable_mount_and_the_whole_dev() -> None:
    ds = daemonset(render_helm())
    ds["spec"]["template"]["spec"]["containers"][0]["volumeMounts"][2]["readOnly"] = False
    with pytest.raises(AssertionError, match="writable"):
        check_agent_daemonset(ds, "/run/containerd")
    ds = daemonset(render_helm())
    (dri,) = (v for v in ds["spec"]["template"]["spec"]["volumes"] if v["name"] == "dev-dri")
    dri["hostPath"]["path"] = "/dev"
    with pytest.raises(AssertionError, match="host path"):
        check_agent_daemonset(ds, "/run/containerd")


def test_the_bpffs_is_mounted_only_when_pinning_is_on(every_render: dict) -> None:
    for name, docs in every_render.items():
        if name != "otel collector":
            host = host_path_types(docs)
            assert (BPFFS in host) == (name != "helm no pinning"), name


def test_without_fdinfo_the_agent_gets_what_it_got_before() -> None:
    """fdinfo off: the hook's capabilities alone, and no /proc mount, for either hook."""
    for hook in CAPABILITIES:
        values = helm_values(config__fdinfo__enabled=False)
        values["config"]["probe"]["hook"] = hook
        pod = daemonset(render_helm(values))["spec"]["template"]
        (agent,) = pod["spec"]["containers"]
        assert agent["securityContext"]["capabilities"]["add"] == CAPABILITIES[hook]
        host = {v["hostPath"]["path"] for v in pod["spec"]["volumes"] if "hostPath" in v}
        assert host - {BPFFS, POD_RESOURCES} == HOST_PATHS - {"/proc"} | {"/run/containerd"}


def host_path_types(docs: list[dict[str, Any]]) -> dict[str, str]:
    volumes = daemonset(docs)["spec"]["template"]["spec"]["volumes"]
    return {v["hostPath"]["path"]: v["hostPath"]["type"] for v in volumes if "hostPath" in v}


def test_pod_resources_directory_is_mounted_read_only_when_enabled(every_render: dict) -> None:
    """The directory, not the socket (a restarted kubelet makes a new socket file), read-only,
    and only when the agent asks the kubelet; the config names a socket inside it."""
    for name, docs in every_render.items():
        if name != "otel collector":
            cfg = agent_config(docs)["attribution"]["pod_resources"]
            assert (POD_RESOURCES in host_path_types(docs)) == cfg["enabled"], name
            if cfg["enabled"]:
                assert host_path_types(docs)[POD_RESOURCES] == "DirectoryOrCreate"
                assert cfg["socket"].startswith(POD_RESOURCES + "/")
    off = helm_values()
    off["config"]["attribution"]["pod_resources"]["enabled"] = False
    assert POD_RESOURCES not in host_path_types(render_helm(off))


def test_device_directories_need_not_exist_unless_accel_is_required() -> None:
    """A node without a GPU or NPU driver has no /dev/dri or /dev/accel: the agent still runs."""
    default = host_path_types(render_helm())
    assert default["/dev/dri"] == default["/dev/accel"] == "DirectoryOrCreate"
    docs = render_helm(VALUE_SETS["accel"])
    assert host_path_types(docs)["/dev/accel"] == "Directory"
    pod = daemonset(docs)["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"kubenpu.io/accel": "true", "kubernetes.io/os": "linux"}


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
        tolerations=[{"key": "amd.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
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
    # Helm merges maps with the defaults (null removes a default key).
    assert pod["nodeSelector"] == {"accel": "yes", "kubernetes.io/os": "linux"}
    assert pod["affinity"] == affinity
    assert pod["containers"][0]["resources"]["limits"] == {"memory": "1Gi"}
    assert pod["containers"][0]["ports"][0]["containerPort"] == 9400
    assert docs["Service"]["spec"]["ports"][0]["port"] == 9400
    config = yaml.safe_load(docs["ConfigMap"]["data"]["config.yaml"])
    assert config["export"]["otlp"]["endpoint"] == "https://otel.example:4317"
    assert "ServiceMonitor" not in docs and "PrometheusRule" not in docs


def test_default_tolerations_are_the_documented_ones() -> None:
    """Every taint is tolerated by default (accelerator taints are vendor-specific); values.yaml
    and docs/deploy.md say so, and how to keep the agent off control-plane nodes."""
    pod = daemonset(render_helm())["spec"]["template"]["spec"]
    assert pod["tolerations"] == [{"operator": "Exists"}]
    for doc in (CHART / "values.yaml", ROOT / "docs" / "deploy.md"):
        assert "node-role.kubernetes.io/control-plane" in doc.read_text(), doc


def probes(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    agent = agent_of(docs)
    return {k: agent[k]["httpGet"] for k in ("startupProbe", "readinessProbe", "livenessProbe")}


def test_probes_use_health_endpoints_even_without_metrics() -> None:
    """Contract B: /healthz and /readyz on the metrics port, served with /metrics off too."""
    for values in ({}, VALUE_SETS["no /metrics, no policy"]):
        found = probes(render_helm(values))
        assert found["livenessProbe"] == {"path": "/healthz", "port": "metrics", "scheme": "HTTP"}
        assert found["readinessProbe"]["path"] == found["startupProbe"]["path"] == "/readyz"
        assert agent_of(render_helm(values))["ports"][0]["name"] == "metrics"


def test_probes_use_https_when_tls_is_on() -> None:
    by_secret = render_helm(VALUE_SETS["tls and auth"])
    by_files = render_helm(
        {"config": {"export": {"prometheus": {"tls": {"cert_file": "/c", "key_file": "/k"}}}}}
    )
    for docs in (by_secret, by_files):
        assert {p["scheme"] for p in probes(docs).values()} == {"HTTPS"}


def test_tls_and_auth_come_from_secrets_with_the_agents_key_names() -> None:
    docs = render_helm(VALUE_SETS["tls and auth"])
    prometheus = agent_config(docs)["export"]["prometheus"]
    assert prometheus["tls"] == {
        "cert_file": "/etc/kubenpu/tls/tls.crt",
        "key_file": "/etc/kubenpu/tls/tls.key",
    }
    assert prometheus["auth"] == {
        "username": "prom",
        "password_file": "/etc/kubenpu/auth/password",
        "bearer_token_file": "/etc/kubenpu/auth/token",
    }
    pod = daemonset(docs)["spec"]["template"]["spec"]
    secrets = {v["name"]: v["secret"] for v in pod["volumes"] if "secret" in v}
    assert secrets["tls"]["secretName"] == "metrics-tls"
    assert [i["key"] for i in secrets["auth"]["items"]] == ["password", "token"]
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["tls"]["mountPath"] == "/etc/kubenpu/tls" and mounts["tls"]["readOnly"]
    assert mounts["auth"]["mountPath"] == "/etc/kubenpu/auth" and mounts["auth"]["readOnly"]


def test_attribution_and_prometheus_keys_reach_the_agents_config() -> None:
    config = agent_config(render_helm())
    assert config["attribution"]["pending_seconds"] == 120
    assert config["attribution"]["cri"]["concurrency"] == 4
    prometheus = config["export"]["prometheus"]
    assert (prometheus["max_connections"], prometheus["read_timeout_seconds"]) == (64, 10)
    assert prometheus["tls"] == {"cert_file": "", "key_file": ""}
    assert prometheus["auth"] == {"username": "", "password_file": "", "bearer_token_file": ""}


def test_otlp_headers_come_from_a_secret() -> None:
    docs = render_helm(VALUE_SETS["otlp"])
    env = {e["name"]: e for e in agent_of(docs)["env"]}
    ref = {"secretKeyRef": {"name": "otlp-auth", "key": "headers"}}
    assert env["OTEL_EXPORTER_OTLP_HEADERS"]["valueFrom"] == ref
    assert agent_config(docs)["export"]["otlp"]["headers"] == {}
    assert "OTEL_EXPORTER_OTLP_HEADERS" not in {e["name"] for e in agent_of(render_helm())["env"]}


def test_image_is_pulled_by_digest_when_one_is_given() -> None:
    assert agent_of(render_helm())["image"] == "kubenpu/kubenpu-agent:0.1.0"
    pinned = agent_of(render_helm({"image": {"digest": DIGEST}}))["image"]
    assert pinned == f"kubenpu/kubenpu-agent:0.1.0@{DIGEST}"


def admitted(policy: dict[str, Any], namespace: str, port: str = "metrics") -> bool:
    """Whether the policy admits a pod of `namespace` (labelled as Kubernetes labels every
    namespace, kubernetes.io/metadata.name) to `port`: the peers the chart writes, namespace
    selectors by matchLabels; any other peer form fails the test."""
    labels = {"kubernetes.io/metadata.name": namespace}
    for rule in policy["ingress"]:
        if {"port": port, "protocol": "TCP"} not in rule["ports"]:
            continue
        for peer in rule["from"]:
            assert set(peer) == {"namespaceSelector"}, f"a peer this check cannot read: {peer}"
            if peer["namespaceSelector"]["matchLabels"].items() <= labels.items():
                return True
    return False


def test_network_policy_admits_the_release_and_monitoring_namespaces_only() -> None:
    """Pods of the release's namespace (docs/top.md: kubenpuctl top run beside the agents) and of
    the monitoring namespaces reach the metrics port; others do not. kubectl exec and
    port-forward connect from inside the agent's pod, which no NetworkPolicy filters."""
    docs = render_helm()
    policy = by_kind(docs)["NetworkPolicy"]["spec"]
    assert (
        policy["podSelector"]["matchLabels"] == daemonset(docs)["spec"]["selector"]["matchLabels"]
    )
    assert policy["policyTypes"] == ["Ingress"]
    assert [admitted(policy, ns) for ns in ("kubenpu", "monitoring", "default")] == [1, 1, 0]
    assert not admitted(policy, "kubenpu", port="other")
    moved = by_kind(
        render_helm(
            {
                "namespaceOverride": "npu",
                "networkPolicy": {"monitoringNamespaces": ["observability"]},
            }
        )
    )["NetworkPolicy"]["spec"]
    assert [admitted(moved, ns) for ns in ("npu", "observability", "monitoring")] == [1, 1, 0]
    peers = [{"namespaceSelector": {"matchLabels": {"team": "observability"}}}]
    (rule,) = by_kind(render_helm({"networkPolicy": {"from": peers}}))["NetworkPolicy"]["spec"][
        "ingress"
    ]
    assert rule["from"][-1:] == peers
    assert "NetworkPolicy" not in by_kind(render_helm(VALUE_SETS["no /metrics, no policy"]))


def test_top_doc_reaches_the_agent_the_way_the_policy_admits() -> None:
    """docs/top.md's cluster commands: exec and port-forward into the agent's pod (inside it, so
    no policy applies) on the chart's metrics port, or a pod in the agent's namespace, which the
    policy admits; never a node's address, which it does not."""
    text = (ROOT / "docs" / "top.md").read_text()
    section = text[text.index("## Reaching an agent in a cluster") :].split("\n## ")[0]
    port = helm_values()["config"]["export"]["prometheus"]["port"]
    assert 'kubectl -n kubenpu exec -it "$POD" -c agent -- kubenpuctl top' in section
    assert agent_of(render_helm())["name"] == "agent"
    assert f"http://localhost:{port}/metrics" in section  # kubenpuctl top's default, in the pod
    forwarded = re.search(r'port-forward "\$POD" \d+:(\d+)', section)
    assert forwarded and int(forwarded.group(1)) == port
    ns = re.search(r"kubectl -n (\S+) run top .*?--url http://POD_IP:(\d+)/", section, re.S)
    assert ns and int(ns.group(2)) == port
    assert admitted(by_kind(render_helm())["NetworkPolicy"]["spec"], ns.group(1))
    assert "--url http://NODE:8080/metrics` or the pod's IP" in section  # named as refused
    assert not admitted(by_kind(render_helm())["NetworkPolicy"]["spec"], "default")


def test_monitoring_objects_follow_their_values() -> None:
    values = helm_values(serviceMonitor__enabled=True, prometheusRule__enabled=True)
    values["serviceMonitor"]["labels"] = {"release": "kube-prometheus-stack"}
    docs = by_kind(render_helm(values))
    sm, service = docs["ServiceMonitor"], docs["Service"]
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert sm["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert sm["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]
    assert docs["PrometheusRule"]["spec"] == load_yaml(CHART / "files" / "rules.yaml")


# --- tests: the common knobs ---------------------------------------------------------------------


def test_the_common_knobs_reach_the_objects() -> None:
    docs = render_helm(KNOBS)
    objects = by_kind(docs)
    for doc in docs:
        assert doc["metadata"]["namespace"] == "observability", doc["kind"]
    ds, service = objects["DaemonSet"], objects["Service"]
    # the release's name contains nameOverride: the objects keep the release's name
    assert ds["metadata"]["name"] == "kubenpu"
    assert ds["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"] == "npu"
    pod = ds["spec"]["template"]
    assert pod["metadata"]["labels"]["team"] == "ml"
    assert "team" not in ds["spec"]["selector"]["matchLabels"]
    assert ds["spec"]["updateStrategy"] == {"type": "OnDelete"}
    assert pod["spec"]["runtimeClassName"] == "runc"
    assert pod["spec"]["securityContext"] == {"seLinuxOptions": {"type": "spc_t"}}
    assert {"name": "ca", "configMap": {"name": "otlp-ca"}} in pod["spec"]["volumes"]
    assert KNOBS["extraVolumeMounts"][0] in pod["spec"]["containers"][0]["volumeMounts"]
    assert "clusterIP" not in service["spec"] and service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["ports"][0]["port"] == 9400
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"
    assert service["metadata"]["annotations"] == {"a": "b"}
    assert service["metadata"]["labels"]["tier"] == "node"
    (endpoint,) = objects["ServiceMonitor"]["spec"]["endpoints"]
    assert endpoint["scrapeTimeout"] == "5s"
    assert endpoint["metricRelabelings"] == KNOBS["serviceMonitor"]["metricRelabelings"]
    # the job label the alerts select on stays "kubenpu" whatever the name
    job_label = objects["ServiceMonitor"]["spec"]["jobLabel"]
    assert service["metadata"]["labels"][job_label] == "kubenpu"
    assert 'job="kubenpu"' in (CHART / "files" / "rules.yaml").read_text()


def test_object_names_follow_the_release_and_the_overrides() -> None:
    def names(values: dict[str, Any], release: str = "kubenpu") -> set[str]:
        proc = helm("template", release, str(CHART), "--namespace", "ns", values=values)
        assert proc.returncode == 0, proc.stderr
        return {d["metadata"]["name"] for d in yaml.safe_load_all(proc.stdout) if d}

    assert names({}) == {"kubenpu", "kubenpu-config", "kubenpu-uninstall"}
    assert "gpu-kubenpu" in names({}, release="gpu")
    assert "kubenpu-prod" in names({}, release="kubenpu-prod")
    assert "agents" in names({"fullnameOverride": "agents"}, release="gpu")
    assert "Service" not in by_kind(render_helm({"service": {"enabled": False}}))


def test_defaults_fit_a_first_install() -> None:
    """system-node-critical, a memory request sized for the CO-RE default (the BCC fallback's
    compile raises it), and a tolerations example that is not one vendor's GPU only."""
    pod = daemonset(render_helm())["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "system-node-critical"
    core = pod["containers"][0]["resources"]
    bcc = agent_of(render_helm(VALUE_SETS["bcc fallback"]))["resources"]
    mib = lambda q: int(q.removesuffix("Mi"))  # noqa: E731
    # docs/performance.md: the CO-RE agent's RSS is 61-66 MiB, BCC's 212-217 MiB
    assert 66 < mib(core["requests"]["memory"]) < 212 < mib(bcc["requests"]["memory"])
    assert mib(core["limits"]["memory"]) < mib(bcc["limits"]["memory"])
    values = (CHART / "values.yaml").read_text()
    assert "nvidia.com/gpu" not in values and "gpu.intel.com/i915" in values


def test_notes_say_how_to_check_the_install() -> None:
    proc = helm("install", "--dry-run", "kubenpu", str(CHART), "-n", "kubenpu")
    assert proc.returncode == 0, proc.stderr
    notes = proc.stdout.split("NOTES:", 1)[1]
    assert "kubectl -n kubenpu rollout status daemonset/kubenpu" in notes
    assert "exec daemonset/kubenpu -- kubenpuctl top --once --url http://localhost:8080" in notes
    assert "port-forward daemonset/kubenpu 8080:8080" in notes
    assert "helm show readme kubenpu --version 0.1.0" in notes


def test_helm_show_readme_of_the_packaged_chart_has_the_install_and_troubleshooting(
    tmp_path: Path,
) -> None:
    """What a user who pulled the chart from a registry gets: it was empty."""
    tool = str(k8s_tools() / "helm")
    subprocess.run([tool, "package", str(CHART), "-d", str(tmp_path)], check=True, timeout=60)
    [package] = tmp_path.glob("kubenpu-*.tgz")
    shown = subprocess.run(
        [tool, "show", "readme", str(package)], capture_output=True, text=True, timeout=60
    )
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("# KubeNPU\n")
    for heading in ("## Install", "#### No capabilities", "#### Refused with every capability"):
        assert f"\n{heading}\n" in shown.stdout, heading


# --- tests: a config change rolls the agents ------------------------------------------------------

OTLP_ON = {"config": {"export": {"otlp": {"enabled": True}}}}


def pod_template(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return daemonset(docs)["spec"]["template"]


def test_a_config_change_rolls_the_agents(kustomizers: dict, tmp_path: Path) -> None:
    """helm upgrade --set config...: the pod template changes (checksum/config), so the
    DaemonSet rolls; a change elsewhere leaves the checksum alone. Tanka renders the chart;
    Kustomize's configMapGenerator renames the ConfigMap the pod template names."""
    before, after = pod_template(render_helm()), pod_template(render_helm(OTLP_ON))
    checksum = lambda t: t["metadata"]["annotations"]["checksum/config"]  # noqa: E731
    assert before != after and checksum(before) != checksum(after)
    assert checksum(pod_template(render_helm({"podLabels": {"a": "b"}}))) == checksum(before)
    tanka_on = tanka(TANKA_LIB + " { _config+:: " + json.dumps(OTLP_ON) + " }")
    assert checksum(pod_template(tanka(TANKA_LIB))) == checksum(before)
    assert checksum(pod_template(tanka_on)) == checksum(after)

    changed = tmp_path / "kustomize"
    shutil.copytree(KUSTOMIZE, changed)
    config = changed / "base" / "config.yaml"
    config.write_text(config.read_text().replace("log_level: info", "log_level: debug"))
    for tool, build in kustomizers.items():
        one = pod_template(docs_of(build(KUSTOMIZE / "base")))
        two = pod_template(docs_of(build(changed / "base")))
        names = [
            v["configMap"]["name"]
            for t in (one, two)
            for v in t["spec"]["volumes"]
            if "configMap" in v
        ]
        assert names[0] != names[1] and unhashed(names[0]) == unhashed(names[1]), tool
        assert "annotations" not in one["metadata"], "a stale checksum in the Kustomize base"


# --- tests: uninstall leaves nothing --------------------------------------------------------------


def test_uninstall_hook_runs_the_uninstall_on_every_agent_node() -> None:
    """pre-delete: a DaemonSet on the agent's nodes whose init container runs
    `kubenpu-agent --uninstall --pin-dir <pin_dir>` (no config file, no capability), ready once
    it ran; a Job (the only thing Helm waits for) waits for every node; the Job may read that one
    DaemonSet and nothing else."""
    docs = render_helm({"tolerations": [{"key": "amd.com/gpu", "operator": "Exists"}]}, hooks=True)
    hook = hooks(docs)
    agent_pod = daemonset(docs)["spec"]["template"]["spec"]
    ds = hook["DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    for key in ("nodeSelector", "tolerations", "priorityClassName"):
        assert pod[key] == agent_pod[key], key
    (init,) = pod["initContainers"]
    pin_dir = agent_config(docs)["probe"]["pin_dir"]
    assert init["command"] == ["kubenpu-agent", "--uninstall", "--pin-dir", pin_dir]
    assert init["image"] == agent_pod["containers"][0]["image"]
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert init["volumeMounts"] == [
        {"name": "bpffs", "mountPath": BPFFS, "mountPropagation": "HostToContainer"}
    ]
    assert pod["volumes"] == [{"name": "bpffs", "hostPath": {"path": BPFFS, "type": "Directory"}}]
    (done,) = pod["containers"]
    assert "volumeMounts" not in done and not pod["automountServiceAccountToken"]
    # selectors apart: neither DaemonSet (nor the Service) adopts the other's pods
    agent_selector = daemonset(docs)["spec"]["selector"]["matchLabels"]
    assert not agent_selector.items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    job = hook["Job"]
    assert (
        not ds["spec"]["selector"]["matchLabels"].items()
        <= job["spec"]["template"]["metadata"]["labels"].items()
    )
    (wait,) = job["spec"]["template"]["spec"]["containers"]
    assert wait["command"][:5] == [
        "python3",
        "-m",
        "kubenpu.cli.rollout",
        "kubenpu",
        ds["metadata"]["name"],
    ]
    assert wait["securityContext"]["runAsNonRoot"] is True
    assert hook["Role"]["rules"] == [
        {
            "apiGroups": ["apps"],
            "resources": ["daemonsets"],
            "resourceNames": [ds["metadata"]["name"]],
            "verbs": ["get"],
        }
    ]
    weight = lambda d: int(d["metadata"]["annotations"]["helm.sh/hook-weight"])  # noqa: E731
    assert weight(hook["ServiceAccount"]) < weight(ds) < weight(job)
    for doc in hook.values():
        assert doc["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete"
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    assert hooks(render_helm({"config": {"probe": {"pin_dir": ""}}}, hooks=True)) == {}
    assert hooks(render_helm({"uninstallHook": {"enabled": False}}, hooks=True)) == {}


def test_kustomize_and_tanka_leave_the_hook_out_and_ship_it_apart(
    kustomizers: dict, tmp_path: Path
) -> None:
    """tk and kubectl apply would run a hook at once: the Tanka library drops it, the Kustomize
    base has none, and deploy/kustomize/uninstall is the hook's DaemonSet without Helm's
    annotations, for `kubectl apply -k` after the agents are gone (docs/upgrade.md)."""
    assert not [d for d in tanka(TANKA_LIB) if is_hook(d) or "uninstall" in d["metadata"]["name"]]
    hook = hooks(render_helm(hooks=True))["DaemonSet"]
    del hook["metadata"]["annotations"]
    for tool, build in kustomizers.items():
        assert not [d for d in kustomize(build, tmp_path) if "uninstall" in d["metadata"]["name"]]
        assert docs_of(build(KUSTOMIZE / "uninstall")) == [hook], tool
    doc = (ROOT / "docs" / "upgrade.md").read_text()
    assert "kubectl apply -k deploy/kustomize/uninstall" in doc
    assert "kubectl -n kubenpu rollout status daemonset/kubenpu-uninstall" in doc


# --- tests: alerts and dashboards ----------------------------------------------------------------


def rule_groups() -> dict[str, Any]:
    return load_yaml(CHART / "files" / "rules.yaml")


def test_alert_rules_name_the_agents_alerts() -> None:
    """One rules file (the chart's); the other installers render the chart's PrometheusRule."""
    alerts = {r["alert"] for g in rule_groups()["groups"] for r in g["rules"] if "alert" in r}
    assert {"KubeNPUAgentDown", "KubeNPUEventsDropped", "KubeNPUAttributionFailing"} <= alerts


ALERT_NAME = re.compile(r"\bKube[Nn][Pp][Uu][A-Z]\w*")  # any casing of the prefix


def alert_mentions(paths: list[Path]) -> dict[str, set[str]]:
    """Every alert-like name in the given files (KubeNPU..., or a mis-cased Kubenpu...)."""
    return {str(p.relative_to(ROOT)): set(ALERT_NAME.findall(p.read_text())) for p in paths}


def test_every_alert_is_spelled_as_the_rules_name_it() -> None:
    """One spelling: each KubeNPU... alert a doc or an installer names is one the rules define
    (a `Kubenpu...` spelling, as docs/metrics.md once had, is no alert)."""
    alerts = {r["alert"] for g in rule_groups()["groups"] for r in g["rules"] if "alert" in r}
    files = [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]
    files += [p for p in DEPLOY.rglob("*") if p.suffix in (".yaml", ".md", ".txt", ".jsonnet")]
    unknown = {f: names - alerts for f, names in alert_mentions(files).items() if names - alerts}
    assert unknown == {}


def test_promtool_checks_the_prometheusrule(
    tools: Path, tmp_path: Path, every_render: dict
) -> None:
    rule = by_kind(every_render["helm all options"])["PrometheusRule"]
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(rule["spec"]))
    count = sum(len(g["rules"]) for g in rule["spec"]["groups"])
    assert count >= 11  # every alert of files/rules.yaml
    assert f"SUCCESS: {count} rules found" in run(tools / "promtool", "check", "rules", rules)


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


def test_the_collector_gives_remote_write_the_scrapes_names() -> None:
    """Remote write feeds the dashboards, which query /metrics' names: the transform renames
    each hw.* metric to its Prometheus source name (Spec.prometheus; an NPU's name too), sets
    each label from its semconv attribute (K8S_ATTRIBUTES, HW_ATTRIBUTES), then drops those."""
    config = load_yaml(DEPLOY / "otel" / "collector.yaml")
    pipeline = config["service"]["pipelines"]["metrics"]
    assert "transform/prometheus_labels" in pipeline["processors"]
    metric, datapoint = config["processors"]["transform/prometheus_labels"]["metric_statements"]
    assert metric["context"] == "metric" and datapoint["context"] == "datapoint"
    renamed = [(s.prometheus, name) for s in SPECS if s.prometheus for name in (s.name, s.npu)]
    assert metric["statements"] == [
        f'set(name, "{ours}") where name == "{theirs}"' for ours, theirs in renamed if theirs
    ]
    assert {theirs for _, theirs in renamed if theirs.startswith("hw.")} == {
        s.name for s in SPECS if s.name.startswith("hw.")
    }
    *sets, drop = datapoint["statements"]
    names = {**K8S_ATTRIBUTES, **HW_ATTRIBUTES}
    assert sets == [
        f'set(attributes["{ours}"], attributes["{theirs}"]) where attributes["{theirs}"] != nil'
        for ours, theirs in names.items()
    ]
    pattern = re.fullmatch(r'delete_matching_keys\(attributes, "(.*)"\)', drop)
    assert pattern is not None
    regex = pattern[1].replace("\\\\", "\\")  # the OTTL string's escapes
    kept = ["k8s.node.name", "hw.id", "hw.type", "hw.vendor", "hw.parent", "hw.model"]
    assert {k for k in [*names.values(), *kept] if re.search(regex, k)} == set(names.values())


def dockerfile() -> list[tuple[str, str]]:
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines()]
    return [tuple(line.split(None, 1)) for line in lines if line and not line.startswith("#")]


def test_dockerfile_builds_the_agent_image_as_specified() -> None:
    """Static checks of the Dockerfile; `make image` builds it, test_image_vm.py runs it."""
    steps = dockerfile()
    # the CO-RE objects are compiled in a first stage; the agent's stage has no compiler
    assert steps[0] == ("FROM", "debian:trixie-slim AS bpf")
    stages = [i for i, (op, _) in enumerate(steps) if op == "FROM"]
    assert [steps[i] for i in stages] == [
        ("FROM", "debian:trixie-slim AS bpf"),
        ("FROM", "debian:trixie-slim AS venv"),
        ("FROM", "debian:trixie-slim"),
    ]
    build = " ".join(arg for op, arg in steps[: stages[1]] if op == "RUN")
    assert "clang-19 libbpf-dev" in build and "scripts/bpf.sh /objects" in build
    # the venv is built in its own stage, pip and python3-venv left there
    venv = " ".join(arg for op, arg in steps[stages[1] : stages[2]] if op == "RUN")
    assert "venv --system-site-packages /opt/kubenpu" in venv
    assert '/opt/kubenpu/bin/pip install --no-cache-dir --no-compile ".[agent]"' in venv
    assert "/opt/kubenpu/bin/pip uninstall --yes pip" in venv
    runs = " ".join(arg for op, arg in steps[stages[2] :] if op == "RUN")
    assert re.search(
        r"apt-get install -y --no-install-recommends python3 libbpf1 ca-certificates\s+"
        r'\$\(if \[ "\$BCC" = true \]; then echo python3-bpfcc; fi\)',
        runs,
    )
    assert "clang" not in runs and "python3-venv" not in runs  # no LLVM, no pip in the image
    assert ("COPY", "--from=venv /opt/kubenpu/ /opt/kubenpu/") in steps[stages[2] :]
    assert ("ARG", "BCC=false") in steps
    entry = [json.loads(arg) for op, arg in steps if op == "ENTRYPOINT"]
    assert entry == [["kubenpu-agent", "--config", "/etc/kubenpu/config.yaml"]]
    allowed = (ROOT / ".dockerignore").read_text().splitlines()
    for op, arg in steps:
        if op == "COPY" and not arg.startswith("--from="):
            *sources, _ = arg.split()
            for source in sources:
                assert (ROOT / source).exists(), source
                assert f"!{source}" in allowed, f".dockerignore hides {source}"


def readme_docker_run() -> list[str]:
    """The README's `docker run` command, as the shell splits it."""
    lines = (ROOT / "README.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("docker run "))
    command = ""
    for line in lines[start:]:
        command += line.removesuffix("\\") + " "
        if not line.endswith("\\"):
            return shlex.split(command)
    raise AssertionError("unterminated docker run")


def docker_flags(argv: list[str]) -> dict[str, list[str]]:
    flags: dict[str, list[str]] = {}
    args = iter(argv[2:-1])  # docker run ... IMAGE
    for arg in args:
        value = "" if arg in ("-d", "--read-only") else next(args)
        flags.setdefault(arg, []).append(value)
    return flags


def test_the_default_needs_no_headers_and_bcc_fallback_adds_them() -> None:
    ds = daemonset(render_helm())
    check_agent_daemonset(ds, "/run/containerd")  # no /lib/modules, no /usr/src
    assert agent_config(render_helm())["probe"]["loader"] == "core"
    objects = render_helm({"bccFallback": True})
    check_agent_daemonset(daemonset(objects), "/run/containerd", headers=True)
    assert agent_config(objects)["probe"]["loader"] == "auto"
    (agent,) = daemonset(objects)["spec"]["template"]["spec"]["containers"]
    assert agent["image"].endswith(":0.1.0-bcc")  # the image variant with BCC and LLVM


def test_readme_quick_test_runs_the_agent_as_the_chart_does() -> None:
    argv = readme_docker_run()
    flags = docker_flags(argv)
    pod = daemonset(render_helm())["spec"]["template"]["spec"]
    (agent,) = pod["containers"]
    sc = agent["securityContext"]
    assert "--privileged" not in flags
    assert flags["--cap-drop"] == sc["capabilities"]["drop"]
    assert flags["--cap-add"] == sc["capabilities"]["add"]
    assert ("--read-only" in flags) is sc["readOnlyRootFilesystem"]
    mounts = {m["name"]: m for m in agent["volumeMounts"]}
    scratch = {mounts[v["name"]]["mountPath"] for v in pod["volumes"] if "emptyDir" in v}
    assert set(flags["--tmpfs"]) == scratch
    chart_binds = {
        f"{v['hostPath']['path']}:{mounts[v['name']]['mountPath']}:ro"
        for v in pod["volumes"]
        # without the node's bpffs the agent does not pin (it logs so): a quick test leaves nothing
        if "hostPath" in v and v["hostPath"]["path"] != BPFFS
    }
    assert set(flags["-v"]) == chart_binds
    assert flags["-e"] == ["K8S_NODE_NAME=$(hostname)"]
    port = agent["ports"][0]["containerPort"]
    assert flags["-p"] == [f"{port}:{port}"]
    build = next(
        line for line in (ROOT / "README.md").read_text().splitlines() if "docker build" in line
    )
    assert f"-t {argv[-1]} " in build


# --- tests: install hygiene ---------------------------------------------------------------------

DEB822 = """\
Types: deb
URIs: http://security.mirror.example/debian-security
Suites: bookworm-security
Components: main

Types: deb
URIs: https://vendor.example/apt
Suites: cloud-sdk-bookworm
Components: main

Types: deb
# a comment: http://elsewhere.example/debian
URIs: http://mirror.example/debian/
Suites: bookworm bookworm-updates
Components: main
"""


def debian_mirror(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != "KUBENPU_DEBIAN_MIRROR"}
    return subprocess.run(
        ["bash", "-c", ". scripts/env.sh && debian_mirror"],
        cwd=ROOT,
        env={**base, "KUBENPU_CACHE": str(tmp_path / "cache"), **env},
        capture_output=True,
        text=True,
    )


@pytest.mark.parametrize(
    ("files", "want"),
    [
        ({"sources.list.d/debian.sources": DEB822}, "http://mirror.example/debian"),
        (
            {
                "sources.list": "# deb http://old.example/debian bookworm main\n"
                "deb [arch=amd64 signed-by=/k.gpg] http://local.example/debian trixie main\n",
                "sources.list.d/vendor.list": "deb https://vendor.example/apt stable main\n",
            },
            "http://local.example/debian",
        ),
    ],
)
def test_scripts_take_the_debian_mirror_from_the_hosts_apt_sources(
    tmp_path: Path, files: dict[str, str], want: str
) -> None:
    etc = tmp_path / "apt"
    for name, text in files.items():
        (etc / name).parent.mkdir(parents=True, exist_ok=True)
        (etc / name).write_text(text)
    assert debian_mirror(tmp_path, KUBENPU_APT_ETC=str(etc)).stdout == want + "\n"
    override = debian_mirror(
        tmp_path, KUBENPU_APT_ETC=str(etc), KUBENPU_DEBIAN_MIRROR="http://env.example/debian/"
    )
    assert override.stdout == "http://env.example/debian\n"


def test_scripts_say_how_to_set_a_mirror_when_apt_names_none(tmp_path: Path) -> None:
    (tmp_path / "apt").mkdir()
    proc = debian_mirror(tmp_path, KUBENPU_APT_ETC=str(tmp_path / "apt"))
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr == (
        "env.sh: no Debian mirror in the host's APT sources; set KUBENPU_DEBIAN_MIRROR\n"
    )


def test_the_repo_names_no_package_mirror_host() -> None:
    hosts = r"([a-z0-9-]+\.)*(debian\.org|ubuntu\.com|debian\.net)"
    proc = subprocess.run(
        ["git", "grep", "-nIE", hosts],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.stdout == ""


@pytest.mark.parametrize(
    ("endpoint", "socket_dir", "renders"),
    [
        ("unix:///var/run/crio/crio.sock", "/run/containerd", False),  # CRI-O, dir forgotten
        ("unix:///var/run/crio/crio.sock", "/var/run/crio", True),
        ("unix:///var/run/crio/crio.sock", "/var/run/crio/", True),
        ("/run/k3s/containerd/containerd.sock", "/run/k3s/containerd", True),  # a bare path
        ("unix:///run/containerd-2/containerd.sock", "/run/containerd", False),  # a mere prefix
    ],
)
def test_a_cri_socket_outside_the_mounted_directory_fails_the_render(
    endpoint: str, socket_dir: str, renders: bool
) -> None:
    """A CRI-O endpoint without criSocketDir once rendered a pod whose socket was outside every
    mount: the agent then held every pod's calls for attribution.pending_seconds."""
    values = helm_values(criSocketDir=socket_dir, config__attribution__cri__endpoint=endpoint)
    proc = helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE, values=values)
    assert (proc.returncode == 0) == renders, proc.stderr
    if not renders:
        assert f"config.attribution.cri.endpoint {endpoint} is outside criSocketDir" in proc.stderr


def test_upgrade_md_says_the_packaged_charts_size_within_a_tenth(tmp_path: Path) -> None:
    """The size upgrade.md quoted had gone stale (15,480 bytes said, 19,103 packaged)."""
    said = re.search(r"the chart ([\d,]+) bytes", (ROOT / "docs" / "upgrade.md").read_text())
    assert said is not None
    tool = str(k8s_tools() / "helm")
    subprocess.run([tool, "package", str(CHART), "-d", str(tmp_path)], check=True, timeout=60)
    [package] = tmp_path.glob("kubenpu-*.tgz")
    assert int(said[1].replace(",", "")) == pytest.approx(package.stat().st_size, rel=0.1)


# --- tests: every alert and panel on both paths --------------------------------------------------


def both_paths() -> dict[str, Series]:
    """The golden payload (tests/test_payload_golden.py holds it to the agent's output) as
    Prometheus stores it when scraped through the ServiceMonitor (job, instance, node) and when
    pushed through the shipped Collector."""
    target = {"job": "kubenpu", "instance": "10.0.0.7:9464", "node": "node-a"}
    scraped = scrape_series((TESTDATA / "payload-prometheus.txt").read_text(), target)
    pushed = json.loads((TESTDATA / "payload-otlp-semconv.json").read_text())
    return {
        "scrape": scraped,
        "collector": Collector(DEPLOY / "otel" / "collector.yaml").series(pushed),
    }


def test_every_alert_and_panel_finds_its_series_on_both_paths(tools: Path) -> None:
    """Each selector of each alert, recording rule and panel selects series, and each label it
    groups or joins on is theirs, whether Prometheus scraped the agent or the Collector wrote
    its push: hw.status was kubenpu_device_status_ratio on /metrics and kubenpu_device_status
    through the Collector, so KubeNPUDeviceFailed could never fire on pushed data."""
    paths = both_paths()
    queries = [
        q.replace("$__rate_interval", "5m").replace("$node", ".*").replace("$namespace", ".*")
        for q in every_query(tools)
    ]
    gaps = {path: {q: unmatched(q, series) for q in queries} for path, series in paths.items()}
    assert gaps["collector"] == gaps["scrape"]
    # The golden payload's one throttle point is the `status` reason, which that panel leaves out.
    assert {g for found in gaps["scrape"].values() for g in found} == {
        'kubenpu_device_throttle_ratio{node=~".*", reason!="status"}',
    }


def test_the_path_check_can_fail() -> None:
    paths = both_paths()
    assert unmatched('kubenpu_device_status_ratio{state="failed"}', paths["collector"]) == [
        'kubenpu_device_status_ratio{state="failed"}'
    ]
    assert unmatched("sum by (node, pod) (kubenpu_events_dropped_total)", paths["scrape"]) == [
        "label pod"
    ]
    # A Collector without the exporter's suffixes names the counter otherwise.
    collector = Collector(DEPLOY / "otel" / "collector.yaml")
    collector.suffixes = False
    metric = {"name": "kubenpu.ioctl", "unit": "{call}", "sum": {"isMonotonic": True}}
    assert collector.name("kubenpu.ioctl", metric, "sum") == "kubenpu_ioctl"
