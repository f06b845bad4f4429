"""The real Agent with allocations from a real PodResources gRPC server, scraped over HTTP: the
series it records make the chart's KubeNPUAllocatedDeviceIdle alert fire in `promtool test
rules` for the pod that holds the device idle, and not for the pod that uses it.

Only the BPF program is faked (tests/fakes.py: FakeKernel), and the clock: 40 minutes pass in
steps of one minute, each step one attribution cycle, one allocations refresh and one scrape.

    python tests/test_allocations_alert.py FILE.json   writes the recording (the format of
    tests/testdata/dashboards-recording.json) to FILE.json.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from cri_server import CriTestServer
from fakes import Clock, FakeKernel
from helpers import StubHealth, free_port, make_config, resolved, scrape
from podresources_server import PodResourcesTestServer, container, pod
from prometheus_client.parser import text_string_to_metric_families
from test_agent import VGEM, make_agent

from kubenpu import export
from kubenpu.resolve.podresources.client import PodResourcesClient
from kubenpu.resolve.podresources.mapping import Mapper
from kubenpu.resolve.resolver import Resolver
from kubenpu.sources.activity import Activity
from kubenpu.sources.allocations import Allocations
from kubenpu.sources.calls.events import Key

ROOT = Path(__file__).parents[1]
NODE = "kubenpu-node"
UID, CID = "5d0c2a9e-7f3b-4e61-9a8d-2c4b6e8f0a1c", "d" * 64
RESOURCE = "example.com/vgem"  # a plugin without a known format: card0 is found in the id
STEPS, STEP = 40, 60.0
SERIES = ("kubenpu_device_allocated", "kubenpu_device_allocated_idle_seconds_total")


def record(work: Path) -> dict[str, Any]:
    """Scrapes of the agent while ml/trainer-0 submits every minute on the vgem device it shares
    with ml/idle-0, which holds it and never calls."""
    cgroups = work / "cgroup"
    (cgroups / f"kubepods/pod{UID}/{CID}").mkdir(parents=True)
    cri, kubelet = CriTestServer(), PodResourcesTestServer()
    cri.add_container(CID, "ml", "trainer-0", "worker", pod_uid=UID)
    kubelet.set_state(
        {
            "pods": [
                pod("ml", "trainer-0", [container("worker", {RESOURCE: ["card0-a"]})]),
                pod("ml", "idle-0", [container("main", {RESOURCE: ["card0-b"]})]),
            ]
        }
    )
    cri.start(str(work / "cri.sock"))
    kubelet.start(str(work / "pod-resources" / "kubelet.sock"))
    resolver = Resolver(cgroups, f"unix://{work / 'cri.sock'}", cri_timeout=2.0)
    cgroup_id = os.stat(cgroups / f"kubepods/pod{UID}/{CID}").st_ino
    resolved(resolver, cgroup_id)
    clock, kernel = Clock(), FakeKernel()
    activity = Activity(300, clock)
    agent = make_agent(kernel, resolver, clock, activity=activity)
    metrics = agent.metrics
    port = free_port()
    cfg = make_config(work, f"node_name: {NODE}\nexport:\n  prometheus:\n    port: {port}\n")
    exporters = export.start(cfg, metrics, StubHealth())
    client = PodResourcesClient(str(work / "pod-resources" / "kubelet.sock"))
    allocations = Allocations(client, Mapper([VGEM]), metrics, STEP, activity, clock=clock)
    start = time.time() - STEPS * STEP
    scrapes = []
    try:
        agent.attach()
        for step in range(STEPS):
            kernel.calls(Key(cgroup_id, 226, 0, 1), 10)  # submit-class calls
            kernel.poll(0)
            agent.cycle()
            assert allocations.refresh()
            scrapes.append({"time": start + step * STEP, "text": scrape(port)})
            clock.now += STEP
    finally:
        client.close()
        exporters.shutdown()
        resolver.close()
        cri.stop()
        kubelet.stop()
    return {"node": NODE, "interval": STEP, "scrapes": scrapes}


def input_series(recording: dict[str, Any]) -> list[dict[str, str]]:
    """The recorded allocation series as promtool input_series, with the node label a scrape
    by the chart's ServiceMonitor adds (the agent exports none on these series)."""
    values: dict[str, list[str]] = {}
    for scrape_ in recording["scrapes"]:
        seen = set()
        for family in text_string_to_metric_families(scrape_["text"]):
            for s in family.samples:
                if s.name in SERIES:
                    labels = {**s.labels, "node": recording["node"]}
                    name = (
                        s.name
                        + "{"
                        + ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
                        + "}"
                    )
                    values.setdefault(name, []).append(repr(float(s.value)))
                    seen.add(name)
        for name in values.keys() - seen:
            values[name].append("_")
    return [{"series": k, "values": " ".join(v)} for k, v in sorted(values.items())]


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return record(tmp_path_factory.mktemp("agent"))


def idle(recording: dict[str, Any], pod_name: str) -> list[float]:
    key = f'pod="{pod_name}"'
    (series,) = [
        s
        for s in input_series(recording)
        if key in s["series"] and s["series"].startswith(SERIES[1])
    ]
    return [float(v) for v in series["values"].split()]


def test_the_idle_pod_accumulates_idle_time_and_the_busy_one_none(recording) -> None:
    assert idle(recording, "idle-0") == [STEP * i for i in range(STEPS)]
    assert set(idle(recording, "trainer-0")) == {0.0}


@pytest.mark.tools
def test_the_idle_alert_fires_on_the_agents_series(recording, tmp_path: Path) -> None:
    import subprocess

    from helpers import script_output

    rules = ROOT / "deploy/helm/kubenpu/files/rules.yaml"
    labels = {
        "namespace": "ml",
        "pod": "idle-0",
        "container": "main",
        "device": "platform:vgem",
        "resource": RESOURCE,
        "node": NODE,
    }
    test = {
        "rule_files": [str(rules)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": input_series(recording),
                "alert_rule_test": [
                    {
                        "eval_time": "20m",
                        "alertname": "KubeNPUAllocatedDeviceIdle",
                        "exp_alerts": [],
                    },
                    {
                        "eval_time": "35m",
                        "alertname": "KubeNPUAllocatedDeviceIdle",
                        "exp_alerts": [
                            {
                                "exp_labels": {**labels, "severity": "info"},
                                "exp_annotations": {
                                    "summary": "ml/idle-0 holds platform:vgem on kubenpu-node idle",
                                    "description": (
                                        "Container main of ml/idle-0 was allocated platform:vgem"
                                        " (example.com/vgem) and made no submit call and used no"
                                        " engine time on it for 30m 0s of the last 30 minutes."
                                        " Free the device for a pod that uses it."
                                    ),
                                },
                            }
                        ],
                    },
                ],
            }
        ],
    }
    path = tmp_path / "idle_test.yaml"
    path.write_text(yaml.safe_dump(test))
    promtool = Path(script_output("deploy-tools.sh")) / "promtool"
    proc = subprocess.run(
        [str(promtool), "test", "rules", str(path)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as work:
        Path(sys.argv[1]).write_text(json.dumps(record(Path(work))))


@pytest.mark.tools
def test_the_allocated_vs_used_panel_shows_the_right_pods(recording, tmp_path: Path) -> None:
    """On a real Prometheus: both pods hold one share; the trainer submits, the idle pod is idle
    all the time and submits nothing."""
    from helpers import ALLOCATIONS_PANEL, dashboards

    boards = dashboards.run_all(dashboards.tools(), recording, tmp_path)
    (pods,) = [b for b in boards if b.name == "kubenpu-pods"]
    shown = {
        q.ref: {s["metric"]["pod"]: float(s["value"][1]) for s in q.result}
        for q in pods.queries
        if q.panel == ALLOCATIONS_PANEL
    }
    assert shown["A"] == {"trainer-0": 1.0, "idle-0": 1.0}
    assert shown["B"]["trainer-0"] == pytest.approx(10 / STEP)
    assert "idle-0" not in shown["B"]
    assert shown["C"] == {"trainer-0": 0.0, "idle-0": pytest.approx(1.0)}
