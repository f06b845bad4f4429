"""The placement scheduler's feeder (config placement.scheduler, docs/scheduler.md): each pod
cgroup that has called a device with a NUMA node is mapped to that node in the scheduler's
`prefer` map (kubenpu.kernel.placement), and its tasks are given the SCHED_EXT policy, which is
what puts them under the scheduler (partial mode). Read on the attribution thread every
interval, after the calls of the interval were counted.

A node where the scheduler cannot run (no sched_ext, another BPF scheduler, missing
capabilities, a refused load) gets one line and the measurement alone: build() returns None.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol

from kubenpu.discovery import Device
from kubenpu.kernel import placement
from kubenpu.kernel.errors import ProbeError
from kubenpu.resolve.hold import Resolve
from kubenpu.sources.base import Node, Report

log = logging.getLogger("kubenpu")


class Kernel(Protocol):
    writer: placement.Writer | None

    def start(self, prefer: Mapping[int, int]) -> None: ...

    def close(self) -> None: ...


def preferred(
    used: Mapping[int, set[str]], nodes: Mapping[str, int], resolver: Resolve
) -> dict[int, int]:
    """{cgroup id: NUMA node} for the pods' cgroups that called a device with a node. A cgroup
    that called devices on two nodes prefers the lowest (the scheduler takes one)."""
    wanted = {}
    for cgroup_id, devices in used.items():
        on = sorted(nodes[d] for d in devices if d in nodes)
        who = resolver.resolve(cgroup_id)
        if on and who is not None and who.pod:
            wanted[cgroup_id] = on[0]
    return wanted


def threads(cgroup: str) -> list[int]:
    """The thread ids in a cgroup (cgroup.threads); none if it is gone."""
    try:
        return [int(t) for t in (Path(cgroup) / "cgroup.threads").read_text().split()]
    except FileNotFoundError:
        return []


class Placement:
    name = "placement"

    def __init__(
        self,
        kernel: Kernel,
        devices: list[Device],
        used: Callable[[], Mapping[int, set[str]]],
        resolver: Resolve,
        report: Report,
        to_sched_ext: Callable[[list[int]], int] = placement.to_sched_ext,
        state: Callable[[], str] = placement.state,
    ) -> None:
        self._kernel = kernel
        self._nodes = {d.id: d.numa_node for d in devices if d.numa_node is not None}
        self._used = used
        self._resolver = resolver
        self._report = report
        self._to_sched_ext = to_sched_ext
        self._state = state

    def read(self) -> bool:
        return self._report.read(self._step)

    def _step(self) -> None:
        writer = self._kernel.writer
        if writer is None:
            return
        if (now := self._state()) != "enabled":
            # The kernel disabled it (its watchdog on a stall, or an error): it never comes back
            # by itself, and the pods' tasks are in the fair class again.
            log.warning(
                "placement scheduler: the kernel disabled it (sched_ext %s; its reason is in the "
                "kernel log): unloaded, the measurement goes on (docs/scheduler.md)",
                now,
            )
            self._kernel.close()
            return
        wanted = preferred(self._used(), self._nodes, self._resolver)
        writer.apply(wanted)  # the map first: a task switched is placed at once
        for cgroup_id in wanted:
            if (path := self._resolver.path(cgroup_id)) is not None:
                self._to_sched_ext(threads(path))

    def close(self) -> None:
        self._kernel.close()


def build(
    node: Node,
    kernel: Callable[[], Kernel] = placement.PlacementKernel,
    check: Callable[[], None] = placement.check,
) -> Placement | None:
    """The feeder with the scheduler loaded (nothing in `prefer` yet), or None: off by config,
    or it cannot run here (one line says why)."""
    if not node.cfg.placement.scheduler:
        return None
    if not any(d.numa_node is not None for d in node.watched):
        log.warning("placement scheduler: no device has a NUMA node: it is off (docs/scheduler.md)")
        return None
    loaded = kernel()
    try:
        check()
        loaded.start({})
    except ProbeError as err:
        log.warning("placement scheduler: %s", err)
        return None
    log.info("placement scheduler: loaded (sched_ext, partial mode; docs/scheduler.md)")
    report = Report(Placement.name, node.table)
    return Placement(loaded, node.watched, node.attributor.used, node.resolver, report)
