"""kubenpuctl top's rates against the agent's own loop and /metrics server, on a fake clock.

The agent reads the kernel's counts every 5 s; top scrapes every 2 s. Dividing each scrape's
change by top's own clock read a steady 100 calls/s as 0, 248, 0, 249, 0 over five `--once`
runs. Here the real Agent loop, series table and metrics server run; the kernel is FakeKernel
and the CRI FakeResolver (both tested elsewhere), and one fake clock drives the agent, its stamps
and top, so no test sleeps or measures time.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakes import Clock, FakeKernel, FakeResolver
from helpers import make_config, start_telemetry

from kubenpu.agent.health import Health
from kubenpu.agent.loop import Agent
from kubenpu.cli import top
from kubenpu.cli.top.view import _View
from kubenpu.discovery import Device, Node
from kubenpu.resolve import Attribution
from kubenpu.sources.calls.attribution import Attributor
from kubenpu.sources.calls.events import Key, Tally
from kubenpu.sources.calls.probe import Probe

VGEM = Device("platform:vgem", None, None, None, (Node("/dev/dri/card0", "card0", 226, 0),), "vgem")
POD = Key(4242, 226, 0, 1)  # a submit call of cgroup 4242
RATE = 100.0  # calls per second the pod makes
CYCLE = 0.5  # the agent's attribution cycle (loop._FLUSH_SECONDS)
EPOCH = 1.8e9  # the agent's Unix time at the fake clock's zero


class Node1:
    """One node: a pod calling at RATE, the agent's loop every CYCLE, its /metrics served."""

    def __init__(self, tmp_path: Path, aggregate: bool = True) -> None:
        self.clock = Clock(0.0)
        text = "export:\n  prometheus:\n    host: 127.0.0.1\n"
        self.exporters = start_telemetry(make_config(tmp_path, text), self.clock)
        metrics = self.exporters.metrics
        self.kernel = FakeKernel(aggregate=aggregate)
        resolver = FakeResolver()
        resolver.answers[POD.cgroup_id] = Attribution("ml", "trainer-0", "main")
        tally = Tally(1 << 16)
        self.agent = Agent(
            probe=Probe(self.kernel, tally),
            tally=tally,
            attributor=Attributor([VGEM], resolver, metrics, clock=self.clock),
            metrics=metrics,
            resolver=resolver,
            health=Health(stale_after=15, clock=self.clock),
            devices=1,
            clock=self.clock,
            wall=lambda: EPOCH + self.clock.now,
        )
        self.agent.attach()
        self.url = f"http://127.0.0.1:{self.exporters.server.port}/metrics"
        self._next = 0.0

    def advance(self, seconds: float) -> None:
        """`seconds` of the node's life: each cycle first gets the calls made since the last."""
        end = self.clock.now + seconds
        while self._next <= end + 1e-9:
            self.clock.now = self._next
            if self._next > 0:
                self.kernel.calls(POD, int(RATE * CYCLE))
            self.agent.probe.poll(0)
            self.agent.cycle()
            self._next += CYCLE
        self.clock.now = end

    def source(self) -> top.ScrapeSource:
        return top.ScrapeSource(self.url, clock=self.clock)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node1]:
    n = Node1(tmp_path)
    yield n
    n.exporters.shutdown()


def pod_rate(rows: list[dict]) -> float:
    (row,) = [r for r in rows if r["pod"] == "trainer-0"]
    return sum(row["calls_per_second"].values())


@pytest.mark.parametrize("start", [0.25, 1.0, 2.6, 4.9, 7.3])
def test_once_rates_are_the_pods_whatever_the_phase(node: Node1, start: float) -> None:
    """Five `--once` runs, started at different points between the agent's reads."""
    node.advance(10.0 + start)  # the first full read is long done
    out = top.once(node.source(), 2.0, "json", "total", sleep=node.advance)
    assert pod_rate(json.loads(out)) == pytest.approx(RATE, rel=0.05)


def test_five_once_runs_in_a_row(node: Node1) -> None:
    node.advance(5.0)
    rates = []
    for _ in range(5):
        rates.append(
            pod_rate(json.loads(top.once(node.source(), 2.0, "json", "total", sleep=node.advance)))
        )
        node.advance(1.3)
    assert rates == [pytest.approx(RATE, rel=0.05)] * 5


def screen_rate(lines: list[str]) -> float | None:
    """The pod's TOTAL on screen; None while top is still measuring."""
    if any("measuring..." in line for line in lines):
        return None
    head = next(i for i, line in enumerate(lines) if line.startswith("NAMESPACE"))
    titles = lines[head].split()
    (row,) = [line.split() for line in lines[head + 1 :] if "trainer-0" in line]
    return float(row[titles.index("TOTAL*")])


def test_every_live_frame_after_the_first_full_read(node: Node1) -> None:
    view = _View(node.source(), 2.0, "total")
    rates = []
    for _ in range(60):  # 30 s: 15 reads by top, 6 by the agent
        view.step(node.clock.now)
        if view.frame is not None:
            rates.append(screen_rate(view.lines(80, 24)[0]))
        node.advance(CYCLE)
    assert not view.error
    first = next(i for i, r in enumerate(rates) if r is not None)
    assert first <= 12 * 2  # measuring for the agent's first two reads only
    assert rates[first:] == [pytest.approx(RATE, rel=0.05)] * (len(rates) - first)


def test_events_mode_rates_too(tmp_path: Path) -> None:
    """Events mode counts at every flush: its stamp moves every cycle."""
    node = Node1(tmp_path, aggregate=False)
    try:
        node.advance(3.0)
        out = top.once(node.source(), 2.0, "json", "total", sleep=node.advance)
        assert pod_rate(json.loads(out)) == pytest.approx(RATE, rel=0.05)
    finally:
        node.exporters.shutdown()


def test_once_gives_up_on_an_agent_that_stopped_reading(node: Node1) -> None:
    node.advance(6.0)
    with pytest.raises(top.TopError, match="has not read its counters again in 16 s"):
        top.once(
            node.source(),
            2.0,
            "json",
            "total",
            sleep=lambda s: setattr(node.clock, "now", node.clock.now + s),
        )


def test_every_rated_family_has_a_source() -> None:
    from kubenpu.cli.top import sources
    from kubenpu.metrics import catalogue

    assert set(sources.SOURCES) == set(catalogue.COUNTER_SOURCES)
    assert sorted(n for names in sources.SOURCES.values() for n in names) == sorted(top.RATED)
