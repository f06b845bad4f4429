"""kubenpuctl guard: the access guard's policy per pod and device, and its denials, from one
agent's /metrics (kubenpu_device_access_policy, kubenpu_device_access_denied_total,
kubenpu_device_access_unchecked_total; docs/guard.md)."""

from __future__ import annotations

from dataclasses import dataclass, field

from kubenpu.cli.top.sources import Series, scrape
from kubenpu.metrics import catalogue

POLICY = catalogue.ACCESS_POLICY.prometheus_name
DENIED = catalogue.ACCESS_DENIED.prometheus_name
UNCHECKED = catalogue.ACCESS_UNCHECKED.prometheus_name


@dataclass
class Row:
    """One pod and device: the policy's access and mode, and the denials by operation."""

    namespace: str
    pod: str
    device: str
    mode: str = ""
    access: str = ""
    denied: dict[str, int] = field(default_factory=dict)  # operation -> count

    def as_json(self) -> dict[str, object]:
        return {
            "namespace": self.namespace,
            "pod": self.pod,
            "device": self.device,
            "mode": self.mode,
            "access": self.access,
            "denied": dict(sorted(self.denied.items())),
        }


@dataclass
class Guard:
    rows: list[Row]
    unchecked: dict[tuple[str, str, str], int]  # (device, operation, reason) -> count
    exported: bool  # whether the agent exports any guard series (the guard is on)


def rows(series: list[Series]) -> Guard:
    """The pods' rows, sorted by pod and device; a pod gone from the policy but with denials
    still exported keeps its row."""
    found: dict[tuple[str, str, str], Row] = {}
    unchecked: dict[tuple[str, str, str], int] = {}
    exported = False
    for s in series:
        labels = s.labels
        if s.name == UNCHECKED:
            exported = True
            key = (labels.get("device", ""), labels.get("operation", ""), labels.get("reason", ""))
            unchecked[key] = int(s.value)
            continue
        if s.name not in (POLICY, DENIED):
            continue
        exported = True
        place = (labels.get("namespace", ""), labels.get("pod", ""), labels.get("device", ""))
        row = found.setdefault(place, Row(*place))
        row.mode = labels.get("mode", row.mode)
        if s.name == POLICY and s.value:
            row.access = labels.get("access", "")
        elif s.name == DENIED and s.value:
            op = labels.get("operation", "")
            row.denied[op] = row.denied.get(op, 0) + int(s.value)
    return Guard([found[k] for k in sorted(found)], unchecked, exported)


def read(url: str, timeout: float = 5.0) -> Guard:
    """The guard's rows from one scrape of `url`. Raises TopError."""
    series, _ = scrape(url, timeout)
    return rows(series)
