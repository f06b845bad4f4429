"""kubenpuctl contention: who was in whose way on one device, from one agent's /metrics. Each
pair is a waiting pod, a ring and whom its GPU jobs waited behind there (a pod, the pods past
the agent's cap, or nothing: an idle ring), with the seconds of wait over a window and their
share of the waiting pod's wait on that ring (kubenpu_job_wait_behind_seconds_total and
kubenpu_job_wait_idle_seconds_total, docs/jobs.md#who-is-in-my-way)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from kubenpu.cli.top.frames import IDLE, blocker
from kubenpu.cli.top.sources import (
    BEHIND,
    DEVICE_INFO,
    IDLE_WAIT,
    Series,
    TopError,
    counter_rates,
    scrape,
)

# PCI domain 0000 is nearly universal; top leaves it out on screen, so DEVICE may too.
_DOMAIN = "0000:"


@dataclass(frozen=True)
class Pair:
    namespace: str  # the waiting pod's
    pod: str
    ring: str
    behind: str  # namespace/pod, "other" past the cap, "(no pod)", or "idle"
    seconds: float  # waited over the window
    share: float  # of the waiting pod's wait on the ring over the window, 0..1

    def as_json(self) -> dict[str, object]:
        return {
            "namespace": self.namespace,
            "pod": self.pod,
            "ring": self.ring,
            "behind": self.behind,
            "wait_seconds": round(self.seconds, 6),
            "share_percent": round(100 * self.share, 3),
        }


@dataclass(frozen=True)
class Contention:
    device: str  # the agent's device id
    exported: bool  # the agent exports the waits of this device's jobs
    pairs: list[Pair]  # those with wait in the window, the longest first


def read(url: str, device: str, window: float, timeout: float = 5.0) -> Contention:
    """The device's pairs over `window` seconds between two scrapes of `url` (0: the counters'
    totals, since the agent began them). TopError when the agent cannot be read or does not
    know the device."""
    before, _ = scrape(url, timeout)
    found = _device(before, device)
    waits = _waits(before, found)
    if window:
        time.sleep(window)
        after = _waits(scrape(url, timeout)[0], found)  # the first waits may come in between
        # A "rate" over 1 s is the increase: a counter reset or a series born counts from 0.
        return Contention(found, bool(after), pairs(counter_rates(waits, after, 1.0)))
    return Contention(found, bool(waits), pairs(waits))


def _device(series: list[Series], wanted: str) -> str:
    """The agent's id of `wanted` (given with or without the PCI domain)."""
    known = {s.labels["device"] for s in series if s.name == DEVICE_INFO and "device" in s.labels}
    known |= {s.labels["device"] for s in series if s.name in (BEHIND, IDLE_WAIT)}
    for device in (wanted, _DOMAIN + wanted):
        if device in known:
            return device
    listed = ", ".join(sorted(known)) or "none"
    raise TopError(f"no device {wanted} on this agent (its devices: {listed})")


def _waits(series: list[Series], device: str) -> list[Series]:
    return [s for s in series if s.name in (BEHIND, IDLE_WAIT) and s.labels.get("device") == device]


def pairs(waits: list[Series]) -> list[Pair]:
    """Per waiting pod (its containers summed), ring and whom it waited behind, the seconds and
    their share of the pod's wait on the ring; pairs without wait are left out."""
    seconds: dict[tuple[str, str, str, str], float] = {}
    for s in waits:
        who = blocker(s.labels) if s.name == BEHIND else IDLE
        key = (
            s.labels.get("namespace", ""),
            s.labels.get("pod", ""),
            s.labels.get("ring", ""),
            who,
        )
        seconds[key] = seconds.get(key, 0.0) + s.value
    totals: dict[tuple[str, str, str], float] = {}
    for (namespace, pod, ring, _), n in seconds.items():
        totals[namespace, pod, ring] = totals.get((namespace, pod, ring), 0.0) + n
    found = [
        Pair(namespace, pod, ring, who, n, n / totals[namespace, pod, ring])
        for (namespace, pod, ring, who), n in seconds.items()
        if n > 0
    ]
    return sorted(found, key=lambda p: (-p.seconds, p.namespace, p.pod, p.ring, p.behind))
