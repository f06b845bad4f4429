"""The agent on the host: the real Agent loop, Probe, Tally, Resolver (cgroup tree + CRI gRPC
server) and the series table. Only the BPF program is faked (tests/fakes.py: FakeKernel feeds
recorded records and map snapshots; the VM e2e covers the real one), and a FakeResolver stands in
where a test needs pending answers (None) on cue."""

from __future__ import annotations

import io
import json
import logging
import os
import struct
import subprocess
import sys
import threading
import tomllib
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from cri_server import CriTestServer
from fakes import Clock, FakeKernel, FakeResolver, record
from helpers import eventually, free_port, make_config, resolved, values

from kubenpu import __version__, export
from kubenpu.agent import main, wiring
from kubenpu.agent.health import Health
from kubenpu.agent.loop import Agent
from kubenpu.agent.wiring import select_devices
from kubenpu.discovery import Device, Node, not_ignored
from kubenpu.kernel.errors import ProbeError
from kubenpu.metrics.catalogue import (
    DROPPED,
    DURATIONS_FORGOTTEN,
    INDEX_REBUILDS,
    IOCTL,
    IOCTL_DURATION,
    IOCTL_ERRORS,
    IOCTL_REMOTE_NODE,
    LATE_SIGHTINGS,
    OVERFLOW_CALLS,
    PENDING_AGE,
    PENDING_CALLS,
    PENDING_EXPIRED,
    PROBE_PINNED,
    READ_ERRORS,
    RECEIVED,
    TELEMETRY_SKIPPED,
    TELEMETRY_STALE,
    UNATTRIBUTED,
)
from kubenpu.metrics.own import INDEX_REBUILT
from kubenpu.metrics.series import Series
from kubenpu.resolve import Attribution
from kubenpu.resolve.resolver import Resolver
from kubenpu.services import Services
from kubenpu.sources.activity import Activity
from kubenpu.sources.calls import attribution
from kubenpu.sources.calls.attribution import DURATIONS, Attributor
from kubenpu.sources.calls.events import Key, Tally
from kubenpu.sources.calls.probe import Probe
from kubenpu.sources.registry import table
from kubenpu.sources.sysfs import Reading
from kubenpu.sources.telemetry import Telemetry as RealTelemetry

UID = "0e6f7c3a-1b2d-4c5e-8f9a-0b1c2d3e4f5a"
CID = "c" * 64
VGEM = Device("platform:vgem", None, None, None, (Node("/dev/dri/card0", "card0", 226, 0),), "vgem")
POD_DIR = f"kubepods/besteffort/pod{UID}/{CID}"


@pytest.fixture
def cgroups(tmp_path: Path) -> Path:
    root = tmp_path / "cgroup"
    (root / POD_DIR).mkdir(parents=True)
    (root / "system.slice/sshd.service").mkdir(parents=True)
    return root


@pytest.fixture
def resolver(cri: CriTestServer, cri_socket: str, cgroups: Path) -> Iterator[Resolver]:
    cri.add_container(CID, "ml", "trainer-0", "worker", pod_uid=UID)
    resolver = Resolver(cgroups, f"unix://{cri_socket}", cri_timeout=2.0)
    # The CRI answers are in before the calls come; calls held for a pending answer are tested
    # with FakeResolver below.
    for cgroup in (POD_DIR, "system.slice/sshd.service"):
        resolved(resolver, os.stat(cgroups / cgroup).st_ino)
    yield resolver
    resolver.close()


def test_pod_and_host_calls_are_counted_with_a_reason_for_the_partial_ones(cgroups, resolver):
    metrics = table(series_ttl=300, max_series=100)
    tally, attributor = Tally(100), Attributor([VGEM], resolver, metrics)
    pod = os.stat(cgroups / POD_DIR).st_ino
    host = os.stat(cgroups / "system.slice/sshd.service").st_ino
    for _ in range(3):
        tally.add_event(record(key(pod)))
    tally.add_event(record(key(host, kind=3)))
    tally.add_event(record(Key(pod, 226, 7, 2)))  # a device the probe never listed
    attributor.flush(tally.drain())
    assert values(metrics, IOCTL) == {
        ("ml", "trainer-0", UID, "worker", "platform:vgem", "vgem", "alloc"): 3,
        ("", "", "", "platform:vgem", "vgem", "wait"): 1,
    }
    assert values(metrics, UNATTRIBUTED) == {("not_pod",): 1}
    assert values(metrics, DROPPED) == {("device_unknown",): 1}


def test_removed_cgroups_are_forgotten_and_their_pods_retired(cgroups, resolver):
    metrics = table(series_ttl=0, max_series=100)
    tally, attributor = Tally(100), Attributor([VGEM], resolver, metrics)
    pod = os.stat(cgroups / POD_DIR).st_ino
    tally.add_event(record(key(pod)))
    attributor.flush(tally.drain())
    assert attributor.dead_cgroups() == []
    (cgroups / POD_DIR).rmdir()
    assert attributor.dead_cgroups() == [pod]
    gone = attributor.forget([pod])
    assert [k.cgroup_id for k in gone] == [pod]
    assert attributor.dead_cgroups() == []
    assert values(metrics, IOCTL) == {}  # TTL 0: retired at the next collection


def test_a_reap_looks_for_removed_cgroups_only_after_the_tree_counters_move(cgroups, resolver):
    """The root's cgroup.stat, moved here as the kernel moves it at a removal: until then the
    reap stats no cgroup (1,000 pods' stats every 5 s were half of an idle agent's CPU)."""
    stat = cgroups / "cgroup.stat"
    stat.write_text("nr_descendants 5\nnr_subsys_cpu 5\nnr_dying_descendants 0\n")
    tally, attributor = Tally(100), Attributor([VGEM], resolver, table(0, 100))
    pod = os.stat(cgroups / POD_DIR).st_ino
    tally.add_event(record(key(pod)))
    attributor.flush(tally.drain())
    assert attributor.dead_cgroups() == []  # the first look: nothing known of the tree before
    (cgroups / POD_DIR).rmdir()
    assert attributor.dead_cgroups() == []  # the counters did not move: no cgroup looked at
    stat.write_text("nr_descendants 4\nnr_subsys_cpu 4\nnr_dying_descendants 1\n")
    assert attributor.dead_cgroups() == [pod]
    assert attributor.dead_cgroups() == [pod]  # not forgotten (the reap's read failed): again
    attributor.forget([pod])
    assert attributor.dead_cgroups() == []


def test_containers_without_pod_labels_retire_and_free_the_cap(tmp_path, cgroups, resolver):
    """Short-lived containers whose CRI records carry no pod labels (ctr, nerdctl) once filled
    max_series for good, and a real pod's calls went to overflow."""
    server = CriTestServer()
    server.start(str(tmp_path / "bare.sock"))
    bare = Resolver(cgroups, f"unix://{tmp_path / 'bare.sock'}", cri_timeout=2.0)
    metrics = table(series_ttl=0, max_series=3)
    tally, attributor = Tally(100), Attributor([VGEM], bare, metrics)
    try:
        for i in range(6):  # twice the cap, one after another
            cid = f"{i:064x}"
            (cgroups / f"kubepods/besteffort/pod{UID}" / cid).mkdir()
            server.add_container(cid, "", "", f"job-{i}")
            cgroup = os.stat(cgroups / f"kubepods/besteffort/pod{UID}" / cid).st_ino
            assert resolved(bare, cgroup).container == f"job-{i}"
            tally.add_event(record(key(cgroup)))
            attributor.flush(tally.drain())
            (cgroups / f"kubepods/besteffort/pod{UID}" / cid).rmdir()
            attributor.forget(attributor.dead_cgroups())
        pod = os.stat(cgroups / POD_DIR).st_ino
        attributor, tally = Attributor([VGEM], resolver, metrics), Tally(100)
        tally.add_event(record(key(pod)))
        attributor.flush(tally.drain())
        assert values(metrics, IOCTL) == {
            ("ml", "trainer-0", UID, "worker", "platform:vgem", "vgem", "alloc"): 1
        }
        assert values(metrics, OVERFLOW_CALLS) == {}
    finally:
        bare.close()
        server.stop()


def test_trace_prints_each_call_with_its_pod(cgroups, resolver):
    out = io.StringIO()
    tally = Tally(100, keep_events=True)
    attributor = Attributor([VGEM], resolver, table(300, 100), trace=out)
    tally.add_event(record(key(os.stat(cgroups / POD_DIR).st_ino, kind=3), nr=0xC3))
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


def test_fdinfo_reads_devices_without_a_plugin_but_not_ignored_ones():
    """A driver with no ioctl table may still print usage stats (the VM's test driver does)."""
    nvidia = Device("0000:01:00.0", "nvidia-drm", "10de:2204", 0, (), None)
    assert not_ignored([VGEM, nvidia], ignore=[]) == [VGEM, nvidia]
    assert not_ignored([VGEM, nvidia], ignore=["0000:01:00.0"]) == [VGEM]


def test_bad_config_is_one_line_per_problem_and_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("probe:\n  mode: turbo\nexport:\n  nope: 1\n")
    assert main(["--config", str(bad)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2 and all(str(bad) in line for line in lines)


# --- the agent loop, with the fake kernel ---------------------------------------------------

POD = ("ml", "trainer-0", UID, "worker", "platform:vgem", "vgem")


class Exporters:
    """Stands in for export.Exporters: the exporters have their own tests."""

    def __init__(self) -> None:
        self.shut_down = False

    def shutdown(self) -> None:
        self.shut_down = True


class Usage:
    """Stands in for kubenpu.sources.usage.Usage (tests/test_usage.py tests it): records what it
    gets."""

    name = "fdinfo"

    def __init__(self) -> None:
        self.seen: list[tuple[set[int], set[int]]] = []
        self.reads = 0

    def saw(self, tgids, cgroup_ids) -> None:
        self.seen.append((set(tgids), set(cgroup_ids)))

    def read(self) -> None:
        self.reads += 1

    def interval_busy(self) -> dict:
        return {"dev": {None: [self.reads, 0, 0]}}


class Telemetry:
    """Stands in for kubenpu.sources.telemetry.Telemetry (tests/test_telemetry.py tests it): what
    each tick hands its thread."""

    name = "telemetry"

    def __init__(self, busy=dict) -> None:
        self._busy = busy
        self.busy: list[dict] = []

    def tick(self) -> None:
        self.busy.append(self._busy())


def make_agent(
    kernel: FakeKernel,
    resolver,
    clock: Clock | None = None,
    ttl: float = 300,
    sources=(),
    activity: Activity | None = None,
    metrics: Series | None = None,
    device: Device = VGEM,
) -> Agent:
    clock = clock or Clock()
    tally, metrics = Tally(100), metrics or table(series_ttl=ttl, max_series=100)
    return Agent(
        probe=Probe(kernel, tally),
        tally=tally,
        attributor=Attributor([device], resolver, metrics, activity=activity, clock=clock),
        metrics=metrics,
        resolver=resolver,
        health=Health(stale_after=15, clock=clock),
        devices=1,
        sources=sources,
        interval=5,
        clock=clock,
    )


def key(cgroup_id: int, kind: int = 2) -> Key:
    return Key(cgroup_id, 226, 0, kind)


def test_aggregate_mode_reads_the_counts_map_as_increments(cgroups, resolver):
    kernel, clock = FakeKernel(aggregate=True), Clock()
    agent = make_agent(kernel, resolver, clock)
    agent.attach()
    pod = key(os.stat(cgroups / POD_DIR).st_ino)
    kernel.calls(pod, 5)
    kernel.poll(0)
    agent.cycle()
    assert values(agent.metrics, IOCTL) == {(*POD, "alloc"): 5}
    kernel.calls(pod, 3)
    agent.cycle()  # the counts map is read every _READ_SECONDS only
    assert values(agent.metrics, IOCTL) == {(*POD, "alloc"): 5}
    clock.now += 5
    agent.cycle()
    agent.cycle()
    assert values(agent.metrics, IOCTL) == {(*POD, "alloc"): 8}
    assert values(agent.metrics, RECEIVED) == {(): 8}


def test_kernel_drops_are_reported_as_increments(cgroups, resolver):
    kernel = FakeKernel(aggregate=True)
    agent = make_agent(kernel, resolver)
    agent.attach()
    kernel.lost.update(map_full=5, late_sighting=1)
    agent.cycle()
    kernel.lost.update(map_full=7, late_sighting=1)
    agent.cycle()  # no counts read due: the lost slots are read with the counts they miss
    assert values(agent.metrics, DROPPED) == {("map_full",): 5}
    agent._last_counts = -float("inf")
    agent.cycle()
    agent.cycle()
    assert values(agent.metrics, DROPPED) == {("map_full",): 7}
    assert values(agent.metrics, LATE_SIGHTINGS) == {(): 1}


def test_events_mode_counts_records_and_skips_bad_ones(cgroups, resolver, caplog):
    kernel = FakeKernel(aggregate=False)
    agent = make_agent(kernel, resolver)
    agent.attach()
    pod = key(os.stat(cgroups / POD_DIR).st_ino)
    kernel.calls(pod, 2)
    kernel.emit(record(pod)[:20], record(key(pod.cgroup_id, kind=7)))
    kernel.calls(pod, 1)
    kernel.poll(0)
    agent.cycle()
    assert values(agent.metrics, IOCTL) == {(*POD, "alloc"): 3}
    assert values(agent.metrics, DROPPED) == {("bad_record",): 2}
    assert "record skipped (counted as bad_record): record of 20 bytes" in caplog.text


def exited_pod(cgroups: Path, resolver) -> tuple[Agent, FakeKernel, Key]:
    """An agent (series TTL 0) that counted 2 calls of a container that made 4 more in the
    kernel map and exited: its cgroup is gone, and a reap is due before a counts read is."""
    kernel, clock = FakeKernel(aggregate=True), Clock()
    agent = make_agent(kernel, resolver, clock, ttl=0)
    agent.attach()
    pod = key(os.stat(cgroups / POD_DIR).st_ino)
    kernel.calls(pod, 2)
    kernel.poll(0)
    agent.cycle()
    kernel.calls(pod, 4)
    (cgroups / POD_DIR).rmdir()
    clock.now += 1
    agent._last_reap = -float("inf")
    return agent, kernel, pod


def test_dead_cgroups_are_read_a_last_time_then_forgotten_in_the_kernel(cgroups, resolver):
    agent, kernel, pod = exited_pod(cgroups, resolver)
    agent.cycle()  # reaping reads the counts map first
    assert kernel.forgotten == [pod] and kernel.counts == {}
    # retired at once (TTL 0): the last 4 calls were counted before that
    assert values(agent.metrics, IOCTL) == {}
    assert values(agent.metrics, RECEIVED) == {(): 6}


def test_a_reap_whose_last_read_fails_forgets_no_dead_cgroup(cgroups, resolver):
    """No read, no forgetting: the calls made since the last good read are still in the
    kernel map, and a cgroup forgotten now would lose them."""
    agent, kernel, pod = exited_pod(cgroups, resolver)
    kernel.failing_reads = 1  # the reap's last read (no counts read is due: the cycle reads none)
    agent.cycle()
    assert kernel.forgotten == [] and agent.attributor.dead_cgroups() == [pod.cgroup_id]
    agent._last_reap = -float("inf")
    agent.cycle()
    assert kernel.forgotten == [pod]
    assert values(agent.metrics, RECEIVED) == {(): 6}


def test_exit_reads_the_kernel_a_last_time_and_closes_everything(cgroups, resolver):
    kernel, exporters = FakeKernel(aggregate=True), Exporters()
    agent = make_agent(kernel, resolver)
    pod = key(os.stat(cgroups / POD_DIR).st_ino)
    kernel.counts[pod] = 3
    agent.stop.set()
    with services_of(agent, exporters):
        assert agent.run() == 0
        assert not kernel.closed  # the last read came first
    assert values(agent.metrics, IOCTL) == {(*POD, "alloc"): 3}
    assert kernel.closed and exporters.shut_down


def test_exit_counts_what_the_last_read_finds(cgroups, resolver):
    """Calls made after the last regular read of the counts map are counted before exit."""
    kernel, clock = FakeKernel(aggregate=True), Clock()
    agent = make_agent(kernel, resolver, clock)
    agent._last_counts = clock.now  # the regular cycles are not due to read the counts map
    kernel.counts[key(os.stat(cgroups / POD_DIR).st_ino)] = 3
    agent.stop.set()
    with services_of(agent, Exporters()):
        assert agent.run() == 0
    assert values(agent.metrics, IOCTL) == {(*POD, "alloc"): 3}


def test_failed_attach_still_closes_the_resolver_and_the_exporters():
    kernel, resolver, exporters = FakeKernel(), FakeResolver(), Exporters()
    kernel.start_raises = ProbeError("cannot attach to drm_ioctl: fentry-module: no BTF")
    agent = make_agent(kernel, resolver)
    with pytest.raises(ProbeError), services_of(agent, exporters):
        agent.run()
    assert resolver.closed and kernel.closed and exporters.shut_down


def test_a_failed_kernel_read_is_retried_and_loses_nothing(cgroups, resolver, caplog):
    caplog.set_level(logging.INFO)
    kernel, clock = FakeKernel(aggregate=True), Clock()
    agent = make_agent(kernel, resolver, clock)
    agent.attach()
    pod = key(os.stat(cgroups / POD_DIR).st_ino)
    kernel.calls(pod, 5)
    kernel.failing_reads = 3
    for _ in range(3):
        agent.cycle()
        clock.now += 0.5
    assert values(agent.metrics, IOCTL) == {}
    assert agent.health.ready() == (False, "kernel counters not read yet")
    agent.cycle()  # counts are still due: read at the next cycle, not 5 s later
    assert values(agent.metrics, IOCTL) == {(*POD, "alloc"): 5}
    assert values(agent.metrics, READ_ERRORS) == {(): 3}
    assert caplog.text.count("failed (retrying)") == 1  # once per streak
    assert "works again after 3 failure(s)" in caplog.text


def test_liveness_fails_when_the_kernel_is_not_read():
    clock = Clock()
    health = Health(stale_after=15, clock=clock)
    assert health.ready() == (False, "probe not attached yet")
    health.attached()
    health.kernel_read()
    assert health.live() == (True, "ok") and health.ready() == (True, "ok")
    clock.now += 16
    assert health.live() == (False, "kernel counters last read 16 s ago")


class Kill(BaseException):
    """What no guard catches: the worker thread dies."""


def services_of(agent: Agent, exporters: Exporters | export.Exporters) -> Services:
    """The service group as build() registers the agent's pieces."""
    services = Services(deadline_seconds=10)
    services.add("exporters", exporters.shutdown)
    services.add("resolver", agent.resolver.close)
    services.add("probe", agent.probe.close)
    return services


@pytest.fixture
def running() -> Iterator[Callable[..., None]]:
    """Runs agents as main does, each in its service group, and stops them at the end."""
    agents: list[tuple[Agent, threading.Thread]] = []

    def start(agent: Agent, exporters: Exporters | export.Exporters | None = None) -> None:
        def run() -> None:
            with services_of(agent, exporters or Exporters()):
                agent.run()

        thread = threading.Thread(target=run)
        thread.start()
        eventually(lambda: agent.health.ready()[0], "the agent ready")
        agents.append((agent, thread))

    yield start
    for agent, thread in agents:
        agent.stop.set()
        thread.join()


@pytest.mark.parametrize("mode", ["events", "aggregate"])
def test_workers_survive_exceptions(mode, running, caplog):
    kernel, resolver = FakeKernel(aggregate=mode == "aggregate"), FakeResolver()
    resolver.answers[9] = Attribution("ml", "trainer-0", "worker", pod_uid=UID)
    agent = make_agent(kernel, resolver, Clock())
    agent.cycle = _always_reading(agent)
    running(agent)
    kernel.poll_raises = RuntimeError("poll broke")
    resolver.raises = ValueError("resolve broke")
    kernel.calls(key(9), 2)
    eventually(lambda: bool(values(agent.metrics, IOCTL)), "the first counts")
    kernel.calls(key(9), 1)
    eventually(lambda: values(agent.metrics, IOCTL).get((*POD, "alloc")) == 3, "3 calls")
    assert "poll failed (retrying): RuntimeError: poll broke" in caplog.text
    assert "attribution failed (retrying): ValueError: resolve broke" in caplog.text
    assert agent.health.live() == (True, "ok")


def test_a_poll_failing_after_some_records_counts_them_and_logs(running, caplog):
    """Records a poll delivered before it failed are counted, the rest at the next poll (none
    twice: tests/test_births.py); the failure is logged."""
    kernel, resolver = FakeKernel(aggregate=False), FakeResolver()
    resolver.answers[9] = Attribution("ml", "trainer-0", "worker", pod_uid=UID)
    agent = make_agent(kernel, resolver, Clock())
    agent.cycle = _always_reading(agent)
    kernel.poll_raises, kernel.poll_fails_after = OSError("polling the ring buffer: EIO"), 2
    kernel.calls(key(9), 5)
    running(agent)
    eventually(lambda: values(agent.metrics, IOCTL).get((*POD, "alloc")) == 5, "all 5 calls")
    assert "poll failed (retrying): OSError: polling the ring buffer: EIO" in caplog.text


class _SlowRuntime(FakeResolver):
    """A runtime whose Version call hangs until the test releases it."""

    def __init__(self) -> None:
        super().__init__()
        self.answer = threading.Event()

    def runtime_version(self) -> str | None:
        self.answer.wait()
        return "slow 1.0"


def test_a_runtime_slow_to_answer_delays_neither_attach_nor_the_first_read(running):
    kernel, resolver = FakeKernel(aggregate=True), _SlowRuntime()
    resolver.answers[9] = Attribution("ml", "trainer-0", "worker", pod_uid=UID)
    kernel.counts[key(9)] = 4  # an adopted probe's totals
    agent = make_agent(kernel, resolver)
    try:
        running(agent)  # waits until ready: attached and read
        eventually(lambda: values(agent.metrics, IOCTL) == {(*POD, "alloc"): 4}, "4 calls")
    finally:
        resolver.answer.set()


def _always_reading(agent: Agent) -> Callable[[], None]:
    """The loop's cycle with the counts map due every time (the fake clock never moves)."""
    cycle = agent.cycle

    def step() -> None:
        agent._last_counts = -float("inf")
        cycle()

    return step


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
@pytest.mark.parametrize("worker", ["poll", "attribution"])
def test_a_dead_worker_fails_liveness(worker, running):
    kernel, resolver = FakeKernel(aggregate=False), FakeResolver()
    agent = make_agent(kernel, resolver)
    running(agent)
    if worker == "poll":
        kernel.poll_raises = Kill()
    else:
        resolver.raises = Kill()
        kernel.calls(key(9))
    eventually(lambda: not agent.health.live()[0], "the dead worker seen")
    assert agent.health.live() == (False, f"worker thread stopped: {worker} (Kill)")


def _probe_answer(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return r.status, r.read().decode().strip()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode().strip()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_the_kubelets_probes_see_a_dead_worker(tmp_path, running):
    # What the chart's livenessProbe asks (/healthz on the metrics port), through the real server.
    port = free_port()
    cfg = make_config(tmp_path, f"export:\n  prometheus:\n    host: 127.0.0.1\n    port: {port}\n")
    kernel, resolver = FakeKernel(aggregate=False), FakeResolver()
    agent = make_agent(kernel, resolver)
    running(agent, export.start(cfg, agent.metrics, agent.health))
    assert _probe_answer(port, "/healthz") == (200, "ok")
    assert _probe_answer(port, "/readyz") == (200, "ok")
    resolver.raises = Kill()
    kernel.calls(key(9))
    eventually(lambda: _probe_answer(port, "/healthz")[0] == 503, "/healthz failing")
    assert _probe_answer(port, "/healthz") == (503, "worker thread stopped: attribution (Kill)")


# --- pending attribution ---------------------------------------------------------------------


def test_pending_counts_are_attributed_when_the_answer_comes():
    resolver, clock, metrics = FakeResolver(), Clock(), table(300, 100)
    attributor = Attributor([VGEM], resolver, metrics, clock=clock)
    tally = Tally(100)
    tally.add(key(9), 4)
    attributor.flush(tally.drain())
    assert values(metrics, IOCTL) == {} and attributor.pending() == 1
    tally.add(key(9), 1)
    attributor.flush(tally.drain())
    resolver.answers[9] = Attribution("ml", "trainer-0", "worker", pod_uid=UID)
    attributor.flush(tally.drain())
    assert values(metrics, IOCTL) == {(*POD, "alloc"): 5}
    assert attributor.pending() == 0 and values(metrics, UNATTRIBUTED) == {}


class _AnswersDuringAFlush(FakeResolver):
    """The answer for cgroup 1 arrives while the flush resolves cgroup 2, a moment later; what
    the metrics held when cgroup 3 was first resolved is recorded."""

    def __init__(self, clock: Clock, metrics: Series) -> None:
        super().__init__()
        self.clock, self.metrics, self.seen_before_3 = clock, metrics, None

    def resolve(self, cgroup_id: int) -> Attribution | None:
        if cgroup_id == 2:
            self.answers[1] = Attribution("ml", "trainer-0", "worker", pod_uid=UID)
            self.clock.now += 1
        if cgroup_id == 3 and self.seen_before_3 is None:
            self.seen_before_3 = values(self.metrics, IOCTL)
        return super().resolve(cgroup_id)


def test_answers_that_come_during_a_long_flush_are_counted_before_it_ends():
    clock, metrics = Clock(), table(300, 100)
    resolver = _AnswersDuringAFlush(clock, metrics)
    attributor = Attributor([VGEM], resolver, metrics, clock=clock)
    tally = Tally(100)
    for cgroup in (3, 2, 1):  # counted last in, first out
        tally.add(key(cgroup), 4)
    attributor.flush(tally.drain())
    assert resolver.seen_before_3 == {(*POD, "alloc"): 4}
    assert attributor.pending() == 2


def test_pending_counts_settle_after_pending_seconds():
    resolver, clock, metrics = FakeResolver(), Clock(), table(300, 100)
    attributor = Attributor([VGEM], resolver, metrics, pending_seconds=120, clock=clock)
    tally = Tally(100)
    tally.add(key(9), 4)
    attributor.flush(tally.drain())
    resolver.dead.add(9)
    assert attributor.dead_cgroups() == []  # held counts keep the cgroup until they settle
    clock.now += 119
    attributor.flush(tally.drain())
    assert values(metrics, IOCTL) == {}
    clock.now += 1
    attributor.flush(tally.drain())
    assert values(metrics, IOCTL) == {("", "", "", "platform:vgem", "vgem", "alloc"): 4}
    assert values(metrics, UNATTRIBUTED) == {("cri_error",): 4}
    assert values(metrics, PENDING_EXPIRED) == {(): 4}
    assert attributor.dead_cgroups() == [9]


def _held(metrics: Series) -> tuple[int, float]:
    return values(metrics, PENDING_CALLS).get((), 0), values(metrics, PENDING_AGE).get((), 0.0)


def test_calls_held_for_an_absent_runtime_are_shown_and_logged_with_its_socket(
    tmp_path, cgroups, caplog
):
    """A wrong CRI socket once made a busy pod vanish for attribution.pending_seconds without a
    word: no series, 0 calls/s in top. The real resolver, dialling a socket nobody serves."""
    caplog.set_level(logging.INFO, "kubenpu")
    absent = f"unix://{tmp_path / 'wrong.sock'}"
    resolver = Resolver(cgroups, absent, cri_timeout=2.0)
    clock, metrics = Clock(), table(300, 100)
    attributor = Attributor([VGEM], resolver, metrics, cri_endpoint=absent, clock=clock)
    pod, tally = key(os.stat(cgroups / POD_DIR).st_ino), Tally(100)

    def said() -> list[str]:  # the attributor's lines (the CRI client's own come and go)
        return [r.getMessage() for r in caplog.records if r.name == attribution.__name__]

    try:
        tally.add(pod, 100)
        attributor.flush(tally.drain())
        assert values(metrics, IOCTL) == {} and _held(metrics) == (100, 0.0)
        tally.add(pod, 50)
        clock.now += 9.5
        attributor.flush(tally.drain())
        assert _held(metrics) == (150, 9.5)
        assert said() == []  # a runtime a moment slow is not worth a warning
        clock.now += 0.5
        attributor.flush(tally.drain())
        assert _held(metrics) == (150, 10.0)
        [line] = said()
        assert line.startswith("150 call(s) of 1 cgroup(s) held for 10 s: the CRI at " + absent)
        assert "(120 s)" in line
        clock.now += 110
        attributor.flush(tally.drain())
        assert _held(metrics) == (0, 0.0)
        assert values(metrics, PENDING_EXPIRED) == {(): 150}
        assert said()[1:] == [
            "no calls held any more; 150 of them counted with empty pod labels "
            "(kubenpu_pending_expired_calls_total)"
        ]
    finally:
        resolver.close()


def test_calls_held_for_a_slow_runtime_are_shown_then_counted_when_it_answers(
    cri, cri_socket, cgroups
):
    cri.add_container(CID, "ml", "trainer-0", "worker", pod_uid=UID)
    cri.listed = False  # the lookup is the container's own: hold() keeps it in flight
    cri.hold()
    resolver = Resolver(cgroups, f"unix://{cri_socket}", cri_timeout=30.0)
    clock, metrics = Clock(), table(300, 100)
    attributor = Attributor([VGEM], resolver, metrics, clock=clock)
    pod, tally = key(os.stat(cgroups / POD_DIR).st_ino), Tally(100)
    try:
        tally.add(pod, 7)
        attributor.flush(tally.drain())
        assert cri.wait_in_flight(1)
        clock.now += 3
        attributor.flush(tally.drain())
        assert _held(metrics) == (7, 3.0) and values(metrics, IOCTL) == {}
        cri.release()
        eventually(lambda: resolver.resolve(pod.cgroup_id), "the runtime's answer")
        attributor.flush(tally.drain())
        assert values(metrics, IOCTL) == {(*POD, "alloc"): 7}
        assert _held(metrics) == (0, 0.0)
    finally:
        resolver.close()


def test_pending_keys_are_capped_and_the_overflow_counted_unattributed():
    resolver, metrics = FakeResolver(), table(300, 100)
    attributor = Attributor([VGEM], resolver, metrics, max_pending=2, clock=Clock())
    tally = Tally(100)
    for cgroup in (1, 2, 3):
        tally.add(key(cgroup), 10)
    tally.add(key(1, kind=3), 10)
    attributor.flush(tally.drain())
    assert attributor.pending() == 2
    assert values(metrics, UNATTRIBUTED) == {("pending_full",): 20}
    attributor.settle_all()
    assert attributor.pending() == 0
    assert values(metrics, UNATTRIBUTED) == {("pending_full",): 20, ("cri_error",): 20}
    assert sum(values(metrics, IOCTL).values()) == 40


def test_trace_prints_pending_lookups_with_empty_labels():
    out = io.StringIO()
    tally = Tally(100, keep_events=True)
    attributor = Attributor([VGEM], FakeResolver(), table(300, 100), trace=out)
    tally.add_event(record(key(9)))
    attributor.flush(tally.drain())
    line = json.loads(out.getvalue())
    assert (line["cgroup_id"], line["namespace"], line["pod"], line["container"]) == (9, "", "", "")


def test_without_the_agent_extras_the_agent_says_what_to_install():
    blocked = ["pydantic", "yaml", "grpc", "opentelemetry", "prometheus_client", "google"]
    code = (
        "import sys\n"
        f"for name in {blocked!r}: sys.modules[name] = None\n"
        "import kubenpu.cli.ctl\n"  # kubenpuctl needs none of them
        "from kubenpu.agent import main\n"
        "sys.exit(main([]))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert (res.returncode, res.stderr) == (
        2,
        "kubenpu-agent needs the agent extras: pip install 'kubenpu[agent]'\n",
    )


def test_fdinfo_is_read_every_interval_with_the_callers_the_probe_saw(cgroups, resolver):
    kernel, clock, usage = FakeKernel(aggregate=False), Clock(), Usage()
    agent = make_agent(kernel, resolver, clock, sources=[usage])
    agent.attach()
    kernel.calls(key(77), 2)
    kernel.poll(0)
    agent.cycle()
    assert usage.reads == 1
    assert ({42}, {77}) in usage.seen  # tests/fakes.py's records carry tgid 42
    agent.cycle()
    assert usage.reads == 1
    clock.now += 5
    agent.cycle()
    assert usage.reads == 2


def test_telemetry_is_read_right_after_fdinfo_with_its_busy_time(cgroups, resolver):
    kernel, clock, usage = FakeKernel(aggregate=False), Clock(), Usage()
    telemetry = Telemetry(usage.interval_busy)
    agent = make_agent(kernel, resolver, clock, sources=[usage, telemetry])
    agent.attach()
    agent.cycle()
    agent.cycle()  # within the interval: no read
    clock.now += 5
    agent.cycle()
    assert telemetry.busy == [{"dev": {None: [1, 0, 0]}}, {"dev": {None: [2, 0, 0]}}]
    assert usage.reads == 2
    alone = Telemetry()
    agent = make_agent(kernel, resolver, clock, sources=[alone])  # fdinfo.enabled: false
    agent.cycle()
    assert alone.busy == [{}]


@pytest.mark.parametrize("returns", [False, True], ids=["never_returns", "takes_long"])
def test_a_sensor_read_that_blocks_stalls_neither_counting_nor_liveness(cgroups, resolver, returns):
    """Telemetry was read on the attribution thread: a sysfs file that never answered (drivers
    block in sysfs during a GPU reset) stopped every pod's counting and /healthz went 503, so
    the kubelet restarted the agent into the same read."""
    release, reads = threading.Event(), []

    def blocked(device: Device, root: Path) -> Reading:
        reads.append(device.id)
        if len(reads) == 1:  # the first read blocks; once it returns, the device reads again
            release.wait()
        return Reading()

    kernel, clock, usage = FakeKernel(aggregate=True), Clock(), Usage()
    metrics = table(series_ttl=300, max_series=100)
    telemetry = RealTelemetry(
        [VGEM], metrics, deadline=0.05, read=blocked, busy=usage.interval_busy
    )
    agent = make_agent(kernel, resolver, clock, sources=[usage, telemetry], metrics=metrics)
    telemetry.start()
    pod = key(os.stat(cgroups / POD_DIR).st_ino)

    def count_for_a_minute() -> None:
        for _ in range(12):
            kernel.calls(pod, 1)
            agent.cycle()
            clock.now += 5

    try:
        agent.attach()
        counting = threading.Thread(target=count_for_a_minute, daemon=True)
        counting.start()
        counting.join(30)
        assert not counting.is_alive(), "counting waited on the sensor"
        assert values(agent.metrics, IOCTL) == {(*POD, "alloc"): 12}
        assert usage.reads == 12
        assert agent.health.live() == (True, "ok")
        eventually(
            lambda: values(agent.metrics, TELEMETRY_SKIPPED).get(("deadline",)), "a skip counted"
        )
        assert values(agent.metrics, TELEMETRY_STALE) == {("platform:vgem", "vgem"): 1}
        assert reads == ["platform:vgem"]  # no second read while the first is stuck
        if returns:  # the late read is used at the next read, and the device is read again
            release.set()

            def fresh() -> bool:
                agent.cycle()
                clock.now += 5
                return values(agent.metrics, TELEMETRY_STALE) == {} and len(reads) >= 2

            eventually(fresh, "the device fresh again")  # values() leaves out the stale 0
    finally:
        release.set()
        telemetry.close()


def test_the_version_is_the_packages():
    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    assert __version__ == pyproject["project"]["version"]


class _WedgedResolver(FakeResolver):
    """A resolver whose resolve() never returns until the test releases it."""

    def __init__(self) -> None:
        super().__init__()
        self.wedged, self.release = threading.Event(), threading.Event()

    def resolve(self, cgroup_id: int) -> Attribution | None:
        self.wedged.set()
        self.release.wait()
        return None


def test_stop_with_a_wedged_worker_exits_within_the_bound_after_a_final_push(caplog):
    """SIGTERM with the attribution thread wedged: no exit within 45 s and no final push, as
    Agent.run joined its workers without a bound."""
    kernel, resolver = FakeKernel(aggregate=False), _WedgedResolver()
    agent, exporters = make_agent(kernel, resolver), Exporters()

    def run() -> None:
        with services_of(agent, exporters):
            agent.run()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        kernel.calls(key(9))
        eventually(resolver.wedged.is_set, "the attribution thread wedged")
        agent.stop.set()  # what SIGTERM does
        eventually(lambda: not thread.is_alive(), "run() returned")
        assert exporters.shut_down  # the final push is the exporters' shutdown
        assert "attribution did not stop within 3 s of the stop signal" in caplog.text
    finally:
        resolver.release.set()


def test_misses_in_one_batch_share_one_walk_of_a_big_cgroup_tree(tmp_path):
    """200 calls from cgroups already removed from a tree of 10,000 directories walked it 201
    times on the attribution thread: nothing was counted meanwhile and /healthz failed."""
    root = tmp_path / "cgroup"
    for i in range(10_000):
        (root / f"kubepods/burstable/pod{i // 100}/c{i}").mkdir(parents=True)
    metrics = table(series_ttl=300, max_series=1000)

    def rebuilt() -> None:
        metrics.set(INDEX_REBUILT, "", 1)

    resolver = Resolver(root, f"unix://{tmp_path / 'none.sock'}", on_rebuild=rebuilt)
    tally, attributor = Tally(1000), Attributor([VGEM], resolver, metrics)
    try:
        gone = [1 << 40 | i for i in range(200)]  # ids no directory has (any more)
        for cgroup_id in gone:
            tally.add_event(record(key(cgroup_id)))
        attributor.flush(tally.drain())
        assert values(metrics, INDEX_REBUILDS) == {(): 1}
        assert values(metrics, UNATTRIBUTED) == {("not_indexed",): 200}
        tally.add_event(record(key(gone[0])))  # asked again: no walk
        attributor.flush(tally.drain())
        assert values(metrics, INDEX_REBUILDS) == {(): 1}
    finally:
        resolver.close()


class _WedgingKernel(FakeKernel):
    """A kernel whose ring-buffer poll never returns once `wedge` is set."""

    def __init__(self) -> None:
        super().__init__(aggregate=False)
        self.wedge, self.wedged, self.release = (threading.Event() for _ in range(3))

    def poll(self, timeout_ms: int) -> None:
        if self.wedge.is_set():
            self.wedged.set()
            self.release.wait()
        super().poll(timeout_ms)


def test_a_wedged_poll_thread_fails_liveness(running):
    """With the poll thread wedged in events mode, /healthz stayed 200 for 40 s while 0 of 100
    calls were counted: the attribution thread still read the kernel's counters."""
    kernel, clock = _WedgingKernel(), Clock()
    agent = make_agent(kernel, FakeResolver(), clock)
    running(agent)
    try:
        kernel.wedge.set()
        eventually(kernel.wedged.is_set, "the poll thread wedged")
        clock.now += 16  # the attribution thread's next read makes its counters fresh again
        stale = (False, "ring buffer last polled 16 s ago")
        eventually(lambda: agent.health.live() == stale, "liveness fails for the poll thread")
    finally:
        kernel.release.set()


def test_a_flood_of_births_for_vanished_cgroups_delays_no_later_call(
    cgroups, resolver, monkeypatch
):
    """5,000 birth records for cgroups already removed delayed a later call by 20 s: each birth
    scanned its parent's directory (2,000 siblings here) twice, and again at the next birth,
    with a pause between, on the poll thread. Now one poll's births share one scan per parent:
    the call is counted after one poll and one cycle, and the directory scanned 3 times."""
    parent = cgroups / "kubepods" / "besteffort"
    for i in range(2000):
        (parent / f"pod-sibling-{i}").mkdir()
    kernel = FakeKernel(aggregate=False)
    agent = make_agent(kernel, resolver)
    agent.probe = Probe(kernel, agent.tally, on_births=resolver.cgroups_born)
    agent.attach()
    births = [struct.pack("<QQ", 1 << 40 | i, parent.stat().st_ino) for i in range(5000)]
    kernel.emit(*births)
    kernel.calls(key(os.stat(cgroups / POD_DIR).st_ino), 1)
    scans: list[str] = []
    real_scandir = os.scandir
    monkeypatch.setattr(os, "scandir", lambda p: scans.append(str(p)) or real_scandir(p))
    agent.probe.poll(0)  # one step of the poll loop takes every record, births and the call
    monkeypatch.setattr(os, "scandir", real_scandir)
    agent.cycle()
    assert values(agent.metrics, IOCTL) == {(*POD, "alloc"): 1}
    assert scans.count(str(parent)) <= 3


def test_a_new_key_brings_the_counts_read_forward(cgroups, resolver):
    """A new pod's first calls are read a second after the last read, not at the next 5 s one;
    calls of known keys wait for the regular read."""
    kernel, clock = FakeKernel(aggregate=True), Clock()
    agent = make_agent(kernel, resolver, clock)
    agent.attach()
    agent.cycle()  # the first read, of an empty map
    pod = key(os.stat(cgroups / POD_DIR).st_ino)
    kernel.calls(pod, 4)  # a first sighting, and the map's count
    kernel.poll(0)
    clock.now += 0.5
    agent.cycle()
    assert values(agent.metrics, IOCTL) == {}  # not a second yet
    clock.now += 0.5
    agent.cycle()
    assert values(agent.metrics, IOCTL) == {(*POD, "alloc"): 4}
    kernel.calls(pod, 2)  # a known key: no sighting
    clock.now += 1
    agent.cycle()
    assert values(agent.metrics, IOCTL) == {(*POD, "alloc"): 4}
    clock.now += 4
    agent.cycle()
    assert values(agent.metrics, IOCTL) == {(*POD, "alloc"): 6}


def test_the_kernels_call_durations_reach_the_pods_series(cgroups, resolver):
    """A read of the counts also reads the durations: the pod's histogram holds the kernel's
    buckets as they are, and its errors by name; a later read replaces the cumulative totals,
    never adds them twice."""
    kernel, clock = FakeKernel(aggregate=True), Clock()
    agent = make_agent(kernel, resolver, clock)
    agent.attach()
    pod = key(os.stat(cgroups / POD_DIR).st_ino, kind=3)
    kernel.calls(pod, 3)
    kernel.timed(pod, [2_000_000, 2_100_000], ret=-62)  # two waits that timed out
    kernel.timed(pod, [50_000])
    kernel.poll(0)
    agent.cycle()
    [hist] = values(agent.metrics, IOCTL_DURATION).values()
    assert {i: n for i, n in enumerate(hist.slots) if n} == {45: 2, 23: 1}
    assert hist.total == pytest.approx(4_150_000 / 1e9)
    assert values(agent.metrics, IOCTL_ERRORS) == {(*POD, "wait", "ETIME"): 2}
    clock.now += 5
    kernel.calls(pod, 1)
    kernel.timed(pod, [50_000], ret=-12)
    agent.cycle()
    [hist] = values(agent.metrics, IOCTL_DURATION).values()
    assert hist.count == 4
    assert values(agent.metrics, IOCTL_ERRORS) == {
        (*POD, "wait", "ETIME"): 2,
        (*POD, "wait", "ENOMEM"): 1,
    }


def remote_points(agent: Agent) -> dict[tuple, int]:
    """Every point of kubenpu_ioctl_remote_node_total, zeros included."""
    [points] = [p for s, p in agent.metrics.collect() if s is IOCTL_REMOTE_NODE]
    return {(p.attrs["pod"], p.attrs["device"], p.attrs["kind"]): p.value for p in points}


def test_remote_calls_reach_the_pods_series_beside_its_calls(cgroups, resolver):
    """The kernel's remote calls of a key (its value's second field, read with the counts) are
    the pod's series, cumulative, never added twice; a key without any is exported at 0 (its
    share is 0, not unknown); the calls series holds every call, remote or not."""
    kernel, clock = FakeKernel(aggregate=True), Clock()
    agent = make_agent(kernel, resolver, clock, device=replace(VGEM, numa_node=1))
    agent.attach()
    pod = key(os.stat(cgroups / POD_DIR).st_ino)
    kernel.calls(pod, 5, remote=3)
    kernel.calls(key(os.stat(cgroups / POD_DIR).st_ino, kind=3), 2)  # all local
    kernel.poll(0)
    agent.cycle()
    assert remote_points(agent) == {
        ("trainer-0", "platform:vgem", "alloc"): 3,
        ("trainer-0", "platform:vgem", "wait"): 0,
    }
    assert values(agent.metrics, IOCTL) == {(*POD, "alloc"): 5, (*POD, "wait"): 2}
    clock.now += 5
    kernel.calls(pod, 2, remote=2)
    agent.cycle()
    assert remote_points(agent)[("trainer-0", "platform:vgem", "alloc")] == 5
    clock.now += 5
    agent.cycle()  # an idle read: the same totals
    assert remote_points(agent)[("trainer-0", "platform:vgem", "alloc")] == 5


def test_a_device_without_a_numa_node_has_no_remote_series_and_says_so_once(
    cgroups, resolver, caplog
):
    """numa_node -1 (or none: an integrated GPU, a single-node machine): the kernel counts no
    call of it remote, the agent exports no remote series for it, and says why once, at start,
    with the other lines about its devices (not for a device on a node)."""
    caplog.set_level(logging.INFO)
    wiring._log_tables([replace(VGEM, numa_node=-1), replace(VGEM, id="0000:22:01.0", numa_node=1)])
    kernel, clock = FakeKernel(aggregate=True), Clock()
    agent = make_agent(kernel, resolver, clock, device=replace(VGEM, numa_node=-1))
    agent.attach()
    kernel.calls(key(os.stat(cgroups / POD_DIR).st_ino), 5)
    kernel.poll(0)
    for _ in range(2):
        agent.cycle()
        clock.now += 5
    assert remote_points(agent) == {}
    assert values(agent.metrics, IOCTL) == {(*POD, "alloc"): 5}
    said = [r.getMessage() for r in caplog.records if "NUMA node" in r.getMessage()]
    assert said == [
        "device platform:vgem has no NUMA node (numa_node -1): its calls are not counted as "
        "remote or local, and kubenpu_ioctl_remote_node_total has no series for it"
    ]


def one_timed_call(cgroups, resolver):  # type: ignore[no-untyped-def]
    """An attached agent whose pod made one timed wait (not read yet)."""
    kernel, clock = FakeKernel(aggregate=True), Clock()
    agent = make_agent(kernel, resolver, clock)
    agent.attach()
    pod = key(os.stat(cgroups / POD_DIR).st_ino, kind=3)
    kernel.calls(pod, 1)
    kernel.timed(pod, [50_000])
    kernel.poll(0)
    return agent, kernel, clock, pod


def test_durations_the_store_did_not_take_are_offered_again(cgroups, resolver, monkeypatch):
    """A key whose durations the store refused (its series not counted yet, or capped) is
    offered again at the next read although its value did not change."""
    agent, _, clock, _ = one_timed_call(cgroups, resolver)
    taken = agent.metrics.put
    offers: list[bool] = []

    def spy(family, *args):  # type: ignore[no-untyped-def]
        if family is not DURATIONS:
            return taken(family, *args)
        offers.append(taken(family, *args) if len(offers) else False)  # the first not taken
        return offers[-1]

    monkeypatch.setattr(agent.metrics, "put", spy)
    for _ in range(3):  # not taken, then taken, then unchanged: skipped
        agent.cycle()
        clock.now += 5
    assert offers == [False, True]
    [hist] = values(agent.metrics, IOCTL_DURATION).values()
    assert hist.count == 1


def test_durations_no_count_or_cgroup_claims_take_one_walk_and_leave_the_map(cgroups, resolver):
    """Keys of gone cgroups with no count (a pinned map's, left by an earlier agent): 2,000 of
    them walked a tree of 10,000 directories one key at a time, past /healthz's 30 s, and were
    kept for good. One walk for them all; then they are deleted, counted, and walk no more."""
    for n in range(500):  # a tree the walk takes a moment over
        (cgroups / "kubepods/besteffort" / f"pod{n}").mkdir()
    agent, kernel, clock, pod = one_timed_call(cgroups, resolver)
    orphans = [key(10**12 + n, kind=3) for n in range(300)]  # no such cgroup, no count
    for orphan in orphans:
        kernel.timed(orphan, [50_000])
    walks = resolver.rebuilds
    agent.cycle()
    assert resolver.rebuilds == walks + 1
    assert values(agent.metrics, DURATIONS_FORGOTTEN) == {(): 300}
    assert set(kernel.durations) == {pod}  # the counted pod's key stays
    [hist] = values(agent.metrics, IOCTL_DURATION).values()
    assert hist.count == 1
    clock.now += 5
    agent.cycle()
    assert resolver.rebuilds == walks + 1
    assert values(agent.metrics, DURATIONS_FORGOTTEN) == {(): 300}


def test_unchanged_durations_are_not_set_again_until_the_store_drops_a_pod(cgroups, resolver):
    """Idle costs nothing per key: a read whose durations did not move sets none of them; once
    the store has dropped a pod (its stored values with it), every key is set again."""
    agent, kernel, clock, pod = one_timed_call(cgroups, resolver)
    agent.cycle()
    set_calls: list[Key] = []
    real_put = agent.metrics.put

    def spy(family, where, kind, value):  # type: ignore[no-untyped-def]
        if family is DURATIONS:
            set_calls.append(value[0])  # (key, durations)
        return real_put(family, where, kind, value)

    agent.metrics.put = spy  # type: ignore[method-assign]
    for _ in range(3):
        clock.now += 5
        agent.cycle()
    assert set_calls == []
    kernel.timed(pod, [60_000])
    clock.now += 5
    agent.cycle()
    assert set_calls == [pod]
    agent.metrics._swept = True  # as _sweep() does when it drops a pod
    clock.now += 5
    agent.cycle()
    assert set_calls == [pod, pod]
    [hist] = values(agent.metrics, IOCTL_DURATION).values()
    assert hist.count == 2


@pytest.mark.parametrize("pinned", [False, True])
def test_the_probes_pinning_is_a_metric_once_attached(pinned):
    """A read-only bpffs once left the probe unpinned with one warning and no metric."""
    kernel = FakeKernel()
    kernel.pinned = pinned
    agent = make_agent(kernel, FakeResolver())
    assert values(agent.metrics, PROBE_PINNED) == {}
    agent.attach()
    assert values(agent.metrics, PROBE_PINNED) == ({(): 1} if pinned else {})
