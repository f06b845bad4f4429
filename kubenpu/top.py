"""kubenpuctl top: who is calling the GPU/NPU drivers right now, per pod, container and device.

Reads one agent's /metrics (two scrapes give the rates) or a Prometheus query API (rate() over a
window, across nodes). Standard library only: a small text-format parser, urllib, curses.

Columns follow the metric families the source has: call rates always; busy % per engine and
device memory only when the agent exports the fdinfo families (drivers that print usage stats).
"""

from __future__ import annotations

import contextlib
import json
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, NamedTuple, Protocol

from kubenpu import metrics

if TYPE_CHECKING:
    import curses

IOCTL = metrics.IOCTL.prometheus_name
DEVICE_INFO = metrics.DEVICE_INFO.prometheus_name
DROPPED = metrics.DROPPED.prometheus_name
UNATTRIBUTED = metrics.UNATTRIBUTED.prometheus_name
OVERFLOW = metrics.OVERFLOW_CALLS.prometheus_name
TARGET_INFO = "target_info"  # the OTel resource: service_version, k8s_node_name
# The fdinfo families; top shows them when they appear.
BUSY = metrics.ENGINE_BUSY.prometheus_name  # counter per ...,engine
MEMORY = metrics.MEMORY.prometheus_name  # gauge per ...,region,state
# The allocation families (attribution.pod_resources); top shows them when they appear.
ALLOCATED = metrics.ALLOCATED.prometheus_name  # gauge per ...,resource: shares held
IDLE_FOR = metrics.ALLOCATED_IDLE_FOR.prometheus_name  # gauge: the current idle streak
ENERGY = metrics.POD_ENERGY.prometheus_name  # counter per pod and device: its rate is W
KINDS = ("submit", "alloc", "wait")
POD_LABELS = ("namespace", "pod", "container", "device", "vendor")
RATED = (IOCTL, BUSY, DROPPED, UNATTRIBUTED, ENERGY)


class TopError(Exception):
    """A one-line reason the source cannot be read."""


class Series(NamedTuple):
    name: str
    labels: dict[str, str]
    value: float


# --- the Prometheus text format, as much of it as /metrics needs ---------------------------

_SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+-?\d+)?\s*$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def parse(text: str) -> tuple[list[Series], int]:
    """Samples of a text exposition, and how many non-comment lines could not be read."""
    series, bad = [], 0
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        s = _sample(line)
        if s is None:
            bad += 1
        else:
            series.append(s)
    return series, bad


def _sample(line: str) -> Series | None:
    m = _SAMPLE.match(line)
    if m is None:
        return None
    name, body, value = m.groups()
    labels: dict[str, str] = {}
    pos = 0
    while body and pos < len(body):
        lm = _LABEL.match(body, pos)
        if lm is None:
            return None
        labels[lm[1]] = re.sub(r"\\[\\\"n]", lambda e: _UNESCAPE[e[0]], lm[2])
        pos = lm.end()
    try:
        return Series(name, labels, float(value))
    except ValueError:
        return None


# --- sources -----------------------------------------------------------------------------


@dataclass
class Reading:
    latest: list[Series]  # current values of every series
    rates: list[Series] | None  # per-second rates of the counters; None until two reads
    malformed: int = 0


class Source(Protocol):
    url: str
    multi_node: bool

    def read(self) -> Reading: ...


def _get(url: str, timeout: float, accept: str) -> str:
    req = urllib.request.Request(url, headers={"Accept": accept})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        raise TopError(f"{url}: HTTP {e.code} {e.reason}") from None
    except urllib.error.URLError as e:
        raise TopError(
            f"cannot reach {url}: {getattr(e.reason, 'strerror', 0) or e.reason}"
        ) from None
    except (OSError, ValueError) as e:  # timeouts, resets, a malformed URL
        raise TopError(f"cannot read {url}: {e}") from None


def counter_rates(before: list[Series], after: list[Series], seconds: float) -> list[Series]:
    """Per-second increase of each counter present in `after`. A counter that went down was
    reset (agent restart, series retired and born again) and counts from zero; one absent
    before was born in between. Series gone from `after` (vanished pods) have no rate."""
    old = {(s.name, frozenset(s.labels.items())): s.value for s in before}
    rates = []
    for s in after:
        if s.name in RATED:
            prev = old.get((s.name, frozenset(s.labels.items())), 0.0)
            delta = s.value - prev if s.value >= prev else s.value
            rates.append(Series(s.name, s.labels, delta / seconds))
    return rates


class ScrapeSource:
    """One agent's /metrics; each read() rates the counters against the previous read."""

    multi_node = False

    def __init__(
        self, url: str, timeout: float = 5.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.url = url
        self._timeout = timeout
        self._clock = clock
        self._last: tuple[float, list[Series]] | None = None

    def read(self) -> Reading:
        text = _get(self.url, self._timeout, "text/plain;version=0.0.4")
        at = self._clock()  # the agent snapshots as it answers: client-side set-up is not in it
        latest, bad = parse(text)
        if not any(s.name.startswith("kubenpu_") for s in latest):
            raise TopError(f"{self.url}: no kubenpu_ metrics there (not a KubeNPU agent?)")
        rates = None
        if self._last is not None and at > self._last[0]:
            rates = counter_rates(self._last[1], latest, at - self._last[0])
        self._last = (at, latest)
        return Reading(latest, rates, bad)


class PrometheusSource:
    """A Prometheus-compatible query API: the latest values, and rate() over `window` seconds.
    Rows carry the `node` label the ServiceMonitor adds (the scrape's instance without it)."""

    multi_node = True

    def __init__(self, url: str, window: float = 60.0, timeout: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self._window = window
        self._timeout = timeout

    def read(self) -> Reading:
        latest = self._query(
            f'{{__name__=~"kubenpu_.+"}} or {TARGET_INFO}{{service_name="kubenpu"}}'
        )
        if not latest:
            raise TopError(f"{self.url}: no kubenpu_ series in this Prometheus")
        rates = [
            Series(name, s.labels, s.value)
            for name in RATED
            for s in self._query(f"rate({name}[{self._window:g}s])")
        ]
        return Reading(latest, rates)

    def _query(self, promql: str) -> list[Series]:
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        try:
            body = json.loads(_get(url, self._timeout, "application/json"))
            result = body["data"]["result"]
            return [
                Series(r["metric"].pop("__name__", ""), r["metric"], float(r["value"][1]))
                for r in result
            ]
        except (ValueError, KeyError, TypeError, AttributeError):
            raise TopError(f"{self.url}: not a Prometheus query API answer") from None


# --- one frame: rows and header ----------------------------------------------------------


class RowKey(NamedTuple):
    node: str
    namespace: str
    pod: str
    container: str
    device: str
    vendor: str


@dataclass
class Row:
    key: RowKey
    rates: dict[str, float] = field(default_factory=lambda: dict.fromkeys(KINDS, 0.0))
    busy: dict[str, float] = field(default_factory=dict)  # engine -> % of one engine
    memory: dict[str, dict[str, float]] = field(default_factory=dict)  # region -> state -> B
    shares: float | None = None  # allocated by the kubelet; None: not allocated
    idle_for: float | None = None
    watts: float | None = None  # the pod's share of the device's power (energy per pod)

    @property
    def total(self) -> float:
        return sum(self.rates.values())

    @property
    def max_busy(self) -> float:
        return max(self.busy.values(), default=0.0)

    @property
    def mem(self) -> float:
        """Resident bytes over all regions (total where the driver prints no resident)."""
        return sum(st.get("resident", st.get("total", 0.0)) for st in self.memory.values())


@dataclass
class Frame:
    rows: list[Row]
    nodes: list[str]
    versions: list[str]
    devices: list[tuple[str, str, str]]  # (node, device, vendor)
    engines: list[str]  # busy columns; empty when the family is not exported
    has_memory: bool
    measuring: bool
    has_allocations: bool = False  # no rates yet (the first scrape)
    has_energy: bool = False  # no rates yet (the first scrape)
    calls: float = 0.0
    dropped: float = 0.0
    dropped_rate: float = 0.0
    unattributed: float = 0.0
    unattributed_rate: float = 0.0
    overflow: float = 0.0
    malformed: int = 0


def _key(s: Series, multi_node: bool) -> RowKey:
    node = (s.labels.get("node") or s.labels.get("instance", "")) if multi_node else ""
    return RowKey(node, *(s.labels.get(k, "") for k in POD_LABELS))


def build_frame(reading: Reading, multi_node: bool) -> Frame:
    rows: dict[RowKey, Row] = {}

    def row(s: Series) -> Row:
        key = _key(s, multi_node)
        return rows.setdefault(key, Row(key))

    by_name: dict[str, list[Series]] = defaultdict(list)
    for s in reading.latest:
        by_name[s.name].append(s)
    rated: dict[str, list[Series]] = defaultdict(list)
    for s in reading.rates or ():
        rated[s.name].append(s)
    # The overflow series has no pod, device nor kind: it is in the header, not a row.
    for s in by_name[IOCTL]:  # idle pods too: their counters exist but did not move
        if s.labels.get("kind") in KINDS:
            row(s)
    for s in rated[IOCTL]:
        if s.labels.get("kind") in KINDS:
            row(s).rates[s.labels["kind"]] += s.value
    for s in rated[BUSY]:
        busy = row(s).busy
        engine = s.labels.get("engine", "")
        busy[engine] = busy.get(engine, 0.0) + 100 * s.value
    for s in rated[ENERGY]:
        r = row(s)
        r.watts = (r.watts or 0.0) + s.value
    for s in by_name[MEMORY]:
        states = row(s).memory.setdefault(s.labels.get("region", ""), {})
        state = s.labels.get("state", "")
        states[state] = states.get(state, 0.0) + s.value
    _allocations(rows, by_name, multi_node)
    info = by_name[DEVICE_INFO]
    return Frame(
        rows=list(rows.values()),
        nodes=_distinct(
            [s.labels.get("node", "") for s in info]
            + [s.labels.get("k8s_node_name", "") for s in by_name[TARGET_INFO]]
        ),
        versions=_distinct([s.labels.get("service_version", "") for s in by_name[TARGET_INFO]]),
        devices=sorted(
            {tuple(s.labels.get(k, "") for k in ("node", "device", "vendor")) for s in info}
        ),
        engines=sorted({s.labels.get("engine", "") for s in by_name[BUSY]}),
        has_memory=bool(by_name[MEMORY]),
        has_allocations=bool(by_name[ALLOCATED]),
        has_energy=bool(by_name[ENERGY]),
        measuring=reading.rates is None,
        calls=sum(s.value for s in rated[IOCTL]),
        dropped=_sum(by_name[DROPPED]),
        dropped_rate=_sum(rated[DROPPED]),
        unattributed=_sum(by_name[UNATTRIBUTED]),
        unattributed_rate=_sum(rated[UNATTRIBUTED]),
        overflow=_sum(by_name[OVERFLOW]),
        malformed=reading.malformed,
    )


def _allocations(
    rows: dict[RowKey, Row], by_name: dict[str, list[Series]], multi_node: bool
) -> None:
    """Shares and idle streaks onto the rows of the same container and device (allocation
    series carry no vendor); an allocation without calls gets a row of its own."""
    by_place = {k._replace(vendor=""): r for k, r in rows.items()}
    for s in by_name[ALLOCATED] + by_name[IDLE_FOR]:
        key = _key(s, multi_node)._replace(vendor="")
        r = by_place.get(key) or rows.setdefault(key, Row(key))
        by_place[key] = r
        if s.name == ALLOCATED:
            r.shares = (r.shares or 0.0) + s.value
        else:
            r.idle_for = max(r.idle_for or 0.0, s.value)


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds // 60:.0f}m"
    return f"{seconds // 3600:.0f}h{seconds % 3600 // 60:02.0f}m"


def _distinct(values: Iterable[str]) -> list[str]:
    return sorted({v for v in values if v})


def _sum(series: Iterable[Series]) -> float:
    return sum(s.value for s in series)


# --- sorting -----------------------------------------------------------------------------

# Sort name -> (key press, row value). Numbers sort highest first, names A to Z.
SORTS: dict[str, tuple[str, Callable[[Row], float | str]]] = {
    "total": ("t", lambda r: r.total),
    "submit": ("s", lambda r: r.rates["submit"]),
    "alloc": ("a", lambda r: r.rates["alloc"]),
    "wait": ("w", lambda r: r.rates["wait"]),
    "busy": ("b", lambda r: r.max_busy),
    "memory": ("m", lambda r: r.mem),
    "shares": ("h", lambda r: r.shares or 0.0),
    "idle": ("i", lambda r: r.idle_for or 0.0),
    "power": ("e", lambda r: r.watts or 0.0),
    "node": ("o", lambda r: r.key.node),
    "namespace": ("n", lambda r: r.key.namespace),
    "pod": ("p", lambda r: r.key.pod),
    "container": ("c", lambda r: r.key.container),
    "device": ("d", lambda r: r.key.device),
    "vendor": ("v", lambda r: r.key.vendor),
}
SORT_KEYS = {key: name for name, (key, _) in SORTS.items()}
NUMERIC = ("total", "submit", "alloc", "wait", "busy", "memory", "shares", "idle", "power")


def sort_rows(rows: list[Row], by: str, reverse: bool = False) -> list[Row]:
    value = SORTS[by][1]
    # Names then the row key break ties, so equal rows keep one stable order between frames.
    ordered = sorted(rows, key=lambda r: r.key)
    return sorted(ordered, key=value, reverse=(by in NUMERIC) != reverse)


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


def fmt_rate(x: float) -> str:
    if x >= 9999.5:
        return f"{x / 1000:.1f}k"
    return f"{x:.0f}" if x >= 99.95 else f"{x:.1f}"


def fmt_bytes(x: float) -> str:
    for unit in ("", "K", "M", "G", "T"):
        if x < 1024 or unit == "T":
            return f"{x:.0f}{unit}" if unit == "" or x >= 100 else f"{x:.1f}{unit}"
        x /= 1024
    raise AssertionError("unreachable")


def columns(frame: Frame, multi_node: bool) -> list[Column]:
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

        return Column(f"{engine.upper()}%", "busy", cell, 40)

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
    cols += [busy(e) for e in frame.engines]
    if frame.has_memory:
        cols.append(Column("MEM", "memory", lambda r: fmt_bytes(r.mem) if r.memory else "-", 45))
    if frame.has_allocations:  # ALLOC: the shares held; ALLOC/s is the alloc-class call rate
        cols.append(Column("ALLOC", "shares", lambda r: f"{r.shares or 0:g}", 65))
        cols.append(Column("IDLE FOR", "idle", lambda r: fmt_duration(r.idle_for), 64))
    if frame.has_energy:
        watts = Column("W", "power", lambda r: "-" if r.watts is None else fmt_rate(r.watts), 42)
        cols.append(watts)
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
    cols = [
        replace(c, title=c.title + "*", priority=1000) if c.sort == sort else c
        for c in columns(frame, multi_node)
    ]
    fitted = layout(cols, rows, width)
    lines = ["  ".join(_fit(c.title, w, c.numeric) for c, w in fitted)]
    for r in rows:
        lines.append("  ".join(_fit(c.cell(r), w, c.numeric) for c, w in fitted))
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
    if frame.malformed:
        status += f"  malformed lines {frame.malformed}"
    return [first, f"devices ({len(frame.devices)}): {devices}", status]


def rows_json(frame: Frame, sort: str, multi_node: bool) -> list[dict[str, object]]:
    out = []
    for r in sort_rows(frame.rows, sort):
        row: dict[str, object] = {"node": r.key.node} if multi_node else {}
        row.update({k: getattr(r.key, k) for k in POD_LABELS})
        row["rates"] = {k: round(v, 3) for k, v in r.rates.items()}
        if frame.engines:  # like fdinfo: only the engines and regions the row has
            row["busy"] = {e: round(pct, 3) for e, pct in sorted(r.busy.items())}
        if frame.has_memory:
            row["memory"] = {
                region: {state: int(b) for state, b in states.items()}
                for region, states in sorted(r.memory.items())
            }
        if frame.has_allocations:
            row["allocated"] = {"shares": r.shares or 0, "idle_for_seconds": r.idle_for}
        if frame.has_energy:
            row["watts"] = None if r.watts is None else round(r.watts, 3)
        out.append(row)
    return out


# --- the two modes -----------------------------------------------------------------------


def once(source: Source, interval: float, output: str, sort: str, width: int = 10**6) -> str:
    """Read (twice, `interval` apart, for a scrape), print one frame; the table fits `width`."""
    reading = source.read()
    if reading.rates is None:
        time.sleep(interval)
        reading = source.read()
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


HELP = (
    "keys: t total s submit a alloc w wait p pod n namespace c container d device v vendor"
    " b busy m memory h shares i idle o node r reverse q quit"
)


@dataclass
class _View:
    source: Source
    interval: float
    sort: str
    reverse: bool = False
    frame: Frame | None = None
    error: str = ""

    def key(self, ch: int) -> bool:
        """Apply a key press; False means quit."""
        c = chr(ch) if 0 <= ch < 256 else ""
        if c in ("q", "Q", "\x1b"):
            return False
        if c == "r":
            self.reverse = not self.reverse
        elif c in SORT_KEYS:
            self.sort, self.reverse = SORT_KEYS[c], False
        return True

    def lines(self, width: int, height: int) -> tuple[list[str], int]:
        """The screen's lines, and the index of the column titles' line."""
        assert self.frame is not None
        multi = self.source.multi_node
        top = header(self.frame, self.source, self.interval)
        if self.error:
            top.append(f"last read failed: {self.error}; retrying every {self.interval:g}s")
        body = table(self.frame, self.sort, width, self.reverse, multi)
        space = max(height - len(top) - 2, 2)  # a blank line, and the key help at the bottom
        if len(body) > space:
            body = [*body[: space - 1], f"... {len(body) - space + 1} more rows"]
        order = "descending" if (self.sort in NUMERIC) != self.reverse else "ascending"
        lines = [*top, "", *body][: height - 1]
        lines += [""] * (height - 1 - len(lines))  # the keys on the bottom line
        return [*lines, f"sort {self.sort} {order} | {HELP}"], len(top) + 1


def live(source: Source, interval: float, sort: str) -> None:
    """The curses view until q or Ctrl-C. The first read happens before the screen is taken,
    so a dead endpoint is one line on the terminal; later failures show in the header."""
    try:  # here, not at the top: a Python built without curses still runs kubenpuctl
        import curses
    except ImportError:
        raise TopError("this Python has no curses module; use --once") from None
    view = _View(source, interval, sort)
    view.frame = build_frame(source.read(), source.multi_node)
    with contextlib.suppress(KeyboardInterrupt):
        curses.wrapper(_loop, view)


def _loop(screen: curses.window, view: _View) -> None:
    import curses

    with contextlib.suppress(curses.error):  # terminals without cursor control
        curses.curs_set(0)
    next_read = time.monotonic() + view.interval
    while True:
        now = time.monotonic()
        if now >= next_read:
            try:
                view.frame, view.error = build_frame(view.source.read(), view.source.multi_node), ""
            except TopError as e:
                view.error = str(e)
            next_read = now + view.interval
        _draw(screen, view)
        screen.timeout(max(0, int((next_read - time.monotonic()) * 1000)))
        ch = screen.getch()
        if ch != -1 and not view.key(ch):
            return


def _draw(screen: curses.window, view: _View) -> None:
    import curses

    height, width = screen.getmaxyx()
    screen.erase()
    lines, titles = view.lines(width - 1, height)
    for y, line in enumerate(lines):
        attr = {0: curses.A_REVERSE, titles: curses.A_BOLD}.get(y, curses.A_NORMAL)
        with contextlib.suppress(curses.error):  # a terminal shrinking under us
            screen.addnstr(y, 0, line, width - 1, attr)
    screen.refresh()
