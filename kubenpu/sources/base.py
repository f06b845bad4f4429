"""The signal sources: one room per signal, each behind the small Source protocol, and what the
framework does for every one of them alike (node_exporter's `execute`, Kepler's service
interfaces).

A source is any object with a `name`. What it does beyond that, it says by the optional
capabilities it has (checked at run time, so a source implements only what it needs):
- `Reads`: `read()` runs on the attribution thread every `fdinfo.interval_seconds`, in the
  registry's order (telemetry after usage: the energy split takes usage's busy time);
- `Runs`: `start() -> Worker` starts its own thread, which Health watches by the source's name
  (None: it did not start, and said why in one line);
- `Closes`: `close()` at the agent's stop, the last started first (Services);
- `Sees`: `saw(tgids, cgroup_ids)`: what the probe saw calling since the last flush;
- `Born`: `born(births)`: the cgroups (id, parent id) the probe saw made, on its polling thread
  (a hand-over that never waits);
- `Ticks`: `tick()` on the attribution thread after each interval's reads: a hand-over to the
  source's own thread that never waits (telemetry's busy time), not a read;
- `Finishes`: `finish()` once at the stop, after the last count: a read of cumulative kernel
  values that must not be lost (the GPU jobs').

A source is built by its module's `build(node) -> Source | None` (None: its config turns it
off), from the Node: the config, the table, the devices, the resolver and attribution, and the
sources built before it (kubenpu.sources.registry's order). One that reads on its own thread
keeps a Report of its own.

Every read, inline or on a source's own thread, goes through the source's `Report`: its stamp
(kubenpu_counters_read_timestamp_seconds{source}, which `kubenpuctl top` rates by), its duration
(kubenpu_source_read_duration_seconds{source}), its failures (kubenpu_source_errors_total{source},
logged once a streak); its skips by reason go to a family of its own (`by_label`).

This module imports no source: kubenpu.sources.registry lists them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from kubenpu.metrics.own import SOURCE_DURATION, SOURCE_FAILED, STAMPS
from kubenpu.metrics.series import Series
from kubenpu.services import Streak, Worker

if TYPE_CHECKING:
    from kubenpu.config import Config
    from kubenpu.discovery import Device
    from kubenpu.resolve.hold import Resolve
    from kubenpu.sources.activity import Activity
    from kubenpu.sources.calls.attribution import Attributor

log = logging.getLogger("kubenpu")


class Source(Protocol):
    name: str


@runtime_checkable
class Reads(Protocol):
    name: str

    def read(self) -> object: ...


@runtime_checkable
class Runs(Protocol):
    name: str

    def start(self) -> Worker | None: ...


@runtime_checkable
class Closes(Protocol):
    def close(self) -> None: ...


@runtime_checkable
class Sees(Protocol):
    def saw(self, tgids: Iterable[int], cgroup_ids: Iterable[int]) -> None: ...


@runtime_checkable
class Born(Protocol):
    def born(self, births: Iterable[tuple[int, int]]) -> None: ...


@runtime_checkable
class Ticks(Protocol):
    def tick(self) -> None: ...


@runtime_checkable
class Finishes(Protocol):
    def finish(self) -> object: ...


class Report:
    """What the framework keeps of one source's reads: `read(step)` runs one read guarded, timed
    and stamped. (What a read skips, a source counts in its own family by reason: their reasons
    differ.)"""

    def __init__(
        self,
        name: str,
        table: Series,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.name = name
        self._table = table
        self._clock = clock
        self._wall = wall
        self._streak = Streak(f"reading {name}", log)
        table.set(SOURCE_FAILED, name, 0)  # a series from the start: an alert sees the first

    def read(self, step: Callable[[], object]) -> bool:
        """One read: True if it returned. A failure is counted and logged (once a streak), never
        raised: no read may stop the loop that runs it. Its success stamps the source's
        counters with the time the read started; a step that returns False had nothing to
        bring up to date (a peer that did not answer, counted by the source) and is not
        stamped."""
        try:
            at, started = self._wall(), self._clock()
            if step() is False:
                return False
        except Exception as exc:
            self._table.set(SOURCE_FAILED, self.name, 1)
            self._streak.failed(exc)
            return False
        self._streak.ok()
        self._table.set(SOURCE_DURATION, self.name, self._clock() - started)
        self._table.set(STAMPS, self.name, at)
        return True


@dataclass
class Node:
    """What a source's `build()` is given."""

    cfg: Config
    table: Series
    found: list[Device]  # every device discovered
    watched: list[Device]  # those not ignored by config: fdinfo, telemetry, allocations
    resolver: Resolve
    attributor: Attributor
    activity: Activity | None  # allocations' signals of use, while allocations run
    built: dict[str, Source] = field(default_factory=dict)  # the sources built so far, by name
