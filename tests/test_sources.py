"""The sources' framework (kubenpu/sources/): every source read through its Report (stamp,
duration, failures), built from the registry, and its thread watched by Health by its name."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest
from fakes import Clock, fake_node
from helpers import eventually, make_config
from test_guard_source import GuardKernel

from kubenpu.agent.health import Health
from kubenpu.agent.loop import Agent
from kubenpu.agent.wiring import start
from kubenpu.discovery import discover
from kubenpu.kernel import guard as kernel_guard
from kubenpu.metrics.catalogue import COUNTER_SOURCES, SOURCE_ERRORS, SOURCE_READ_DURATION
from kubenpu.metrics.catalogue import COUNTERS_READ as STAMP
from kubenpu.services import Services, Worker
from kubenpu.sources import registry
from kubenpu.sources.base import Node, Report, Runs

TESTDATA = Path(__file__).parent / "testdata"
EVERY_SOURCE = """\
fdinfo:
  enabled: true
probe:
  jobs: true
telemetry:
  enabled: true
  uevents: true
attribution:
  pod_resources:
    enabled: true
    socket: {socket}
guard:
  mode: audit
"""


def points(table, spec) -> dict[str, float]:
    [found] = [p for s, p in table.collect() if s is spec]
    return {p.attrs["source"]: p.value for p in found}


class Kill(BaseException):
    """What no guard of a source's own catches: its thread dies."""


# --- Report ---------------------------------------------------------------------------------


def test_a_read_is_stamped_with_its_start_and_timed() -> None:
    clock, table = Clock(10.0), registry.table(300, 100)

    def read() -> None:
        clock.now += 0.25

    report = Report("fdinfo", table, clock=clock, wall=lambda: 1234.5 + clock.now)
    assert report.read(read)
    assert points(table, STAMP) == {"fdinfo": 1244.5}  # when it started, not when it ended
    assert points(table, SOURCE_READ_DURATION) == {"fdinfo": 0.25}
    assert points(table, SOURCE_ERRORS) == {"fdinfo": 0}  # there from the start, for alerts


def test_a_failed_read_is_counted_logged_once_a_streak_and_not_stamped(caplog) -> None:
    table = registry.table(300, 100)
    report = Report("jobs", table)

    def fails() -> None:
        raise OSError("gone")

    with caplog.at_level(logging.INFO, logger="kubenpu"):
        assert not report.read(fails)
        assert not report.read(fails)
        assert report.read(lambda: None)
    assert points(table, SOURCE_ERRORS) == {"jobs": 2}
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        "reading jobs failed (retrying): OSError: gone",
        "reading jobs works again after 2 failure(s)",
    ]
    assert set(points(table, STAMP)) == {"jobs"}  # the third read only


def test_a_read_with_nothing_new_is_neither_stamped_nor_an_error() -> None:
    table = registry.table(300, 100)
    assert not Report("allocations", table).read(lambda: False)
    assert points(table, STAMP) == {} and points(table, SOURCE_ERRORS) == {"allocations": 0}


# --- the registry ---------------------------------------------------------------------------


def test_the_stamped_sources_are_those_top_rates_by() -> None:
    # kubenpuctl top imports no agent module: the catalogue's list must be the registry's.
    stamped = ("kernel", *(e.name for e in registry.SOURCES if e.stamped))
    assert stamped == COUNTER_SOURCES


@pytest.fixture
def node(tmp_path: Path, monkeypatch) -> Node:
    # The guard's kernel side on the fake kernel (tests/test_guard_source.py), whatever the
    # host's LSMs: the host's kernel is never given an LSM program here.
    monkeypatch.setattr(kernel_guard, "check", lambda *_: None)
    monkeypatch.setattr(kernel_guard, "GuardKernel", GuardKernel)
    cfg = make_config(tmp_path, EVERY_SOURCE.format(socket=tmp_path / "kubelet.sock"))
    cfg.discovery.root = str(TESTDATA / "intel-arc-xe")
    return fake_node(cfg, discover(cfg.discovery.root))


# The placement feeder is built only where a sched_ext scheduler loads (tests/test_placement.py).
BUILT = [e.name for e in registry.SOURCES if e.name != "placement"]


def test_every_source_is_built_under_its_registry_name(node: Node) -> None:
    sources = registry.build(node)
    assert [s.name for s in sources] == BUILT
    for source in sources:
        close = getattr(source, "close", None)
        if close is not None:
            close()


@pytest.mark.parametrize("name", BUILT)
def test_a_sources_dead_thread_fails_liveness_by_its_name(
    node: Node, name: str, monkeypatch
) -> None:
    sources = registry.build(node)
    [source] = [s for s in sources if s.name == name]
    if not isinstance(source, Runs):
        assert name == "fdinfo"  # read on the attribution thread: the loop's liveness is its
        return

    def die() -> None:
        raise Kill

    # The thread's own body: what start() runs on the Worker.
    body = {
        "jobs": "_attach",
        "uevents": "_run",
        "telemetry": "_loop",
        "allocations": "_loop",
        "guard": "_loop",
    }
    monkeypatch.setattr(source, body[name], die)
    health = Health(stale_after=15)
    with Services(5.0) as services:
        start(sources, services, health)
        live = eventually(lambda: (lambda a: a if not a[0] else None)(health.live()), name)
    assert live == (False, f"worker thread stopped: {name} (Kill)")


# --- Worker ---------------------------------------------------------------------------------


def test_a_worker_that_stops_beating_is_stalled_and_one_that_beats_is_not() -> None:
    clock = Clock(0.0)
    stop = threading.Event()
    worker = Worker("telemetry", stop.wait, stale_after=30, clock=clock)
    worker.start()
    clock.now = 30.0
    assert worker.broken() is None  # the edge itself: not stalled yet
    clock.now = 30.5
    assert worker.broken() == "worker thread stalled: telemetry (no step for 30 s)"
    worker.beat()
    assert worker.broken() is None
    stop.set()
    worker.join(5)
    assert worker.broken() == "worker thread stopped: telemetry"


def test_a_worker_that_may_end_fails_liveness_only_by_an_exception() -> None:
    done = Worker("jobs", lambda: None, lasting=False)
    done.start()
    done.join(5)
    assert done.broken() is None

    def die() -> None:
        raise Kill

    dead = Worker("jobs", die, lasting=False)
    dead.start()
    dead.join(5)
    assert dead.broken() == "worker thread stopped: jobs (Kill)"


def test_only_the_sources_the_loop_reads_get_its_report(node: Node) -> None:
    """uevents never reads through a Report: it exports no read-error series of its own."""
    sources = registry.build(node)
    try:
        Agent(
            probe=None,  # type: ignore[arg-type]
            tally=None,  # type: ignore[arg-type]
            attributor=node.attributor,
            metrics=node.table,
            resolver=node.resolver,  # type: ignore[arg-type]
            health=Health(stale_after=15),
            devices=0,
            sources=sources,
        )
        assert set(points(node.table, SOURCE_ERRORS)) == {
            "fdinfo",
            "jobs",
            "telemetry",
            "allocations",
            "guard",
        }
    finally:
        for source in sources:
            if (close := getattr(source, "close", None)) is not None:
                close()
