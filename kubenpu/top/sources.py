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

from kubenpu.metrics import catalogue

IOCTL = catalogue.IOCTL.prometheus_name
DEVICE_INFO = catalogue.DEVICE_INFO.prometheus_name
DROPPED = catalogue.DROPPED.prometheus_name
UNATTRIBUTED = catalogue.UNATTRIBUTED.prometheus_name
OVERFLOW = catalogue.OVERFLOW_CALLS.prometheus_name
TARGET_INFO = "target_info"  # the OTel resource: service_version, k8s_node_name
# The fdinfo families; top shows them when they appear.
BUSY = catalogue.ENGINE_BUSY.prometheus_name  # counter per ...,engine
MEMORY = catalogue.MEMORY.prometheus_name  # gauge per ...,region,state
# The allocation families (attribution.pod_resources); top shows them when they appear.
ALLOCATED = catalogue.ALLOCATED.prometheus_name  # gauge per ...,resource: shares held
IDLE_FOR = catalogue.ALLOCATED_IDLE_FOR.prometheus_name  # gauge: the current idle streak
ENERGY = catalogue.POD_ENERGY.prometheus_name  # counter per pod and device: its rate is W
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
