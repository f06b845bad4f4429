"""Real receivers, fetched from Debian by scripts/tools.sh: Prometheus 3 scrapes /metrics and
promtool lints it; VictoriaMetrics receives OTLP/HTTP pushes and translates names the Prometheus
way (Debian's Prometheus is built without its OTLP receiver, #1080354). Both are queried through
the Prometheus HTTP API: names, labels and values must match exactly, and match each other."""

from __future__ import annotations

import subprocess
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
from helpers import (
    VGEM_INFO,
    VGEM_ROW,
    Prometheus,
    calls,
    free_port,
    make_config,
    receiver_tools,
    run_server,
    scrape,
    start_telemetry,
)

from kubenpu import export
from kubenpu.kernel import abi
from kubenpu.kernel.records import Durations, JobTimes, Key
from kubenpu.metrics.catalogue import (
    ENGINE_COUNTERS,
    K8S_ATTRIBUTES,
    POD_HANGS,
    RESET_VICTIMS,
    SPECS,
    TELEMETRY_SPECS,
    Spec,
)
from kubenpu.metrics.inputs import AllocationState, Held, Where
from kubenpu.metrics.own import (
    CERTIFICATES,
    CRI,
    DEVICES,
    INDEX_REBUILT,
    SOURCE_DURATION,
    SOURCE_FAILED,
    STAMPS,
)
from kubenpu.sources import guard, jobs, telemetry
from kubenpu.sources import wedges as uevents
from kubenpu.sources.allocations import ALLOCATIONS
from kubenpu.sources.calls.attribution import DROPS, DURATIONS, EVENTS, REMOTE, UNNAMED
from kubenpu.sources.usage import ENGINES, GAUGES

pytestmark = pytest.mark.tools
ROOT = Path(__file__).resolve().parent.parent
IOCTL_LABELS = {
    "__name__": "kubenpu_ioctl_total",
    "namespace": "ns",
    "pod": "p",
    "pod_uid": "u-1",
    "container": "c",
    "device": "0000:03:00.0",
    "vendor": "vgem",
    "kind": "submit",
}


def label(name: str, semconv: bool) -> str:
    """A pod label as the receiver holds it: /metrics' own name (and a legacy push's), or the
    receiver's translation of the semconv attribute a push carries (k8s.pod.name is
    k8s_pod_name)."""
    return K8S_ATTRIBUTES.get(name, name).replace(".", "_") if semconv else name


@pytest.fixture(scope="session")
def tools() -> Path:
    return receiver_tools()


def start_prometheus(tools: Path, tmp: Path, scrape_port: int) -> Iterator[Prometheus]:
    port = free_port()
    (tmp / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s}\nscrape_configs:\n- job_name: kubenpu\n"
        f"  static_configs:\n  - targets: ['127.0.0.1:{scrape_port}']\n"
    )
    cmd = [
        str(tools / "prometheus"),
        f"--config.file={tmp / 'prometheus.yml'}",
        f"--storage.tsdb.path={tmp / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    yield from run_server(cmd, port, tmp / "prometheus.log")


def start_victoria_metrics(
    tools: Path, tmp: Path, flags: Iterable[str] = ()
) -> Iterator[Prometheus]:
    port = free_port()
    cmd = [
        str(tools / "victoria-metrics"),
        f"-httpListenAddr=127.0.0.1:{port}",
        f"-storageDataPath={tmp / 'vm'}",
        "-opentelemetry.usePrometheusNaming",
        "-opentelemetry.promoteAllResourceAttributes=false",
        "-search.latencyOffset=0s",
        "-search.disableCache",
        *flags,
    ]
    yield from run_server(cmd, port, tmp / "victoria-metrics.log")


def fill(tel: export.Exporters) -> None:
    m = tel.metrics
    calls(m, "ns", "p", "c", 42, uid="u-1")
    calls(m, "", "", "", 5)
    m.set(UNNAMED, "cri_error", 5)
    m.set(DROPS, "ringbuf_full", 3)
    m.set(EVENTS, "", 47)
    m.set(INDEX_REBUILT, "", 1)
    m.set(CRI, "", (0.004, True))
    m.set(DEVICES, VGEM_INFO["node"], [VGEM_ROW])
    where = Where("ns", "p", "u-1", "c", "0000:03:00.0", "vgem")
    for spec in ENGINE_COUNTERS:
        m.put(ENGINES[spec], where, "render", 2.5)
    m.set(GAUGES, "", ({(where, "render"): 1}, {(where, "vram0", "resident"): 4096}))
    held = Held("ns", "p", "c", "0000:03:00.0", "gpu.intel.com/i915")
    unallocated = {("ns", "q", "c", "0000:03:00.0"): (4, 1)}
    unmapped = {("example.com/x", "unknown_format"): 1}
    m.set(
        ALLOCATIONS,
        "",
        AllocationState({held: 2}, {held: (120.0, 1)}, {held: 60.0}, unallocated, unmapped),
    )
    hw = {"device": "0000:03:00.0", "vendor": "vgem", "hw.id": "0000:03:00.0", "hw.type": "gpu"}
    m.set(telemetry.TELEMETRY, "0000:03:00.0", [(spec, hw, 1.5) for spec in TELEMETRY_SPECS])
    m.set(telemetry.SKIPS, "missing", 1)
    m.set(uevents.RESETS, ("0000:03:00.0", "vgem", "rebind"), 1)
    m.set(uevents.COREDUMPS, ("0000:03:00.0", "vgem"), 1)
    m.set(uevents.SKIPS, "malformed", 1)
    m.put(telemetry.POD_ENERGY_SHARES, where, "", 2_000_000)
    m.set(CERTIFICATES, "", {"export.prometheus.tls.cert_file": 1.9e9})
    m.set(STAMPS, "kernel", 1.8e9)
    m.set(SOURCE_DURATION, "fdinfo", 0.25)
    m.set(SOURCE_FAILED, "fdinfo", 1)
    m.put(DURATIONS, where, "submit", (Key(7, 226, 0, 1), TIMED))
    m.put(REMOTE, where, "submit", (Key(7, 226, 0, 1), 1))
    times = Durations(TIMED.sum_ns, TIMED.slots, ())
    m.put(jobs.JOB_TIMES, where, "gfx_0.0.0", (7, JobTimes(5, 4, times, times)))
    m.set(jobs.LOST, "", {"unmatched": 1, "keys_full": 0})
    m.put(jobs.BEHIND, where, "gfx_0.0.0\nns\nother-0", 2_000_000_000)
    m.put(jobs.IDLE, where, "gfx_0.0.0", 5_000_000)
    m.put(jobs.RESETS[POD_HANGS], where, "", 1)
    m.put(jobs.RESETS[RESET_VICTIMS], where, "", 1)
    m.set(guard.DENIED, "", {("ns", "p", "u-1", "0000:03:00.0", "open", "enforce"): (1, 1)})
    m.set(guard.UNCHECKED_FAMILY, ("0000:03:00.0", "open", "unseen"), 1)
    m.set(guard.POLICY, "", {("ns", "p", "u-1", "0000:03:00.0", "enforce", "denied"): 1})


# Two calls of 2.0 ms (bucket -36, (1.95, 2.32] ms), one of 50 ms (bucket -18, (44.2, 52.6]
# ms), one under 2^-20 s; one of them failed with ETIME.
_SLOTS = dict.fromkeys(range(abi.DURATION_SLOTS), 0) | {0: 1, 45: 2, 63: 1}
TIMED = Durations(54_000_500, tuple(_SLOTS.values()), tuple(int(e == "ETIME") for e in abi.ERRORS))


def expected_names(pushed: bool = False) -> set[str]:
    """/metrics' names; a push is named by the receiver's own translation of the OTel names
    (hw.power is hw_power_watts there, kubenpu_device_power_watts here: docs/metrics.md)."""
    names = {s.translated_name if pushed else s.prometheus_name for s in SPECS}
    # VictoriaMetrics gives a unit-1 UpDownCounter `_ratio` too; Prometheus' translation (and the
    # Collector's, prometheus/otlptranslator) gives it to gauges only: hw_status there.
    vm_only = {s.translated_name: s.translated_name + "_ratio" for s in SPECS if _vm_ratio(s)}
    return {vm_only.get(n, n) for n in names} if pushed else names


def _vm_ratio(spec: Spec) -> bool:
    return spec.unit == "1" and spec.kind == "updowncounter"


def check_series(prom: Prometheus, pushed: bool = False, attributes: str = "semconv") -> None:
    """pushed: named by the receiver's translation; attributes: the push's pod attributes."""
    semconv = pushed and attributes == "semconv"
    pod = label("pod", semconv)
    [ioctl] = prom.wait_for(f'kubenpu_ioctl_total{{{pod}="p"}}')
    # job/instance come from the scrape, scope_* from VictoriaMetrics' OTLP translation.
    added = ("job", "instance", "scope_name", "scope_version")
    labels = {k: v for k, v in ioctl["metric"].items() if k not in added}
    legacy = pushed and attributes == "legacy"  # the old names, no uid
    want = {
        label(k, semconv): v for k, v in IOCTL_LABELS.items() if not (legacy and k == "pod_uid")
    }
    assert labels == want
    assert ioctl["value"][1] == "42"
    [host] = prom.query(f'kubenpu_ioctl_total{{{pod}=""}}')
    assert host["value"][1] == "5"
    [info] = prom.query("kubenpu_device_info")
    assert {k: info["metric"][k] for k in VGEM_INFO} == VGEM_INFO
    assert prom.query('kubenpu_unattributed_calls_total{reason="cri_error"}')[0]["value"][1] == "5"
    assert prom.query('kubenpu_events_dropped_total{reason="ringbuf_full"}')[0]["value"][1] == "3"
    assert prom.query("kubenpu_events_received_total")[0]["value"][1] == "47"
    assert prom.query("kubenpu_cri_request_duration_seconds_count")[0]["value"][1] == "1"
    busy = prom.query(f'kubenpu_engine_busy_seconds_total{{{pod}="p",engine="render"}}')
    assert busy[0]["value"][1] == "2.5"
    memory = prom.query('kubenpu_memory_bytes{region="vram0",state="resident"}')
    assert memory[0]["value"][1] == "4096"
    allocated = prom.query(f'kubenpu_device_allocated{{{pod}="p",resource="gpu.intel.com/i915"}}')
    assert allocated[0]["value"][1] == "2"
    assert prom.query("kubenpu_device_allocated_idle_seconds_total")[0]["value"][1] == "120"
    assert prom.query(f'kubenpu_device_unallocated_calls_total{{{pod}="q"}}')[0]["value"][1] == "4"
    timed = f'{{{pod}="p",kind="submit"}}'
    assert prom.query(f"kubenpu_ioctl_duration_seconds_count{timed}")[0]["value"][1] == "4"
    assert (
        float(prom.query(f"kubenpu_ioctl_duration_seconds_sum{timed}")[0]["value"][1]) == 0.0540005
    )
    etime = prom.query(f'kubenpu_ioctl_errors_total{{{pod}="p",error="ETIME"}}')
    assert etime[0]["value"][1] == "1"
    names = {r["metric"]["__name__"] for r in prom.query('{__name__=~"(kubenpu|hw)_.*"}')}
    histograms = {s.prometheus_name for s in SPECS if s.kind == "histogram"}
    parts = {f"{h}_{s}" for h in histograms for s in ("bucket", "count", "sum")}
    assert names - parts == expected_names(pushed) - set(histograms)
    assert parts <= names


@pytest.mark.parametrize("attributes", ["semconv", "legacy"])
def test_otlp_http_push_into_a_prometheus_api(tools, tmp_path, attributes):
    for vm in start_victoria_metrics(tools, tmp_path):
        env = {
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"{vm.url}/opentelemetry",
            "OTEL_METRICS_EXPORTER": "otlp",
        }
        tel = start_telemetry(
            make_config(
                tmp_path,
                f"export: {{otlp: {{interval_seconds: 3600, attributes: {attributes}}}}}",
                env,
            )
        )
        try:
            fill(tel)
            assert tel.pusher.push()
        finally:
            tel.shutdown()
        check_series(vm, pushed=True, attributes=attributes)


def test_prometheus_scrapes_metrics_and_promtool_is_clean(tools, tmp_path):
    port = free_port()
    tel = start_telemetry(
        make_config(tmp_path, f"export: {{prometheus: {{host: 127.0.0.1, port: {port}}}}}")
    )
    try:
        fill(tel)
        body = scrape(port)
        lint = subprocess.run(
            [str(tools / "promtool"), "check", "metrics"],
            input=body,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert (lint.returncode, lint.stdout, lint.stderr) == (0, "", "")
        for prom in start_prometheus(tools, tmp_path, port):
            check_series(prom)
            assert prom.query('up{job="kubenpu"}')[0]["value"][1] == "1"
            # Classic buckets at every other power of two: 2^-8 s holds the call under 2^-20 s
            # and both of 2 ms; 2^-4 s the 50 ms one too; nothing is re-binned.
            edges = {"0.00390625": "3", "0.0625": "4", "9.5367431640625e-07": "1", "+Inf": "4"}
            for le, n in edges.items():
                [b] = prom.query(f'kubenpu_ioctl_duration_seconds_bucket{{le="{le}"}}')
                assert b["value"][1] == n, le
    finally:
        tel.shutdown()
