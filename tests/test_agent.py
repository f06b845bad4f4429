"""The agent's attribution stage on the host: real Resolver (cgroup tree + CRI gRPC server) and
real Metrics; only the kernel's events are synthetic (the VM e2e covers the real ones)."""

from __future__ import annotations

import io
import json
import os
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from cri_server import CriTestServer

from kubenpu.agent import Attributor, main, select_devices
from kubenpu.discovery import Device, Node
from kubenpu.events import Tally
from kubenpu.metrics import DROPPED, IOCTL, UNATTRIBUTED, Metrics
from kubenpu.resolve import Resolver

UID = "0e6f7c3a-1b2d-4c5e-8f9a-0b1c2d3e4f5a"
CID = "c" * 64
VGEM = Device("platform:vgem", None, None, None, (Node("/dev/dri/card0", "card0", 226, 0),), "vgem")
POD_DIR = f"kubepods/besteffort/pod{UID}/{CID}"


def event(cgroup_id: int, minor: int = 0, kind: int = 2, nr: int = 0xB2) -> bytes:
    cmd = 0xC0206400 | nr
    return struct.pack("<QQIIIIII", 1, cgroup_id, 42, cmd, 226, minor, kind, 0)


@pytest.fixture
def cgroups(tmp_path: Path) -> Path:
    root = tmp_path / "cgroup"
    (root / POD_DIR).mkdir(parents=True)
    (root / "system.slice/sshd.service").mkdir(parents=True)
    return root


@pytest.fixture
def resolver(tmp_path: Path, cgroups: Path) -> Iterator[Resolver]:
    server = CriTestServer()
    server.start(str(tmp_path / "cri.sock"))
    server.add_container(CID, "ml", "trainer-0", "worker", pod_uid=UID)
    resolver = Resolver(cgroups, f"unix://{tmp_path / 'cri.sock'}", cri_timeout=2.0)
    yield resolver
    resolver.close()
    server.stop()


def values(metrics: Metrics, spec) -> dict:
    points = dict(metrics.collect())[spec]
    return {tuple(p.attrs.values()): p.value for p in points if p.value}


def test_pod_and_host_calls_are_counted_with_a_reason_for_the_partial_ones(cgroups, resolver):
    metrics = Metrics("node-1", series_ttl=300, max_series=100)
    tally, attributor = Tally(100), Attributor([VGEM], resolver, metrics)
    pod = os.stat(cgroups / POD_DIR).st_ino
    host = os.stat(cgroups / "system.slice/sshd.service").st_ino
    for _ in range(3):
        tally.add_event(event(pod))
    tally.add_event(event(host, kind=3))
    tally.add_event(event(pod, minor=7))  # a device the probe never listed
    attributor.flush(tally.drain())
    assert values(metrics, IOCTL) == {
        ("ml", "trainer-0", "worker", "platform:vgem", "vgem", "alloc"): 3,
        ("", "", "", "platform:vgem", "vgem", "wait"): 1,
    }
    assert values(metrics, UNATTRIBUTED) == {("not_pod",): 1}
    assert values(metrics, DROPPED) == {("device_unknown",): 1}


def test_removed_cgroups_are_forgotten_and_their_pods_retired(cgroups, resolver):
    metrics = Metrics("node-1", series_ttl=0, max_series=100)
    tally, attributor = Tally(100), Attributor([VGEM], resolver, metrics)
    pod = os.stat(cgroups / POD_DIR).st_ino
    tally.add_event(event(pod))
    attributor.flush(tally.drain())
    assert attributor.dead_cgroups() == []
    (cgroups / POD_DIR).rmdir()
    assert attributor.dead_cgroups() == [pod]
    gone = attributor.forget([pod])
    assert [k.cgroup_id for k in gone] == [pod]
    assert attributor.dead_cgroups() == []
    assert values(metrics, IOCTL) == {}  # TTL 0: retired at the next collection


def test_trace_prints_each_call_with_its_pod(cgroups, resolver):
    out = io.StringIO()
    tally = Tally(100, keep_events=True)
    attributor = Attributor([VGEM], resolver, Metrics("n", 300, 100), trace=out)
    tally.add_event(event(os.stat(cgroups / POD_DIR).st_ino, nr=0xC3, kind=3))
    attributor.flush(tally.drain())
    line = json.loads(out.getvalue())
    assert (line["pod"], line["device"], line["nr"], line["kind"]) == (
        "trainer-0",
        "platform:vgem",
        "0xC3",
        "wait",
    )


def test_devices_without_a_plugin_or_ignored_are_not_counted():
    nvidia = Device("0000:01:00.0", "nvidia-drm", "10de:2204", 0, (), None)
    assert select_devices([VGEM, nvidia], ignore=[]) == [VGEM]
    assert select_devices([VGEM, nvidia], ignore=["platform:vgem"]) == []


def test_bad_config_is_one_line_per_problem_and_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("probe:\n  mode: turbo\nexport:\n  nope: 1\n")
    assert main(["--config", str(bad)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2 and all(str(bad) in line for line in lines)
