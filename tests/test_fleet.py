"""A simulated fleet through the project's own OTLP exporter into a real VictoriaMetrics: many
agents (one resource each, k8s.node.name node-0...), each node with PODS pods whose every series
kind is on (calls of three kinds, their durations and errors, fdinfo engine time and memory,
energy, an allocation) and two devices' telemetry. Every point pushed must be queryable with its
exact value: no loss. The sizes docs/performance.md#cluster-budget quotes come from
node_figures(); `pytest -s tests/test_fleet.py` prints them with the push's ingest rate.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest
from helpers import make_config, start_telemetry
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from prometheus_client import CollectorRegistry, generate_latest
from test_export_prometheus import TIMED, start_victoria_metrics, tools  # noqa: F401 (fixture)

from kubenpu import export
from kubenpu.export.otlp import metrics_data, otlp_names
from kubenpu.export.prometheus import PrometheusCollector
from kubenpu.kernel.records import Key
from kubenpu.metrics.catalogue import ENGINE_COUNTERS, TELEMETRY_SPECS
from kubenpu.metrics.inputs import AllocationState, Held, Where
from kubenpu.metrics.series import Series
from kubenpu.sources import telemetry
from kubenpu.sources.allocations import ALLOCATIONS
from kubenpu.sources.calls.attribution import DURATIONS
from kubenpu.sources.registry import table
from kubenpu.sources.usage import ENGINES, GAUGES

pytestmark = pytest.mark.tools
NODES = 8
PODS = 100
KINDS = ("submit", "alloc", "wait")
DEVICES = ("0000:03:00.0", "0000:83:00.0")


def fill_node(m: Series, pods: int = PODS) -> None:
    """A node of `pods` pods, half on each device, with every per-pod series kind on."""
    held, capacity, memory = {}, {}, {}
    for i in range(pods):
        device = DEVICES[i % len(DEVICES)]
        where = Where(f"ns{i % 10}", f"p{i}", f"uid-{i}", "main", device, "amdgpu")
        for k, kind in enumerate(KINDS):
            m.add_calls(
                where.namespace, where.pod, "main", device, "amdgpu", kind, 10 + k, where.pod_uid
            )
            m.put(DURATIONS, where, kind, (Key(1000 + i, 226, i, k + 1), TIMED))
        for spec in ENGINE_COUNTERS:
            m.put(ENGINES[spec], where, "gfx", 2.5)
        capacity[where, "gfx"], memory[where, "vram", "resident"] = 1, 4096
        m.put(telemetry.POD_ENERGY_SHARES, where, "", 2_000_000)
        held[Held(where.namespace, where.pod, "main", device, "amd.com/gpu")] = 1
    m.set(GAUGES, "", (capacity, memory))  # one snapshot of every pod's gauges
    m.set(ALLOCATIONS, "", AllocationState(held, {}, {}, {}, {}))
    for device in DEVICES:
        hw = {"device": device, "vendor": "amdgpu", "hw.id": device, "hw.type": "gpu"}
        m.set(telemetry.TELEMETRY, device, [(spec, hw, 1.5) for spec in TELEMETRY_SPECS])


def node_figures(tmp: Path, pods: int) -> dict[str, int]:
    """One node's series (OTLP points; Prometheus samples, a histogram's buckets each one),
    an OTLP push's protobuf bytes and a scrape's text bytes."""
    cfg = make_config(tmp, "")
    m = table(300, 1_000_000)
    fill_node(m, pods)
    resource = export.build_resource(cfg)
    snapshot = otlp_names(m.collect(), "semconv")
    registry = CollectorRegistry()
    registry.register(PrometheusCollector(m, resource))
    scrape = generate_latest(registry)
    return {
        "points": sum(len(points) for _, points in snapshot),
        "otlp_bytes": encode_metrics(metrics_data(snapshot, resource)).ByteSize(),
        "scrape_samples": sum(
            1 for line in scrape.splitlines() if line and not line.startswith(b"#")
        ),
        "scrape_bytes": len(scrape),
    }


def test_a_node_grows_by_a_fixed_number_of_series_per_pod(tmp_path: Path) -> None:
    """The per-pod figures the budget multiplies out: exact, so a new series kind shows here."""
    one, hundred = node_figures(tmp_path, 1), node_figures(tmp_path, PODS)
    per_pod = {k: (hundred[k] - one[k]) / (PODS - 1) for k in one}
    print(f"\nper node of {PODS} pods: {hundred}\nper pod: {per_pod}")
    # Per kind: calls, a duration histogram, an error count; per engine: busy time, cycles,
    # elapsed cycles and capacity; memory, energy and the allocation: one each.
    assert per_pod["points"] == 3 * len(KINDS) + len(ENGINE_COUNTERS) + 1 + 1 + 1 + 1
    assert hundred["otlp_bytes"] > 0 and hundred["scrape_bytes"] > hundred["otlp_bytes"]


def test_a_simulated_fleet_pushes_into_victoria_metrics_without_loss(tools, tmp_path):  # noqa: F811
    # A store of many nodes' pushes keeps the node apart by promoting k8s.node.name to a label
    # (Prometheus: otlp.promote_resource_attributes; docs/performance.md#cluster-budget).
    promote = ["-opentelemetry.promoteResourceAttributes=k8s.node.name"]
    for vm in start_victoria_metrics(tools, tmp_path, promote):
        env = {
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"{vm.url}/opentelemetry",
            "OTEL_METRICS_EXPORTER": "otlp",
        }
        pushed = 0
        seconds = 0.0
        for n in range(NODES):
            cfg = make_config(
                tmp_path,
                "export: {otlp: {interval_seconds: 3600}}",
                env | {"K8S_NODE_NAME": f"node-{n}"},
            )
            tel = start_telemetry(cfg)
            try:
                fill_node(tel.metrics)
                points = sum(len(p) for _, p in tel.metrics.collect())
                started = time.monotonic()
                assert tel.pusher.push()
                seconds += time.monotonic() - started
                pushed += points
            finally:
                tel.shutdown()
        print(
            f"\n{NODES} nodes, {pushed} points in {seconds:.2f} s of pushes: "
            f"{pushed / seconds:.0f} points/s"
        )
        calls = NODES * PODS * len(KINDS)
        found = vm.wait_for("kubenpu_ioctl_total", calls)
        assert len(found) == calls  # every node's every series, none merged with another's
        assert sum(float(s["value"][1]) for s in found) == NODES * PODS * (10 + 11 + 12)
        assert Counter(s["metric"]["k8s_node_name"] for s in found) == {
            f"node-{n}": PODS * len(KINDS) for n in range(NODES)
        }
        counts = vm.wait_for("kubenpu_ioctl_duration_seconds_count", calls)
        assert sorted({float(s["value"][1]) for s in counts}) == [4.0]
        energy = vm.wait_for("kubenpu_energy_joules_total", NODES * PODS)
        assert sum(float(s["value"][1]) for s in energy) == pytest.approx(NODES * PODS * 2.0)
