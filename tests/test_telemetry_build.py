"""kubenpu.sources.telemetry as the agent wires it (build(): its config, the root, the deadline,
the thread's staleness, the fdinfo and uevents sources it takes busy time and wedges from), and
what mutmut's survivors showed untested: each step's beat, the wait left of the deadline, the
start of the telemetry's points, a refused pod share, a read that returns nothing."""

from __future__ import annotations

import logging
import shutil
import threading
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import ClassVar

import pytest
from fakes import Clock as FakeClock
from fakes import assert_stalls_after, fake_node
from helpers import eventually, make_config, values
from test_telemetry import SECOND, TESTDATA, Clock, xe_energy
from test_telemetry_loop import POD, XE

from kubenpu.discovery import discover
from kubenpu.metrics.catalogue import (
    DEVICE_STATUS,
    FDINFO_SKIPPED,
    POD_ENERGY,
    TELEMETRY_SPECS,
    TELEMETRY_STALE,
    TEMPERATURE,
)
from kubenpu.services import Worker
from kubenpu.sources import energy
from kubenpu.sources import telemetry as telemetry_module
from kubenpu.sources import usage as usage_module
from kubenpu.sources import wedges as wedges_module
from kubenpu.sources.base import Node
from kubenpu.sources.registry import table
from kubenpu.sources.sysfs import read_device
from kubenpu.sources.telemetry import Telemetry, build

AMD = ("0000:02:00.0", "0000:c3:00.0")  # amd-server's two devices, in discovery order


def configured(tmp_path: Path, settings: str = "", machine: str = "intel-arc-xe") -> Node:
    """A Node (tests/fakes.py's fake_node) that discovered a copy of `machine` under its
    discovery root, its config `settings` (YAML beside the root)."""
    root = tmp_path / "root"
    shutil.copytree(TESTDATA / machine, root, symlinks=True)
    cfg = make_config(tmp_path, f"discovery:\n  root: {root}\n{settings}")
    return fake_node(cfg, discover(root))


def status(node: Node) -> dict[str, str]:
    """Each device's hw.status state now."""
    return {k[0]: k[-1] for k, v in values(node.table, DEVICE_STATUS).items() if v}


class Waits(threading.Event):
    """threading.Event, recording each timed wait's timeout."""

    timeouts: ClassVar[list[float]] = []

    def wait(self, timeout: float | None = None) -> bool:
        if timeout is not None:
            Waits.timeouts.append(timeout)
        return super().wait(timeout)


def fake_time(monkeypatch: pytest.MonkeyPatch, *readings: float) -> list[float]:
    """telemetry's time.monotonic() answers `readings` in turn (the last one from then on), and
    its Events record their timed waits: the list returned."""
    answers = iter(readings)

    def monotonic() -> float:
        nonlocal last
        last = next(answers, last)
        return last

    last = readings[0]
    monkeypatch.setattr(telemetry_module, "time", SimpleNamespace(monotonic=monotonic))
    monkeypatch.setattr(Waits, "timeouts", [])
    real = SimpleNamespace(Event=Waits, Thread=threading.Thread, Lock=threading.Lock)
    monkeypatch.setattr(telemetry_module, "threading", real)
    return Waits.timeouts


# --- build() -------------------------------------------------------------------------------------


def test_build_makes_no_source_when_disabled(tmp_path: Path) -> None:
    assert build(configured(tmp_path / "off", "telemetry:\n  enabled: false\n")) is None
    assert isinstance(build(configured(tmp_path / "on")), Telemetry)


def test_the_built_source_reads_the_watched_devices_under_the_discovery_root(
    tmp_path: Path,
) -> None:
    node = configured(tmp_path)  # no fdinfo or uevents source built: neither is needed
    tel = build(node)
    assert tel is not None
    tel.sample({})
    [device] = node.watched
    fixture = {v for s, _, v in read_device(device, tmp_path / "root").values if s is TEMPERATURE}
    assert fixture  # the fixture's sensors, read under the root, not under /
    assert set(values(node.table, TEMPERATURE).values()) == fixture
    assert status(node) == {XE: "ok"}  # no wedges source: no device is failed


def test_the_built_source_fails_a_device_the_uevents_source_saw_wedged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = configured(tmp_path, machine="amd-server")
    wedges = wedges_module.build(node)
    assert wedges is not None
    monkeypatch.setattr(wedges, "wedged", lambda device: device == AMD[1])
    node.built["uevents"] = wedges
    tel = build(node)
    assert tel is not None
    tel.sample({})
    assert status(node) == {AMD[0]: "ok", AMD[1]: "failed"}


def test_the_built_source_splits_energy_by_the_fdinfo_sources_busy_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = configured(tmp_path)
    usage = usage_module.build(node)
    assert usage is not None
    # Busy far past any interval: the pod's share is the whole rise, whatever the real clock.
    monkeypatch.setattr(usage, "interval_busy", lambda: {XE: {POD: [10**15, 0, 0]}})
    node.built["fdinfo"] = usage
    tel = build(node)
    assert tel is not None
    counter = xe_energy(tmp_path / "root")
    counter.write_text("1000000\n")
    tel.start()
    try:
        tel.tick()
        eventually(lambda: status(node) or None, "the baseline read")
        counter.write_text("1000100\n")  # 100 µJ: plausible in any interval a read takes
        tel.tick()
        pods = ("namespace", "container", "device", "vendor")
        eventually(lambda: values(node.table, POD_ENERGY, pods) == {("a",): 1e-4}, "a's 100 µJ")
    finally:
        tel.close()
    assert not values(node.table, FDINFO_SKIPPED)  # a share taken is no out_of_range skip


def test_the_built_sources_reads_wait_the_configured_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    waits = fake_time(monkeypatch, 0.0)  # no time passes while it reads
    tel = build(configured(tmp_path, "telemetry:\n  deadline_seconds: 0.25\n"))
    assert tel is not None
    tel.sample({})
    assert waits == [0.25]  # 1 s by default


def test_the_built_thread_is_stalled_past_three_intervals_and_the_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step per fdinfo interval, each read within the deadline: three intervals and the
    deadline without a step fail liveness (5 s and 1 s: 16 s)."""
    clock = FakeClock()
    monkeypatch.setattr(telemetry_module, "Worker", partial(Worker, clock=clock))
    settings = "fdinfo:\n  interval_seconds: 5\ntelemetry:\n  deadline_seconds: 1\n"
    tel = build(configured(tmp_path, settings))
    assert tel is not None
    worker = tel.start()  # no tick: its thread waits, and its beat is the start's
    try:
        assert worker.name == "telemetry"
        assert_stalls_after(worker, clock, 16)
    finally:
        tel.close()


# --- the thread, sample(), the split ---------------------------------------------------------


def test_each_step_beats_so_a_long_running_thread_stays_live(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shutil.copytree(TESTDATA / "intel-arc-xe", tmp_path, symlinks=True, dirs_exist_ok=True)
    clock, reads = FakeClock(), []
    monkeypatch.setattr(telemetry_module, "Worker", partial(Worker, clock=clock))

    def read(device, root):  # type: ignore[no-untyped-def]
        reads.append(device.id)
        return read_device(device, root)

    tel = Telemetry(
        discover(tmp_path), table(60, 1000), tmp_path, Clock(), read=read, stale_after=30
    )
    worker = tel.start()
    try:
        tel.submit({})
        eventually(lambda: len(reads) >= 1, "the first read")
        clock.now += 3600  # an hour of steps since
        # The second read is the second step's, woken by this submit: its beat came first.
        tel.submit({})
        eventually(lambda: len(reads) >= 2, "the second read")
        assert worker.broken() is None
    finally:
        tel.close()


def test_each_device_waits_what_is_left_of_the_deadline_and_none_once_it_is_past(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shutil.copytree(TESTDATA / "amd-server", tmp_path, symlinks=True, dirs_exist_ok=True)
    release = threading.Event()

    def read(device, root):  # type: ignore[no-untyped-def]
        if device.id == AMD[1]:
            release.wait(60)  # a driver in a reset
        return read_device(device, root)

    # The deadline is set at 0 (60 s on), the first device waited for at 2, the second at 100.
    waits = fake_time(monkeypatch, 0.0, 2.0, 100.0)
    metrics = table(60, 1000)
    tel = Telemetry(discover(tmp_path), metrics, tmp_path, Clock(), 60.0, read)
    try:
        tel.sample({})
        assert waits == [58.0, 0.0]
        [points] = [p for s, p in metrics.collect() if s is TELEMETRY_STALE]
        assert {p.attrs["device"]: p.value for p in points} == {AMD[0]: 0, AMD[1]: 1}
    finally:
        release.set()


def test_a_pods_share_past_a_double_is_refused_and_counted_out_of_range(tmp_path: Path) -> None:
    shutil.copytree(TESTDATA / "intel-arc-xe", tmp_path, symlinks=True, dirs_exist_ok=True)
    metrics = table(60, 1000)
    tel = Telemetry(discover(tmp_path), metrics, tmp_path, Clock())
    # No driver counter gets here (the meter's total would not render either): the guard alone.
    tel._split(energy.Meter(), 10**309, SECOND, {POD: [SECOND, 0, 0]})
    assert not values(metrics, POD_ENERGY)
    assert values(metrics, FDINFO_SKIPPED) == {("out_of_range",): 1}


def test_the_telemetry_points_start_with_the_nodes_series(tmp_path: Path) -> None:
    shutil.copytree(TESTDATA / "intel-arc-xe", tmp_path, symlinks=True, dirs_exist_ok=True)
    metrics = table(60, 1000)
    Telemetry(discover(tmp_path), metrics, tmp_path, Clock()).sample({})
    snapshot = dict(metrics.collect())
    [start] = {p.start_ns for p in snapshot[FDINFO_SKIPPED]}  # a node counter's
    points = [p for spec in TELEMETRY_SPECS for p in snapshot[spec]]
    assert points and {p.start_ns for p in points} == {start}


def test_a_read_that_returns_nothing_is_logged_as_such_and_its_thread_is_a_daemon(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """sample() called from a thread that is no daemon (here the test's): the reads' threads
    are daemons all the same, and a read with neither a reading nor an error says so."""
    shutil.copytree(TESTDATA / "intel-arc-xe", tmp_path, symlinks=True, dirs_exist_ok=True)
    daemons = []

    def read(device, root):  # type: ignore[no-untyped-def]
        daemons.append(threading.current_thread().daemon)

    assert not threading.current_thread().daemon
    tel = Telemetry(discover(tmp_path), table(60, 1000), tmp_path, Clock(), read=read)
    with caplog.at_level(logging.ERROR, logger="kubenpu.sources.telemetry"):
        tel.sample({})
    assert daemons == [True]
    assert [r.getMessage() for r in caplog.records] == [
        f"reading the telemetry of {XE} failed (retrying): RuntimeError: no reading"
    ]
