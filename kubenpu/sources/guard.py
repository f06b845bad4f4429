"""The access guard's policy (docs/guard.md): which pod may open and use which device node, from
what the agent already knows, turned into the kernel's maps (kubenpu.kernel.guard), and the
kernel's tallies turned back into denials per pod and device.

A pod may use a device if the kubelet allocated it to the pod (PodResources, mapped to devices
by the allocations source) or an allow rule of the config names the pod's namespace and the
device. Only the devices a plugin manages (or the config names) are guarded: the rest are never
blocked. Processes outside pod cgroups never are.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from kubenpu.discovery import Device
from kubenpu.kernel.guard import MODES, Policy, mkdev

log = logging.getLogger(__name__)

ANY = "*"
LOG_EVERY_SECONDS = 60.0  # one denial line per pod and device at most this often


@dataclass(frozen=True)
class Rule:
    """An allow rule: pods of `namespace` may use `device` (a device id); ANY matches all."""

    namespace: str = ANY
    device: str = ANY

    def allows(self, namespace: str, device: str) -> bool:
        return self.namespace in (ANY, namespace) and self.device in (ANY, device)


@dataclass(frozen=True)
class Settings:
    mode: str = "off"  # MODES
    namespaces: Mapping[str, str] | None = None  # namespace -> mode, overriding `mode`
    allow: tuple[Rule, ...] = ()
    fail_open_seconds: float = 30.0

    def mode_of(self, namespace: str) -> str:
        return (self.namespaces or {}).get(namespace, self.mode)


@dataclass(frozen=True)
class Pod:
    """What the agent knows of one pod: its containers' cgroups and its allocated devices."""

    uid: str
    namespace: str
    name: str
    cgroup_ids: frozenset[int]
    devices: frozenset[str]  # device ids (Device.id) the kubelet allocated to it


def _nodes(device: Device) -> set[int]:
    return {mkdev(n.major, n.minor) for n in device.nodes}


class Planner:
    """Policies for successive views of the pods. A pod keeps its number for the agent's life
    (the kernel's allow keys name it), so a refresh rewrites only what changed."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._numbers: dict[str, int] = {}

    def number(self, uid: str) -> int:
        return self._numbers.setdefault(uid, len(self._numbers) + 1)

    def plan(self, pods: Iterable[Pod], devices: Iterable[Device], managed: set[str]) -> Policy:
        """`managed`: the device ids a plugin manages (allocatable), the ones guarded."""
        guarded_devices = [d for d in devices if d.id in managed]
        cgroups, allowed = {}, set()
        for pod in pods:
            number = self.number(pod.uid)
            mode = MODES.index(self.settings.mode_of(pod.namespace))
            cgroups.update({cgroup_id: (number, mode) for cgroup_id in pod.cgroup_ids})
            for device in guarded_devices:
                if device.id in pod.devices or any(
                    r.allows(pod.namespace, device.id) for r in self.settings.allow
                ):
                    allowed.update((number, dev) for dev in _nodes(device))
        guarded = frozenset(dev for d in guarded_devices for dev in _nodes(d))
        return Policy(guarded, cgroups, frozenset(allowed))


@dataclass(frozen=True)
class Denial:
    pod: Pod
    device: str  # its id
    operation: str
    mode: str  # enforce: denied; audit: would have been
    count: int


# The verdicts that are denials, and the mode each is one of.
DENIAL_MODES = {"denied": "enforce", "audited": "audit"}


def denials(
    tallies: Mapping[tuple[int, int, str, str], int],
    pods: Iterable[Pod],
    devices: Iterable[Device],
) -> list[Denial]:
    """The kernel's denial tallies by pod, device and operation (cumulative), the cgroups of one
    pod summed; a tally of a cgroup or node the agent no longer knows is left out."""
    by_cgroup = {c: pod for pod in pods for c in pod.cgroup_ids}
    by_dev = {dev: d.id for d in devices for dev in _nodes(d)}
    summed: dict[tuple[str, str, str, str], int] = {}
    known: dict[str, Pod] = {}
    for (cgroup_id, dev, operation, verdict), n in tallies.items():
        pod, device, mode = by_cgroup.get(cgroup_id), by_dev.get(dev), DENIAL_MODES.get(verdict)
        if pod is None or device is None or mode is None:
            continue
        known[pod.uid] = pod
        key = (pod.uid, device, operation, mode)
        summed[key] = summed.get(key, 0) + n
    return [Denial(known[uid], d, op, mode, n) for (uid, d, op, mode), n in summed.items()]


class DenialLog:
    """One line per pod and device at most every LOG_EVERY_SECONDS, when its denials rose."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._seen: dict[tuple[str, str, str, str], int] = {}
        self._logged: dict[tuple[str, str], float] = {}

    def note(self, found: Iterable[Denial]) -> None:
        now = self._clock()
        for d in found:
            key = (d.pod.uid, d.device, d.operation, d.mode)
            rose, self._seen[key] = d.count - self._seen.get(key, 0), d.count
            last = self._logged.get((d.pod.uid, d.device))
            if rose <= 0 or (last is not None and now - last < LOG_EVERY_SECONDS):
                continue
            self._logged[d.pod.uid, d.device] = now
            verb = "denied" if d.mode == "enforce" else "would deny (audit)"
            log.warning(
                "guard %s %s %d time(s) to pod %s/%s on device %s",
                verb,
                d.operation,
                rose,
                d.pod.namespace,
                d.pod.name,
                d.device,
            )
