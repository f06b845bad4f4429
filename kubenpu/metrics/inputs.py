"""What the sources hand the series table: Where (usage, telemetry), Held and AllocationState
(allocations), DeviceRow (the wiring's device list)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from kubenpu.resolve import Attribution


class Held(NamedTuple):
    """One container's allocation of one device."""

    namespace: str
    pod: str
    container: str
    device: str
    resource: str


@dataclass
class AllocationState:
    """What the allocations refresh last found: shares, idle seconds (with the time each was
    first held) and the current idle streak per Held, unallocated calls per user (with the time
    first seen), unmapped ids by
    (resource, reason), and the uid of each pod named, by (namespace, pod), where the runtime
    gave one."""

    shares: dict[Held, int] = field(default_factory=dict)
    idle: dict[Held, tuple[float, int]] = field(default_factory=dict)
    idle_for: dict[Held, float] = field(default_factory=dict)
    unallocated: dict[tuple[str, str, str, str], tuple[int, int]] = field(default_factory=dict)
    unmapped: dict[tuple[str, str], int] = field(default_factory=dict)
    uids: dict[tuple[str, str], str] = field(default_factory=dict)


class DeviceRow(NamedTuple):
    device: str
    vendor: str
    driver: str
    pci_id: str
    numa_node: str


class Where(NamedTuple):
    """The labels fdinfo series share: whose DRM client, on which device."""

    namespace: str
    pod: str
    pod_uid: str  # the Attribution's: two same-named pods are two series
    container: str
    device: str
    vendor: str

    @classmethod
    def of(cls, who: Attribution, device: str = "", vendor: str = "") -> Where:
        """The labels of the resolver's answer `who` on `device` (none: the container alone,
        as a retirement names it)."""
        return cls(who.namespace, who.pod, who.pod_uid, who.container, device, vendor)
