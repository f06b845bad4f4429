"""Every signal source and every family the agent exports, one line per source, in the order
the sources are built and read and a snapshot lists their families (after the calls, which the
series table owns): the one place a new signal is added."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from kubenpu.metrics import own
from kubenpu.metrics.series import Family, Series
from kubenpu.sources import allocations, guard, jobs, placement, telemetry, usage
from kubenpu.sources import wedges as uevents
from kubenpu.sources.base import Node, Source
from kubenpu.sources.calls import attribution


@dataclass(frozen=True)
class Entry:
    name: str  # the source's own `name`: its stamp, thread and Report
    build: Callable[[Node], Source | None]
    families: tuple[Family, ...]
    stamped: bool  # its reads stamp kubenpu_counters_read_timestamp_seconds{source}


SOURCES = (
    Entry("fdinfo", usage.build, usage.FAMILIES, stamped=True),
    Entry("jobs", jobs.build, jobs.FAMILIES, stamped=True),
    Entry("uevents", uevents.build, uevents.FAMILIES, stamped=False),
    Entry("telemetry", telemetry.build, telemetry.FAMILIES, stamped=True),  # after fdinfo, uevents
    Entry("allocations", allocations.build, allocations.FAMILIES, stamped=True),
    Entry("guard", guard.build, guard.FAMILIES, stamped=True),
    # Exports nothing: it feeds the opt-in placement scheduler (docs/scheduler.md).
    Entry("placement", placement.build, (), stamped=False),
)
# The calls (probe, events, attribution) are the loop's own, not a registered source: they are
# the hot path. Their stamp is `kernel`.
FAMILIES: tuple[Family, ...] = (
    *attribution.FAMILIES,
    *own.FAMILIES,
    *(family for entry in SOURCES for family in entry.families),
)


def table(
    series_ttl: float, max_series: int, clock: Callable[[], float] = time.monotonic
) -> Series:
    """The series table with every family."""
    return Series(FAMILIES, series_ttl, max_series, clock)


def build(node: Node) -> list[Source]:
    """The sources the config turns on, in the registry's order, each given those before it."""
    for entry in SOURCES:
        source = entry.build(node)
        if source is not None:
            node.built[entry.name] = source
    return list(node.built.values())
