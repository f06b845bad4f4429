"""Shared host-side test helpers: test files import these, never each other's private functions."""

from __future__ import annotations

import contextlib
import datetime
import functools
import gc
import importlib.util
import json
import math
import os
import re
import resource
import socket
import subprocess
import sys
import time
import tracemalloc
import urllib.parse
import urllib.request
from array import array
from collections import Counter
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

# --- VM test records: the result.json files tests/vm/*_guest.py write -----------------------------
# /metrics samples in a record are read with the guests' own projections (tests/vm/guestlib.py).
from vm.guestlib import (
    LABELS,
    TESTDRM,
    by_reason,
    client_series,
    ioctl_counts,
    parse,
    usage_series,
)

from kubenpu import config, export
from kubenpu.export.server import HealthChecks
from kubenpu.kernel import abi
from kubenpu.metrics.catalogue import IOCTL, K8S_ATTRIBUTES, Spec
from kubenpu.metrics.inputs import DeviceRow
from kubenpu.metrics.series import Series
from kubenpu.resolve import Attribution
from kubenpu.resolve.resolver import Resolver
from kubenpu.sources.registry import table

ROOT = Path(__file__).resolve().parents[1]
VGEM_ROW = DeviceRow("0000:03:00.0", "vgem", "vgem", "1af4:1050", "0")
# kubenpu_device_info's labels for VGEM_ROW on node "node-a": set(DEVICES, "node-a", [VGEM_ROW])
VGEM_INFO = {
    "device": "0000:03:00.0",
    "vendor": "vgem",
    "driver": "vgem",
    "pci_id": "1af4:1050",
    "numa_node": "0",
    "node": "node-a",
}

__all__ = [
    "TESTDRM",
    "by_reason",
    "client_series",
    "expected_counts",
    "ioctl_counts",
    "otlp_counts",
    "usage_series",
]


def expected_counts(rows: list[dict]) -> dict[tuple, float]:
    """A record's expected kubenpu_ioctl_total series ([{labels, value}]) by their LABELS values."""
    return {tuple(r["labels"]): r["value"] for r in rows}


def otlp_counts(points: list[dict]) -> dict[tuple, float]:
    """The kubenpu.ioctl points an OTLP receiver got ([{attributes, value}]) by LABELS values:
    each pod label read under its semconv attribute (K8S_ATTRIBUTES: the agents' default
    export.otlp.attributes), so the key is ioctl_counts()' of the same series. A pod attribute
    left off (a host process's) is the empty label, as Prometheus reads it."""
    return {
        tuple(p["attributes"].get(K8S_ATTRIBUTES.get(k, k), "") for k in LABELS): p["value"]
        for p in points
    }


# --- tools: the scripts/*.sh that fetch real tools print where they put them on their last line


def timed_calls_mismatches(durations: list[dict], returns: list[dict]) -> list[str]:
    """The kernel's `durations` map (a guest's kernel_durations()) against what drmcall's calls
    returned (guestlib.Returns): every key has exactly its calls in its buckets and its failures
    by error, and a key of one call holds it in the bucket its own duration (the sum) implies,
    by abi.duration_slot, which mirrors the kernel's math. Empty when all hold."""
    found = {tuple(d["key"]): d for d in durations}
    wrong = []
    for want in returns:
        key, got = tuple(want["key"]), found.get(tuple(want["key"]))
        if got is None:
            wrong.append(f"{key}: not timed ({want['calls']} calls)")
            continue
        errors = {e: n for e, n in got["errors"].items() if n}
        if (sum(got["slots"]), errors) != (want["calls"], want["errors"]):
            wrong.append(f"{key}: {sum(got['slots'])} timed, {errors}; want {want}")
        if want["calls"] == 1 and got["slots"][abi.duration_slot(got["sum_ns"])] != 1:
            wrong.append(f"{key}: one call of {got['sum_ns']} ns in {got['slots']}")
    return wrong


def script_output(name: str, timeout: float = 900) -> str:
    """Run scripts/<name>; its last output line (a bounded time: a download may be slow)."""
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / name)], capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, f"scripts/{name} failed:\n{proc.stderr}"
    return proc.stdout.strip().splitlines()[-1]


# --- Helm: the chart rendered by real helm (fetched by scripts/k8s-tools.sh); used by the deploy
# tests and by the VM tests that run the agent with the chart's settings.

CHART = ROOT / "deploy" / "helm" / "kubenpu"
RELEASE = NAMESPACE = "kubenpu"


@functools.cache
def k8s_tools() -> Path:
    """The directory holding helm and kubectl (downloaded once, then cached)."""
    return Path(script_output("k8s-tools.sh"))


def helm_values(**overrides: Any) -> dict[str, Any]:
    """The chart's values.yaml with overrides; `a__b=v` sets values["a"]["b"] = v."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for dotted, value in overrides.items():
        *parents, leaf = dotted.split("__")
        node = values
        for key in parents:
            node = node[key]
        node[leaf] = value
    return values


def helm(*args: str, values: dict[str, Any] | None = None) -> subprocess.CompletedProcess[str]:
    """Run helm with `values` (merged over the chart's defaults by helm itself) on stdin."""
    return subprocess.run(
        [str(k8s_tools() / "helm"), *args, "--values", "-"],
        input=yaml.safe_dump(values or {}),
        capture_output=True,
        text=True,
        timeout=120,
    )


def chart_capabilities(hook: str, fdinfo: bool = False, jobs: bool = False) -> list[str]:
    """The capabilities the chart's DaemonSet adds to the agent container (after drop: ALL), for
    `probe.hook` = hook: the probe's alone, or with config.fdinfo.enabled (the chart's default)
    fdinfo's as well, and with config.probe.jobs the GPU jobs probe's
    (tests/test_least_privilege_vm.py, tests/test_restart_vm.py)."""
    values = helm_values(config__fdinfo__enabled=fdinfo)
    values["config"]["probe"]["hook"] = hook
    values["config"]["probe"]["jobs"] = jobs
    (ds,) = (d for d in render_helm(values) if d["kind"] == "DaemonSet")
    (agent,) = ds["spec"]["template"]["spec"]["containers"]
    caps = agent["securityContext"]["capabilities"]
    assert caps["drop"] == ["ALL"]
    return sorted(caps["add"])


def render_helm(
    values: dict[str, Any] | None = None,
    chart: Path = CHART,
    namespace: str = NAMESPACE,
    hooks: bool = False,
) -> list[dict[str, Any]]:
    """`helm template` of the chart: its objects, parsed; with `hooks`, also its Helm hooks (the
    uninstall hook, which runs only at `helm uninstall`)."""
    no_hooks = [] if hooks else ["--no-hooks"]
    proc = helm("template", RELEASE, str(chart), "--namespace", namespace, *no_hooks, values=values)
    assert proc.returncode == 0, f"helm template: {proc.stderr}"
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


# --- resolve: wait for what a Resolver answers once its CRI lookup (off the caller's thread) ends

T = TypeVar("T")


def uninstall_hook() -> dict:
    """The command of the chart's pre-delete hook and the capabilities its container keeps."""
    hook = next(
        d
        for d in render_helm(hooks=True)
        if d["kind"] == "DaemonSet" and "helm.sh/hook" in d["metadata"].get("annotations", {})
    )
    (init,) = hook["spec"]["template"]["spec"]["initContainers"]
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert "--config" not in init["command"], "the hook needs no config file"
    return {"command": init["command"], "caps": []}


def eventually(check: Callable[[], T | None], what: str, bound: float = 30.0) -> T:
    """check()'s first answer that is not None or False; a generous bound, not a timing claim."""
    deadline = time.monotonic() + bound
    while (value := check()) is None or value is False:
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {bound:g}s")
        time.sleep(0.005)
    return value


def resolved(resolver: Resolver, cgroup_id: int) -> Attribution:
    """Polls resolve() until the pending lookup has answered."""
    return eventually(lambda: resolver.resolve(cgroup_id), f"cgroup {cgroup_id} resolved")


# --- export: a config from YAML text, a free port, a stub Health, Telemetry as the agent starts it


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_config(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> config.Config:
    p = tmp_path / "kubenpu.yaml"
    p.write_text(text)
    return config.load(str(p), {"K8S_NODE_NAME": "node-a", **(env or {})})


@dataclass
class StubHealth:
    """export.server.HealthChecks with answers the test sets (the agent's Health has its own)."""

    is_live: tuple[bool, str] = (True, "")
    is_ready: tuple[bool, str] = (True, "")

    def live(self) -> tuple[bool, str]:
        return self.is_live

    def ready(self) -> tuple[bool, str]:
        return self.is_ready


def start_telemetry(
    cfg: config.Config,
    clock: Callable[[], float] = time.monotonic,
    health: HealthChecks | None = None,
) -> export.Exporters:
    """export.start as the agent calls it: the caller creates the series table. A config that
    leaves the port at its default gets a free one: another test run on the machine may hold
    8080."""
    if cfg.export.prometheus.port == config.PrometheusConfig().port:
        cfg.export.prometheus.port = free_port()
    m = cfg.metrics
    metrics = table(m.series_ttl_seconds, m.max_series, clock)
    return export.start(cfg, metrics, health or StubHealth())


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read().decode()


# --- TLS: a self-signed certificate for localhost and its key, real X.509 files


def certificate(
    tmp_path: Path, name: str, before: datetime.datetime, after: datetime.datetime
) -> tuple[Path, Path]:
    """A self-signed certificate valid from `before` to `after`, and its key: (cert, key)."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(before)
        .not_valid_after(after)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / f"{name}.pem", tmp_path / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


# --- metrics: calls recorded in the series table and the ioctl series they make (one device)


def values(metrics: Series, spec: Spec, skip: Collection[str] = ()) -> dict[tuple, Any]:
    """{the values of a point's labels but `skip`: its value} of spec's points not at zero. An
    empty pod_uid (the tests' pods that have none) is left out too: a test that gives pods
    uids sees them."""
    [points] = [p for s, p in metrics.collect() if s is spec]
    return {
        tuple(v for k, v in p.attrs.items() if k not in skip and (k, v) != ("pod_uid", "")): p.value
        for p in points
        if p.value
    }


def ioctl_key(ns: str, pod: str, c: str, kind: str = "submit", uid: str = "") -> tuple[str, ...]:
    """The labels of the ioctl series calls() makes, in IOCTL.labels order, as values() gives
    them (no pod_uid when it is empty)."""
    return (ns, pod, *((uid,) if uid else ()), c, "0000:03:00.0", "vgem", kind)


def ioctl(ns: str, pod: str, c: str, kind: str = "submit", uid: str = "") -> frozenset:
    """The same series as an OTLP receiver's attribute set (export.otlp.attributes: semconv):
    a pod attribute with no value is left off."""
    labels = (ns, pod, uid, c, "0000:03:00.0", "vgem", kind)
    return frozenset(
        (K8S_ATTRIBUTES.get(k, k), v)
        for k, v in zip(IOCTL.labels, labels, strict=True)
        if v or k not in K8S_ATTRIBUTES
    )


def calls(
    m: Series, ns: str, pod: str, c: str, n: int = 1, kind: str = "submit", uid: str = ""
) -> None:
    m.add_calls(ns, pod, c, "0000:03:00.0", "vgem", kind, n, pod_uid=uid)


# --- receivers: a real Prometheus / VictoriaMetrics (scripts/tools.sh) queried over its HTTP API


@functools.cache
def receiver_tools() -> Path:
    """The directory holding prometheus, promtool and victoria-metrics (fetched once)."""
    return dashboards.tools()


@dataclass
class Prometheus:
    url: str

    def query(self, q: str) -> list[dict]:
        u = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": q})
        with urllib.request.urlopen(u, timeout=10) as r:
            body = json.load(r)
        assert body["status"] == "success", body
        return body["data"]["result"]

    def wait_for(self, q: str, n: int = 1, timeout: float = 60) -> list[dict]:
        """Poll until the query returns n series (bounded; ingestion and scrapes are async)."""
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(q)
            if len(result) >= n or time.monotonic() > deadline:
                return result
            time.sleep(0.2)


def run_server(cmd: list[str], port: int, log: Path) -> Iterator[Prometheus]:
    """Start a server on 127.0.0.1:port, wait (bounded) until it answers, stop it afterwards."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(log, "w"))  # noqa: SIM115
    prom = Prometheus(f"http://127.0.0.1:{port}")
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{prom.url}/-/ready", timeout=2):
                    break
            except OSError:
                assert proc.poll() is None, log.read_text()[-2000:]
                assert time.monotonic() < deadline, f"{cmd[0]} did not become ready"
                time.sleep(0.2)
        yield prom
    finally:
        proc.terminate()
        proc.wait(30)


# --- dashboards: every Grafana query run on a recorded agent (scripts/dashboards.py), and what
# each must return; used on the VM e2e's fresh recording and on the committed one.


def _script(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


script = _script
dashboards = _script("dashboards")
# Labels a query groups by that are empty on the VM, so Prometheus leaves them out of a series.
EMPTY_ON_THE_VM = {
    "numa_node": "QEMU's machine has no NUMA",
    "driver": "vgem is a platform device, with no PCI driver",
    "pci_id": "nor a PCI id",
}
# Panels whose series a recording may predate (made before the agent exported them) or lack (a
# machine without such a sensor): their queries are checked only on a recording that holds a
# sample of the metric.
RECORDED_SINCE = {
    "Power by pod (energy split)": "kubenpu_energy_joules_total",
    "Energy by pod over the time range": "kubenpu_energy_joules_total",
    "Device power and limits": "kubenpu_device_power_watts",
    "Device temperature": "kubenpu_device_temperature_celsius",
    "Device voltage": "kubenpu_device_voltage_volts",
    "Device clocks": "kubenpu_device_frequency_hertz",
    "Device throttling": "kubenpu_device_throttle_ratio",
    "Device memory used and busy (driver)": "kubenpu_device_memory_used_bytes",
    "Telemetry files skipped, by reason": "kubenpu_telemetry_skipped_total",
    "Source read time": "kubenpu_source_read_duration_seconds",
    "Failed source reads": "kubenpu_source_errors_total",
    "GPU job queue wait p99 by pod": "kubenpu_job_wait_duration_seconds_bucket",
    "GPU job run time p99 by pod": "kubenpu_job_run_duration_seconds_bucket",
    "GPU jobs per second by pod": "kubenpu_jobs_total",
    "GPU jobs in flight by pod": "kubenpu_jobs_in_flight",
    "GPU job events lost, by reason": "kubenpu_jobs_lost_total",
    **dict.fromkeys(
        (
            "Share of queue wait behind each pod, per device and ring",
            "Share of queue wait on an idle ring",
            "Queue wait behind each pod, seconds per second",
        ),
        "kubenpu_job_wait_behind_seconds_total",
    ),
    "GPU device resets by pod: hung, and work lost": "kubenpu_pod_device_hangs_total",
    "Calls held for the CRI": "kubenpu_pending_calls",
    # The guard's series exist only with guard.mode on; the remote calls only for a device with
    # a NUMA node (the e2e machine's virtio GPU has none): tests/test_dashboards.py checks them.
    "Device access denied by the guard": "kubenpu_device_access_denied_total",
    "Guard policy": "kubenpu_device_access_policy",
    "Device accesses the guard let through unchecked": "kubenpu_device_access_unchecked_total",
    "Share of calls from another NUMA node, by pod and device": "kubenpu_ioctl_remote_node_total",
    "Probe pinned in bpffs": "kubenpu_probe_pinned",
    **dict.fromkeys(
        (
            "Allocated vs used by pod and device",
            "Calls on devices not allocated",
            "Allocations: unmapped ids and kubelet errors",
        ),
        "kubenpu_device_allocated",
    ),
}
# Panels whose every value must be 0 in a healthy run: drops and errors never happen silently.
ZERO = ("Dropped events by reason", "CRI errors per second", "OTLP export errors")
PODS_PANEL = "Calls per second by pod and kind"  # must show exactly the pods that called
# Panels that must show calls: the recording's pods and host process call in every round.
CALLING = (
    PODS_PANEL,
    "Top pods per device",
    "Calls per second by device and kind",
    "Calls without a pod, by reason",
    "Calls per second per device",
    "Calls per device over the time range, by kind",
    "Events received per second",
)


def query_values(q: Any) -> list[float]:
    points = [p for s in q.result for p in s.get("values", [s.get("value")])]
    return [float(p[1]) for p in points]


def grouped_labels(q: Any) -> set[str]:
    """The labels a panel shows: its legend's, or (a table) its innermost `by (...)`'s."""
    if q.legend_labels:
        return set(q.legend_labels)
    (*_, innermost) = re.findall(r"\bby \(([^)]*)\)", q.expr)
    return {label.strip() for label in innermost.split(",")} - {"le"}


def dashboard_problems(boards: list[Any], record: dict) -> list[str]:
    """What is wrong with the dashboards' variables and queries on `record`, one line each
    ([] when all is well)."""
    by_name = {b.name: b for b in boards}
    problems = [f"{where}: {p}" for b in boards for where, p in query_problems(b, record)]
    namespaces = sorted({ns for ns, _, _ in recorded_pods(record)} | allocated_namespaces(record))
    want = {"kubenpu-pods": {"node": [record["node"]], "namespace": namespaces}}
    want["kubenpu-devices"] = want["kubenpu-agents"] = {"node": [record["node"]]}
    problems += [
        f"{name}: variables {by_name[name].variables} != {variables}"
        for name, variables in want.items()
        if by_name[name].variables != variables
    ]
    shown = shown_pods(by_name["kubenpu-pods"], PODS_PANEL)
    if shown != recorded_pods(record):
        problems.append(f"{PODS_PANEL}: {sorted(shown)}, not {sorted(recorded_pods(record))}")
    return problems


# Shows series only in a recording of an agent with attribution.pod_resources (a kubelet's
# allocations): tests/test_allocations_alert.py checks it on one.
ALLOCATIONS_PANEL = "Allocated vs used by pod and device"


def query_problems(board: Any, record: dict) -> Iterator[tuple[str, str]]:
    for q in board.queries:
        since = RECORDED_SINCE.get(q.panel)
        # A sample, not the HELP and TYPE lines an empty family still has.
        if since and not any(f"\n{since}{{" in scrape["text"] for scrape in record["scrapes"]):
            continue
        where = f"{board.name}: {q.panel} {q.ref}"
        values = query_values(q)
        if not q.result:
            yield where, "no series"
        for series in q.result:
            missing = grouped_labels(q) - series["metric"].keys() - EMPTY_ON_THE_VM.keys()
            if missing or series["metric"].get("node", record["node"]) != record["node"]:
                yield where, f"{series['metric']} lacks {missing or 'the node'}"
        if q.panel in ZERO and any(values):
            yield where, f"not all 0: {values}"
        if q.panel in CALLING and not any(v > 0 for v in values):
            yield where, f"no calls: {values}"
        if not any(math.isfinite(v) for v in values):
            yield where, "no finite value"


def recorded_pods(record: dict) -> set[tuple[str, str, str]]:
    """(namespace, pod, kind) of the pods' call series in two or more scrapes: what a rate shows."""
    seen: Counter[tuple[str, str, str]] = Counter()
    for scrape in record["scrapes"]:
        series = parse(scrape["text"]).get("kubenpu_ioctl_total", [])
        seen.update(
            {(s["labels"]["namespace"], s["labels"]["pod"], s["labels"]["kind"]) for s in series}
        )
    return {key for key, n in seen.items() if n > 1 and key[1]}


def allocated_namespaces(record: dict) -> set[str]:
    """The namespaces of pods holding an allocation: the namespace variable lists them too."""
    return {
        s["labels"]["namespace"]
        for scrape in record["scrapes"]
        for s in parse(scrape["text"]).get("kubenpu_device_allocated", [])
    }


def shown_pods(board: Any, panel: str) -> set[tuple[str, ...]]:
    (q,) = [q for q in board.queries if q.panel == panel]
    return {tuple(s["metric"].get(k, "") for k in ("namespace", "pod", "kind")) for s in q.result}


# --- bpffs: run a check against the real bpf(2) syscall in a private mount namespace, with a bpffs
# of its own (tests/test_pin.py); skipped where the process may not make BPF maps or mounts.

_CLONE_NEWNS = 0x00020000
_MS_REC, _MS_PRIVATE = 0x4000, 0x40000


def _may_make_maps() -> bool:
    import os

    from kubenpu.kernel import abi, bpfsys

    try:
        os.close(bpfsys.map_create(abi.MAP_TYPE_ARRAY, 4, 4, 1, "probe"))
    except bpfsys.BpfError:
        return False
    return True


def in_private_bpffs(check: Callable[[Path], T]) -> T:
    """`check(bpffs_dir)` in a forked child that has its own mount namespace and bpffs; its
    return value (pickled back), or its exception re-raised as AssertionError; pytest.skip
    when namespaces, bpffs or BPF maps are not available here."""
    import ctypes
    import os
    import pickle
    import tempfile
    import traceback

    import pytest

    # Made (and removed) by the parent: the child's mount leaves with its namespace.
    where = Path(tempfile.mkdtemp(prefix="bpffs-"))
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        outcome: tuple[str, Any]
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if (
                libc.unshare(_CLONE_NEWNS) != 0
                or libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None) != 0
                or libc.mount(b"bpf", bytes(where), b"bpf", 0, None) != 0
            ):
                outcome = ("skip", f"no private bpffs: {os.strerror(ctypes.get_errno())}")
            elif not _may_make_maps():
                outcome = ("skip", "BPF maps need privileges this test run lacks")
            else:
                outcome = ("ok", check(where))
        except Exception:
            outcome = ("error", traceback.format_exc())
        os.write(write, pickle.dumps(outcome))
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        data = pipe.read()
    os.waitpid(pid, 0)
    where.rmdir()
    kind, value = pickle.loads(data)
    if kind == "skip":
        pytest.skip(value)
    if kind == "error":
        raise AssertionError(value)
    return value


@contextlib.contextmanager
def out_of_descriptors() -> Iterator[None]:
    """Every open in the block fails with EMFILE, as under a real descriptor flood: the soft
    RLIMIT_NOFILE is lowered to 64 and every free descriptor below it held (restored after)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
    held: list[int] = []
    try:
        with contextlib.suppress(OSError):
            while True:
                held.append(os.open(os.devnull, os.O_RDONLY))
        yield
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def memory_growth(wave: Callable[[int], None], waves: int) -> tuple[array, int]:
    """Run wave(0), then wave(1..waves) under tracemalloc: the memory traced after each of
    those over the baseline after the first, and the peak over it."""
    wave(0)
    gc.collect()
    tracemalloc.start()
    try:
        baseline = tracemalloc.get_traced_memory()[0]
        after = array("q", [0] * waves)  # preallocated: the measurement must not allocate
        for n in range(1, waves + 1):
            wave(n)
            gc.collect()
            after[n - 1] = tracemalloc.get_traced_memory()[0] - baseline
        return after, tracemalloc.get_traced_memory()[1] - baseline
    finally:
        tracemalloc.stop()
