"""Record the /metrics snapshots that tests/test_top.py serves, with the agent's own exporter.

Run `.venv/bin/python tests/testdata/top/record.py` after changing it; the .prom files are
committed. Each pod calls at fixed rates, so snapshot 1 is snapshot 0 plus exactly
SECONDS seconds of calls, and every rate top must show is known:

- agent-0.prom, agent-1.prom: today's agent (its series table, kubenpu.metrics.series, rendered by
  kubenpu.export.PrometheusCollector, as /metrics serves it). ml/old-job-0 exists only in
  snapshot 0: its pod went and the agent retired its series. batch/etl-0 is idle.
- fdinfo-0.prom, fdinfo-1.prom: the same plus the provisional fdinfo families (issue 10),
  kubenpu_engine_busy_seconds_total and kubenpu_memory_bytes, so the busy and memory columns
  can be tested before the agent exports them.
- restart.prom: the agent SECONDS seconds after a restart (every counter from zero), so
  agent-1 -> restart shows the same rates as agent-0 -> agent-1.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from opentelemetry.sdk.resources import Resource
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric

from kubenpu import __version__
from kubenpu.export.prometheus import PrometheusCollector
from kubenpu.metrics.inputs import DeviceRow, Where
from kubenpu.metrics.own import DEVICES
from kubenpu.sources.calls.attribution import DROPS, EVENTS, UNNAMED
from kubenpu.sources.registry import table

HERE = Path(__file__).resolve().parent
SECONDS = 2
GPU, NPU = "0000:00:02.0", "0000:00:0b.0"
VENDOR = {GPU: "i915", NPU: "ivpu"}
# (namespace, pod, container, device): calls per second of submit, alloc, wait.
RATES = {
    ("ml", "trainer-0", "main", GPU): (400, 20, 380),
    ("ml", "trainer-1", "main", GPU): (150, 5, 140),
    ("vision", "infer-7f9c4-x2kq", "server", NPU): (60, 2, 60),
    ("vision", "infer-7f9c4-x2kq", "sidecar", GPU): (0, 30, 0),
    ("", "", "", GPU): (12, 0, 12),  # host processes: unattributed, not_pod
    ("batch", "etl-0", "worker", NPU): (0, 0, 0),  # idle since before snapshot 0
}
UPTIME = 3600  # seconds of calls before snapshot 0
GONE = ("ml", "old-job-0", "main", GPU)
# Provisional fdinfo families: busy seconds per second per engine, memory per region/state.
BUSY = {
    ("ml", "trainer-0", "main", GPU): {"render": 0.9, "video": 0.05},
    ("ml", "trainer-1", "main", GPU): {"render": 0.3},
    ("vision", "infer-7f9c4-x2kq", "server", NPU): {"compute": 0.75},
}
MEMORY = {
    ("ml", "trainer-0", "main", GPU): {"system": {"total": 2 << 30, "resident": 3 << 29}},
    ("ml", "trainer-1", "main", GPU): {"system": {"total": 512 << 20, "resident": 256 << 20}},
    ("vision", "infer-7f9c4-x2kq", "server", NPU): {"local": {"total": 96 << 20}},
}


def agent(t: int, gone: bool) -> CollectorRegistry:
    """A registry serving the agent's state after t seconds of calls; `gone`: old-job-0 went
    and its series were retired."""
    metrics = table(series_ttl=0, max_series=10_000, clock=lambda: 0.0)
    metrics.set(
        DEVICES,
        "worker-1",
        [
            DeviceRow(GPU, "i915", "i915", "8086:9a49", "0"),
            DeviceRow(NPU, "ivpu", "intel_vpu", "8086:7d1d", "0"),
        ],
    )
    for (ns, pod, container, device), per_kind in RATES.items():
        for kind, rate in zip(("submit", "alloc", "wait"), per_kind, strict=True):
            n = rate * t or 7  # a kind it no longer calls: a few calls long ago
            metrics.add_calls(ns, pod, container, device, VENDOR[device], kind, n)
            if not pod:
                metrics.set(UNNAMED, "not_pod", n)
    metrics.add_calls(*GONE, VENDOR[GPU], "submit", 5000)
    if gone:
        ns, pod, container, _ = GONE
        metrics.gone(Where(ns, pod, "", container, "", ""))  # TTL 0: retired at once
    metrics.set(DROPS, "ringbuf_full", t)  # one a second
    metrics.set(EVENTS, "", 123_456 + t)
    resource = Resource.create(
        {
            "service.name": "kubenpu",
            "service.version": __version__,
            "host.name": "worker-1",
            "k8s.node.name": "worker-1",
            "service.instance.id": "worker-1",  # random by default: fixed for stable files
        }
    )
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PrometheusCollector(metrics, resource))
    return registry


class Fdinfo:
    """The provisional fdinfo families after t seconds."""

    def __init__(self, t: int) -> None:
        self.t = t

    def collect(self) -> Iterator[Metric]:
        busy = Metric("kubenpu_engine_busy_seconds", "Provisional: engine busy time.", "counter")
        for (ns, pod, c, dev), engines in BUSY.items():
            for engine, per_s in engines.items():
                labels = {"namespace": ns, "pod": pod, "container": c, "device": dev}
                labels |= {"vendor": VENDOR[dev], "engine": engine}
                busy.add_sample("kubenpu_engine_busy_seconds_total", labels, per_s * self.t)
        yield busy
        mem = Metric("kubenpu_memory_bytes", "Provisional: device memory.", "gauge")
        for (ns, pod, c, dev), regions in MEMORY.items():
            for region, states in regions.items():
                for state, value in states.items():
                    labels = {"namespace": ns, "pod": pod, "container": c, "device": dev}
                    labels |= {"vendor": VENDOR[dev], "region": region, "state": state}
                    mem.add_sample("kubenpu_memory_bytes", labels, value)
        yield mem


def main() -> None:
    for i, t in enumerate((UPTIME, UPTIME + SECONDS)):
        registry = agent(t, gone=i > 0)
        (HERE / f"agent-{i}.prom").write_bytes(generate_latest(registry))
        registry.register(Fdinfo(t))
        (HERE / f"fdinfo-{i}.prom").write_bytes(generate_latest(registry))
    (HERE / "restart.prom").write_bytes(generate_latest(agent(SECONDS, gone=True)))


if __name__ == "__main__":
    main()
