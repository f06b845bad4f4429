"""kubenpuctl top's sources: one agent's /metrics (two scrapes give the rates) or a Prometheus
query API (rate() over a window, across nodes), read with a small text-format parser and urllib.
The metric names come from the catalogue (kubenpu.metrics.catalogue) alone."""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from kubenpu.files import read_at_most
from kubenpu.metrics import catalogue

IOCTL = catalogue.IOCTL.prometheus_name
DEVICE_INFO = catalogue.DEVICE_INFO.prometheus_name
DROPPED = catalogue.DROPPED.prometheus_name
UNATTRIBUTED = catalogue.UNATTRIBUTED.prometheus_name
OVERFLOW = catalogue.OVERFLOW_CALLS.prometheus_name
# Calls held for a CRI answer: not in IOCTL yet, so a wrong CRI socket would look like no calls.
HELD = catalogue.PENDING_CALLS.prometheus_name
HELD_AGE = catalogue.PENDING_AGE.prometheus_name
TARGET_INFO = "target_info"  # the OTel resource: service_version, k8s_node_name
# The fdinfo families; top shows them when they appear.
BUSY = catalogue.ENGINE_BUSY.prometheus_name  # counter per ...,engine
MEMORY = catalogue.MEMORY.prometheus_name  # gauge per ...,region,state
# The allocation families (attribution.pod_resources); top shows them when they appear.
ALLOCATED = catalogue.ALLOCATED.prometheus_name  # gauge per ...,resource: shares held
IDLE_FOR = catalogue.ALLOCATED_IDLE_FOR.prometheus_name  # gauge: the current idle streak
ENERGY = catalogue.POD_ENERGY.prometheus_name  # counter per pod and device: its rate is W
# The call durations (probe.durations); top shows WAIT p99 and ERR/s when they appear.
BUCKETS = catalogue.IOCTL_DURATION.prometheus_name + "_bucket"  # counter per ...,kind,le
ERRORS = catalogue.IOCTL_ERRORS.prometheus_name  # counter per ...,kind,error
# The GPU jobs (probe.jobs); top shows QUEUE p99 and RUN p99 when they appear. The agent reads
# them every fdinfo interval, and stamps them as their own source.
QUEUE_BUCKETS = catalogue.JOB_WAIT.prometheus_name + "_bucket"  # counter per ...,ring,le
RUN_BUCKETS = catalogue.JOB_RUN.prometheus_name + "_bucket"
# Who the queue wait was behind (per ...,ring,behind_namespace,behind_pod) or that the ring was
# idle: top shows BEHIND when they appear; kubenpuctl contention lists them per device.
BEHIND = catalogue.JOB_WAIT_BEHIND.prometheus_name
IDLE_WAIT = catalogue.JOB_WAIT_IDLE.prometheus_name
KINDS = ("submit", "alloc", "wait")
POD_LABELS = ("namespace", "pod", "container", "device", "vendor")
RATED = (
    IOCTL,
    BUSY,
    DROPPED,
    UNATTRIBUTED,
    ENERGY,
    BUCKETS,
    ERRORS,
    QUEUE_BUCKETS,
    RUN_BUCKETS,
    BEHIND,
    IDLE_WAIT,
)
# When the agent last brought each source's counters up to date, and which counters those are:
# a scrape between two of the agent's reads sees the same counts, so rates go over the change
# of the source's stamp, not over the time between scrapes.
STAMP = catalogue.COUNTERS_READ.prometheus_name
SOURCES = {
    "kernel": (IOCTL, DROPPED, UNATTRIBUTED, BUCKETS, ERRORS),
    "fdinfo": (BUSY,),
    "jobs": (QUEUE_BUCKETS, RUN_BUCKETS, BEHIND, IDLE_WAIT),
    "telemetry": (ENERGY,),
    "allocations": (),  # nothing top rates
    "guard": (),
}
# An agent's /metrics at a max_series of 10,000 is a few MB; a Prometheus query over a fleet more.
MAX_ANSWER_BYTES = 256 << 20


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
    # Sources whose counters have no rate yet (the agent has read them once since top began).
    unrated: tuple[str, ...] = ()


class Source(Protocol):
    url: str
    multi_node: bool

    def read(self) -> Reading: ...


def _get(url: str, timeout: float, accept: str) -> str:
    """At most MAX_ANSWER_BYTES of the answer: what a URL sends is its choice."""
    req = urllib.request.Request(url, headers={"Accept": accept})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return read_at_most(r.read, MAX_ANSWER_BYTES, "the answer").decode("utf-8", "replace")
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


def scrape(url: str, timeout: float) -> tuple[list[Series], int]:
    """One agent's /metrics: its samples and its malformed lines. TopError when it cannot be
    read or is not an agent's."""
    latest, bad = parse(_get(url, timeout, "text/plain;version=0.0.4"))
    if not any(s.name.startswith("kubenpu_") for s in latest):
        raise TopError(f"{url}: no kubenpu_ metrics there (not a KubeNPU agent?)")
    return latest, bad


@dataclass
class _Read:
    """One of the agent's reads of a source's counters, as the first scrape after it saw them."""

    at: float  # the agent's stamp, or top's clock for an agent without stamps
    stamped: bool
    series: list[Series]
    rates: list[Series] | None = None  # since the read before


class ScrapeSource:
    """One agent's /metrics. Each source's counters (SOURCES) are rated between two of the
    agent's reads of them, over the change of its stamp; a scrape that finds no new read keeps
    the last rates. An agent without stamps is rated over top's own clock between scrapes."""

    multi_node = False

    def __init__(
        self, url: str, timeout: float = 5.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.url = url
        self._timeout = timeout
        self._clock = clock
        self._reads: dict[str, _Read] = {}

    def read(self) -> Reading:
        latest, bad = scrape(self.url, self._timeout)
        at = self._clock()  # the agent snapshots as it answers: client-side set-up is not in it
        stamps = {s.labels.get("source", ""): s.value for s in latest if s.name == STAMP}
        for source, names in SOURCES.items():
            stamp = stamps.get(source)
            series = [s for s in latest if s.name in names]
            self._step(source, _Read(at if stamp is None else stamp, stamp is not None, series))
        rated = {source: r.rates for source, r in self._reads.items()}
        rates = None if rated["kernel"] is None else [s for r in rated.values() for s in r or ()]
        unrated = tuple(k for k, r in rated.items() if r is None and (k in stamps or not stamps))
        return Reading(latest, rates, bad, unrated)

    def _step(self, source: str, now: _Read) -> None:
        last = self._reads.get(source)
        if last is not None and last.stamped == now.stamped and now.at <= last.at:
            return  # no new read: the last rates stand
        if last is not None and last.stamped == now.stamped:  # one clock: a rate between them
            now.rates = counter_rates(last.series, now.series, now.at - last.at)
        self._reads[source] = now


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
