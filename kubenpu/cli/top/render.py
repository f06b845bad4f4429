"""kubenpuctl top's rendering: columns, their fit to the terminal's width, the header, JSON rows,
and one frame printed (--once)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from kubenpu.cli.top.frames import Behind, Frame, Row, build_frame, sort_rows
from kubenpu.cli.top.sources import POD_LABELS, Source, TopError
from kubenpu.text import iec_bytes, printable


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds // 60:.0f}m"
    return f"{seconds // 3600:.0f}h{seconds % 3600 // 60:02.0f}m"


# --- rendering ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Column:
    title: str
    sort: str  # the SORTS entry this column sorts by
    cell: Callable[[Row], str]
    priority: int  # the lowest goes first when the terminal is too narrow; see OPTIONAL
    shrink_to: int = 0  # names shrink to this width before any column is dropped
    numeric: bool = True


OPTIONAL = 30  # columns below this priority go before any name is shortened
# Per-engine busy columns go first; when they do, one BUSY% column (the busiest engine) takes
# their place, kept before the per-kind rates.
ENGINE_PRIORITY = 40


def fmt_ms(seconds: float | None) -> str:
    """A bucket bound in milliseconds; ">64s" past the last; "-" for none."""
    if seconds is None:
        return "-"
    if seconds == float("inf"):
        return ">64s"
    ms = seconds * 1000
    return f"{ms:.3g}" if ms < 100 else f"{ms:.0f}"


def fmt_behind(r: Row) -> str:
    """`ns/pod 73%`: whom the row's jobs waited behind most, and its share of their wait."""
    return "-" if r.behind is None else f"{r.behind.who} {100 * r.behind.share:.0f}%"


def fmt_rate(x: float) -> str:
    if x >= 9999.5:
        return f"{x / 1000:.1f}k"
    return f"{x:.0f}" if x >= 99.95 else f"{x:.1f}"


def columns(frame: Frame, multi_node: bool, per_engine: bool = True) -> list[Column]:
    """The frame's columns, each with its priority on a narrow terminal: the names, the total,
    then what a pod does to the device (busy, memory, power) before the per-kind rates.
    Busy is one column per engine (`per_engine`), or the busiest engine's."""

    def name(title: str, attr: str, priority: int, shrink_to: int) -> Column:
        def cell(r: Row) -> str:
            # PCI domain 0000 is nearly universal: without it 80 columns hold longer pod names.
            return getattr(r.key, attr).removeprefix("0000:") or "-"

        return Column(title, attr, cell, priority, shrink_to, numeric=False)

    def rate(title: str, kind: str, priority: int) -> Column:
        return Column(title, kind, lambda r: fmt_rate(r.rates[kind]), priority)

    def busy(engine: str) -> Column:
        def cell(r: Row) -> str:
            return f"{r.busy[engine]:.1f}" if engine in r.busy else "-"

        return Column(f"{engine.upper()}%", "busy", cell, ENGINE_PRIORITY)

    cols = [name("NODE", "node", 85, 6)] if multi_node else []
    cols += [
        name("NAMESPACE", "namespace", 90, 4),
        name("POD", "pod", 100, 8),
        name("CONTAINER", "container", 70, 4),
        name("DEVICE", "device", 80, 7),
        name("VENDOR", "vendor", 10, 6),
        Column("TOTAL", "total", lambda r: fmt_rate(r.total), 95),
        rate("SUBMIT/s", "submit", 60),
        rate("ALLOC/s", "alloc", 50),
        rate("WAIT/s", "wait", 55),
    ]
    if frame.engines and per_engine:
        cols += [busy(e) for e in frame.engines]
    elif frame.engines:
        cols.append(Column("BUSY%", "busy", lambda r: f"{r.max_busy:.1f}" if r.busy else "-", 78))
    if frame.has_memory:
        cols.append(Column("MEM", "memory", lambda r: iec_bytes(r.mem) if r.memory else "-", 76))
    if frame.has_energy:
        watts = Column("W", "power", lambda r: "-" if r.watts is None else fmt_rate(r.watts), 74)
        cols.append(watts)
    if frame.has_durations:
        cols.append(Column("WAIT p99", "p99", lambda r: fmt_ms(r.wait_p99), 58))
        cols.append(Column("ERR/s", "errors", lambda r: fmt_rate(r.errors), 57))
    if frame.has_jobs:
        cols.append(Column("QUEUE p99", "queue", lambda r: fmt_ms(r.queue_p99), 61))
        cols.append(Column("RUN p99", "run", lambda r: fmt_ms(r.run_p99), 59))
    if frame.has_behind:  # a name and a share: it shrinks, keeping both ends, before it goes
        cols.append(Column("BEHIND", "behind", fmt_behind, 62, shrink_to=10, numeric=False))
    if frame.has_allocations:  # SHARES, not ALLOC: ALLOC/s is the alloc-class call rate
        cols.append(Column("SHARES", "shares", lambda r: f"{r.shares or 0:g}", 65))
        cols.append(Column("IDLE FOR", "idle", lambda r: fmt_duration(r.idle_for), 64))
    return cols


def layout(cols: list[Column], rows: list[Row], width: int) -> list[tuple[Column, int]]:
    """Fit the columns in `width`: drop optional columns before any name is cut, then the
    least important until the rest fit with their names shrunk, then shrink the widest names
    only as far as needed."""
    natural = [max([len(c.title), *(len(c.cell(r)) for r in rows)]) for c in cols]
    least = [
        n if c.numeric else min(n, max(c.shrink_to, len(c.title)))
        for c, n in zip(cols, natural, strict=True)
    ]

    def used(ws: list[int], keep: list[int]) -> int:
        return sum(ws[i] for i in keep) + 2 * (len(keep) - 1)

    keep = list(range(len(cols)))
    while used(natural, keep) > width and min(cols[i].priority for i in keep) < OPTIONAL:
        keep.remove(min(keep, key=lambda i: cols[i].priority))
    while len(keep) > 1 and used(least, keep) > width:
        keep.remove(min(keep, key=lambda i: cols[i].priority))
    widths = list(natural)
    while used(widths, keep) > width:
        widest = max(keep, key=lambda i: widths[i] - least[i])
        if widths[widest] == least[widest]:
            break  # one column wider than the terminal: curses cuts the line
        widths[widest] -= 1
    return [(cols[i], widths[i]) for i in keep]


def _fit(text: str, width: int, numeric: bool) -> str:
    if len(text) > width:  # keep both ends of a name: pods differ in their suffix
        head = (width - 1) // 2
        text = text[:head] + "~" + text[len(text) - (width - 1 - head) :]
    return text.rjust(width) if numeric else text.ljust(width)


def table(
    frame: Frame, sort: str, width: int, reverse: bool = False, multi_node: bool = False
) -> list[str]:
    """The column titles and one line per row, the sort column's title marked with `*`."""
    rows = sort_rows(frame.rows, sort, reverse)

    def fitted(per_engine: bool) -> list[tuple[Column, int]]:
        cols = [
            replace(c, title=c.title + "*", priority=1000) if c.sort == sort else c
            for c in columns(frame, multi_node, per_engine)
        ]
        return layout(cols, rows, width)

    fit = fitted(per_engine=True)
    if sum(c.sort == "busy" for c, _ in fit) < len(frame.engines):  # not all engines fit
        fit = fitted(per_engine=False)
    lines = ["  ".join(_fit(c.title, w, c.numeric) for c, w in fit)]
    for r in rows:
        lines.append("  ".join(_fit(printable(c.cell(r)), w, c.numeric) for c, w in fit))
    return [line.rstrip() for line in lines]


def header(frame: Frame, source: Source, interval: float) -> list[str]:
    nodes = ", ".join(frame.nodes) if len(frame.nodes) <= 3 else f"{len(frame.nodes)} nodes"
    versions = ", ".join(frame.versions) or "-"
    # Distinct devices; the count is per node.
    devices = ", ".join(sorted({f"{d} {v or '-'}" for _, d, v in frame.devices})) or "-"
    first = f"kubenpu top - node {nodes} - agent {versions} - every {interval:g}s - {source.url}"
    calls = "measuring..." if frame.measuring else f"{fmt_rate(frame.calls)} calls/s"
    status = (
        f"{calls}  dropped {frame.dropped:.0f} ({fmt_rate(frame.dropped_rate)}/s)"
        f"  unattributed {frame.unattributed:.0f} ({fmt_rate(frame.unattributed_rate)}/s)"
    )
    if frame.overflow:
        status += f"  overflow {frame.overflow:.0f}"
    if frame.held:  # not in any row yet: without this a wrong CRI socket looks like idle pods
        status += f"  held for the CRI {frame.held:.0f} (oldest {frame.held_age:.0f}s)"
    if frame.malformed:
        status += f"  malformed lines {frame.malformed}"
    return [
        printable(line) for line in (first, f"devices ({len(frame.devices)}): {devices}", status)
    ]


def rows_json(frame: Frame, sort: str, multi_node: bool) -> list[dict[str, object]]:
    out = []
    for r in sort_rows(frame.rows, sort):
        row: dict[str, object] = {"node": r.key.node} if multi_node else {}
        row.update({k: getattr(r.key, k) for k in POD_LABELS})
        row["calls_per_second"] = {k: round(v, 3) for k, v in r.rates.items()}
        if frame.engines:  # like fdinfo: only the engines and regions the row has
            row["busy_percent"] = {e: round(pct, 3) for e, pct in sorted(r.busy.items())}
        if frame.has_memory:
            row["memory_bytes"] = {
                region: {state: int(b) for state, b in states.items()}
                for region, states in sorted(r.memory.items())
            }
        if frame.has_allocations:
            row["allocated"] = {"shares": r.shares or 0, "idle_for_seconds": r.idle_for}
        if frame.has_energy:
            row["power_watts"] = None if r.watts is None else round(r.watts, 3)
        if frame.has_durations:
            row["wait_p99_seconds"] = r.wait_p99
            row["errors_per_second"] = round(r.errors, 3)
        if frame.has_jobs:
            row["queue_p99_seconds"] = r.queue_p99
            row["run_p99_seconds"] = r.run_p99
        if frame.has_behind:
            who = None if r.behind is None else r.behind.who
            row["behind"] = {"who": who, "share_percent": _percent(r.behind)}
        out.append(row)
    return out


def _percent(behind: Behind | None) -> float | None:
    return None if behind is None else round(100 * behind.share, 3)


# --- the two modes -----------------------------------------------------------------------


# How long --once waits for the agent's next reads: three of its 5 s reads of the kernel.
ONCE_WAIT = 15.0


def once(
    source: Source,
    interval: float,
    output: str,
    sort: str,
    width: int = 10**6,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """Read every `interval` until every source the agent stamps has rates (a scrape: two of
    the agent's reads), for at most ONCE_WAIT past the first; print one frame that fits
    `width`. TopError when the calls have no rate by then."""
    reading, waited = source.read(), 0.0
    while (reading.rates is None or reading.unrated) and waited < max(ONCE_WAIT, interval):
        sleep(interval)
        waited += interval
        reading = source.read()
    if reading.rates is None:
        raise TopError(
            f"{source.url}: the agent has not read its counters again in {waited:g} s (is it "
            "live? see its /healthz)"
        )
    frame = build_frame(reading, source.multi_node)
    if output == "json":
        return json.dumps(rows_json(frame, sort, source.multi_node), indent=2)
    return "\n".join(
        [
            *header(frame, source, interval),
            "",
            *table(frame, sort, width, multi_node=source.multi_node),
        ]
    )
