"""Device time and memory per pod: DRM clients read from fdinfo, attributed like the call counts.

Each read scans the processes that may hold a DRM client: those that held one at the last read,
the tgids the probe saw calling drm_ioctl since (every event's in events mode, the first of each
new key's in aggregate mode), and every process of a cgroup that made calls since, whose cgroup
directory a client already named. The first read scans all of /proc.

A client's engine counters (busy ns, cycles, total cycles) go through a HighWater and are added
to the pod's counters as increments, so a pod's counter never goes down when one of its
processes, or clients, goes away. A client that closes between two reads loses what it used since
the last read. Memory and capacity are gauges of the clients open at the last read.

A client is its (device, drm-client-id), whichever pids hold it. One that no holder showed is
taken as closed, but what was counted of it is kept (the last _MAX_CLOSED closed clients): if a
process that no read scanned holds it (a fork whose parent exited, idle since), it continues
from there when that process is read, and is not counted again from zero (docs/fdinfo.md).

Attribution: the lowest pid's cgroup v2 path, its directory's inode under the cgroup root (the
cgroup id the kernel gives the probe: kubenpu.resolve.cgroups.ProcCgroups, which reads a path
relative to the agent's cgroup namespace), then the same Resolver as the calls. While the resolver
has no answer yet, a client's increments wait (none lost); after `pending_seconds`, or when the
client closes, they are counted with the resolver's settled answer.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial

from kubenpu.descriptors import FDINFO, Exhaustion, exhausted
from kubenpu.discovery import Device
from kubenpu.metrics.catalogue import (
    ENGINE_BUSY,
    ENGINE_CAPACITY,
    ENGINE_COUNTERS,
    ENGINE_CYCLES,
    FDINFO_SKIPPED,
    MEMORY,
    SKIP_REASONS,
    Spec,
)
from kubenpu.metrics.inputs import Where
from kubenpu.metrics.own import EXHAUSTED
from kubenpu.metrics.points import Point, Snapshot
from kubenpu.metrics.series import NodeFamily, PodFamily, Series, added, by_label
from kubenpu.resolve import Attribution
from kubenpu.resolve.cgroups import ProcCgroups
from kubenpu.resolve.hold import Hold, Resolve
from kubenpu.sources.activity import Activity
from kubenpu.sources.base import Node
from kubenpu.sources.fdinfo import Client, FdinfoReader, HighWater, Scan, Skip

# Client fields that are cumulative counters, in ENGINE_COUNTERS order, with their scale.
_COUNTERS = (("busy_ns", 1e-9), ("cycles", 1), ("total_cycles", 1))

_ClientKey = tuple[str, int]  # (device, drm-client-id)
# Closed clients whose counted values are kept, oldest forgotten first: a client taken as closed
# may be held by a process no read scanned yet (a fork whose parent exited, idle since).
_MAX_CLOSED = 10_000


def _engine_counter(spec: Spec) -> PodFamily:
    """put(family, where, engine, increment): one of a pod's engine counters."""
    return PodFamily(
        spec.name,
        lambda rows: [
            (spec, [Point({**r.where, "engine": r.key}, r.value, r.start_ns) for r in rows])
        ],
        added,
    )


def _gauges(rows: dict[str, tuple[dict, dict]], start: int) -> Snapshot:
    capacity, memory = rows.get("", ({}, {}))
    return [
        (ENGINE_CAPACITY, _gauge_points(capacity, ("engine",), start)),
        (MEMORY, _gauge_points(memory, ("region", "state"), start)),
    ]


def _gauge_points(values: dict, names: tuple[str, ...], start: int) -> list[Point]:
    return [
        Point({**key[0]._asdict(), **dict(zip(names, key[1:], strict=True))}, v, start)
        for key, v in values.items()
    ]


ENGINES = {spec: _engine_counter(spec) for spec in ENGINE_COUNTERS}
# set(GAUGES, "", (capacity, memory)): the engine capacities and memory of the clients read
# last, by (where, engine) and (where, region, state); a closed client's memory is gone.
GAUGES = NodeFamily("usage", _gauges)
SKIPS = by_label(FDINFO_SKIPPED, SKIP_REASONS)
FAMILIES = (*ENGINES.values(), GAUGES, SKIPS)


@dataclass
class _Tracked:
    """A client seen open: what it last said and what of it was counted."""

    client: Client
    cgroup_id: int | None
    since: float  # first seen, for pending_seconds
    who: Attribution | None = None  # once the resolver answered
    high: HighWater[tuple[str, str]] = field(default_factory=HighWater)  # (engine, field)
    counted: dict[tuple[str, str], int] = field(default_factory=dict)  # (engine, field) -> value


class Usage:
    """Reads DRM clients every `interval` seconds and turns them into per-pod metrics."""

    name = "fdinfo"

    def __init__(
        self,
        reader: FdinfoReader,
        resolver: Resolve,
        metrics: Series,
        devices: Iterable[Device],
        cgroup_root: str,
        *,
        pending_seconds: float,
        on_cgroup: Callable[[int], None] = lambda _: None,
        own_cgroup: str = "/sys/fs/cgroup",
        on_exhausted: Callable[[str, int], None] | None = None,
        activity: Activity | None = None,
        clock: Callable[[], float],
    ) -> None:
        self._activity = activity  # busy time and cycles: allocations' signals of use
        self._reader = reader
        self._exhaustion = Exhaustion(FDINFO, on_exhausted)
        self._metrics = metrics
        self._vendor = {d.id: d.vendor or "" for d in devices}
        self._cgroups = ProcCgroups(cgroup_root, own_cgroup)
        self._hold = Hold(resolver, pending_seconds, clock)
        self._on_cgroup = on_cgroup  # the agent reaps these cgroups as it reaps the calls'
        self._clock = clock
        self._clients: dict[_ClientKey, _Tracked] = {}
        self._closed: dict[_ClientKey, _Tracked] = {}  # insertion order = order of closing
        self._dirs: dict[int, str] = {}  # cgroup id -> directory, learned from clients
        self._pids: set[int] = set()  # to scan at the next read
        self._active: set[int] = set()  # cgroup ids with calls since the last read
        self._full = True
        # The last read's busy ns, busy cycles and elapsed cycles per device and pod (None: pod
        # not known yet, or no pod): what device energy is split by.
        self._interval: dict[str, dict[Where | None, list[int]]] = {}
        self._baseline = True

    def interval_busy(self) -> dict[str, dict[Where | None, list[int]]]:
        """Per device, what each pod's clients used between the last two reads."""
        return self._interval

    def client_cgroups(self) -> dict[tuple[str, int], int]:
        """The cgroup id of each open client's lowest pid, by (device, drm-client-id), as the
        last read saw them (the GPU jobs' client-id join, docs/jobs.md)."""
        return {k: t.cgroup_id for k, t in self._clients.items() if t.cgroup_id is not None}

    def saw(self, tgids: Iterable[int], cgroup_ids: Iterable[int]) -> None:
        """What the probe saw since the last call: calling processes and their cgroups."""
        self._pids.update(tgids)
        self._active.update(cgroup_ids)

    def read(self) -> Scan:
        """One read: scan, count increments, replace the gauges. Returns the scan."""
        # The first read is the baseline of the clients open before the agent started; a client
        # found later was opened since the read before, so all its time is of this interval.
        self._baseline = self._full
        if self._full:
            scan = self._reader.scan()
            self._full = False
        else:
            scan = self._reader.scan(sorted(self._pids | self._procs()))
        self._interval = {}
        for reason, n in scan.skipped.items():
            self._metrics.set(SKIPS, str(reason), n)
        if scan.skipped[Skip.NO_DESCRIPTORS]:
            self._exhaustion.failed(scan.skipped[Skip.NO_DESCRIPTORS])
        else:
            self._exhaustion.ok()
        seen = {(c.device, c.client_id): c for c in scan.clients}
        for key, client in seen.items():
            self._observe(key, client)
        for key, tracked in list(self._clients.items()):
            if key not in seen and not set(tracked.client.pids) & scan.unreadable:
                self._close(key, tracked)  # every holder was read without it: closed
        self._pids = {p for t in self._clients.values() for p in t.client.pids}
        # Directories of cgroups that hold a client or just called; the others may be gone.
        keep = self._active | {t.cgroup_id for t in self._clients.values()}
        self._dirs = {c: d for c, d in self._dirs.items() if c in keep}
        self._active = set()
        self._set_gauges()
        return scan

    def _procs(self) -> set[int]:
        """The processes of the cgroups that made calls since the last read."""
        pids: set[int] = set()
        for cgroup_id in self._active & self._dirs.keys():
            try:
                with open(os.path.join(self._dirs[cgroup_id], "cgroup.procs")) as f:
                    pids.update(int(line) for line in f if line.strip())
            except OSError as e:
                if exhausted(e):  # the cgroup may well exist: look again at the next read
                    self._exhaustion.failed()
                else:
                    del self._dirs[cgroup_id]  # removed: its processes are gone
            except ValueError:
                del self._dirs[cgroup_id]
        return pids

    def _observe(self, key: _ClientKey, client: Client) -> None:
        tracked = self._clients.get(key)
        if tracked is None:
            tracked = self._clients[key] = self._reopened(key, client)
        tracked.client = client
        rose = [0, 0, 0]  # per _COUNTERS field, over the client's engines
        for engine, stats in client.engines.items():
            up = [0, 0, 0]
            for i, (name, _) in enumerate(_COUNTERS):
                if name in stats:
                    before = tracked.high.get((engine, name))
                    up[i] = tracked.high.update((engine, name), stats[name]) - before
            _add_busy(rose, up)
        if tracked.who is None:
            tracked.who = self._attribute(tracked, settle=False)
        self._busy(tracked, rose)
        if tracked.who is not None:
            self._count(tracked)

    def _busy(self, tracked: _Tracked, rose: list[int]) -> None:
        if self._baseline:
            return
        who = tracked.who
        known = who is not None and bool(who.pod or who.container)
        pods = self._interval.setdefault(tracked.client.device, {})
        _add_busy(pods.setdefault(self._where(tracked) if known else None, [0, 0, 0]), rose)

    def _reopened(self, key: _ClientKey, client: Client) -> _Tracked:
        """A client seen again after it was taken as closed continues from what was counted of
        it (drm-client-id is never reused: a new open is a new id); else a new one."""
        tracked = _Tracked(client, self._cgroup_id(client), self._clock())
        closed = self._closed.pop(key, None)
        if closed is not None:
            tracked.high, tracked.counted = closed.high, closed.counted
        return tracked

    def _close(self, key: _ClientKey, tracked: _Tracked) -> None:
        tracked.who = tracked.who or self._attribute(tracked, settle=True)
        self._count(tracked)
        del self._clients[key]
        self._closed[key] = tracked
        if len(self._closed) > _MAX_CLOSED:
            del self._closed[next(iter(self._closed))]

    def _attribute(self, tracked: _Tracked, settle: bool) -> Attribution | None:
        """The resolver's answer; its settled one once the client waited pending_seconds."""
        if tracked.cgroup_id is None:
            return Attribution()  # no cgroup v2 path: counted unlabelled, like a host process
        answer = self._hold.answer(tracked.cgroup_id, tracked.since, settle=settle)
        return None if answer is None else answer[0]

    def _count(self, tracked: _Tracked) -> None:
        """Add what the client's counters rose since they were last counted."""
        assert tracked.who is not None
        where = self._where(tracked)
        for spec, (name, scale) in zip(ENGINE_COUNTERS, _COUNTERS, strict=True):
            for engine in tracked.client.engines:
                high = tracked.high.get((engine, name))
                done = tracked.counted.get((engine, name), 0)
                if high > done:
                    if not self._metrics.put(ENGINES[spec], where, engine, (high - done) * scale):
                        self._metrics.set(SKIPS, Skip.OUT_OF_RANGE, 1)  # past a double
                    tracked.counted[(engine, name)] = high
                    if self._activity is not None and spec in (ENGINE_BUSY, ENGINE_CYCLES):
                        user = (where.namespace, where.pod, where.container, where.device)
                        self._activity.busy(user, (high - done) * scale)

    def _where(self, tracked: _Tracked) -> Where:
        who, device = tracked.who or Attribution(), tracked.client.device
        vendor = self._vendor.get(device, "")
        return Where.of(who, device, vendor)

    def _cgroup_id(self, client: Client) -> int | None:
        """The cgroup id of the client's lowest pid: its cgroup directory's inode."""
        found = self._cgroups.id_of(client.cgroup) if client.cgroup else None
        if found is None:
            return None
        cgroup_id, directory = found
        self._dirs[cgroup_id] = directory
        self._on_cgroup(cgroup_id)
        return cgroup_id

    def _set_gauges(self) -> None:
        capacity: dict[tuple[Where, str], int] = {}
        memory: dict[tuple[Where, str, str], int] = {}
        for tracked in self._clients.values():
            if tracked.who is None:
                continue  # pending: no pod to show it under yet
            where = self._where(tracked)
            for engine, stats in tracked.client.engines.items():
                key = (where, engine)  # 1 when not printed: the spec's default
                capacity[key] = max(capacity.get(key, 0), stats.get("capacity", 1))
            for region, states in tracked.client.memory.items():
                for state, value in states.items():
                    mkey = (where, region, state)
                    memory[mkey] = memory.get(mkey, 0) + value
        self._metrics.set(GAUGES, "", (capacity, memory))


def _add_busy(total: list[int], more: list[int]) -> None:
    """Adds increments per _COUNTERS field: busy ns and busy cycles add up over engines and
    clients; elapsed cycles are one clock's, so the largest stands."""
    total[0] += more[0]
    total[1] += more[1]
    total[2] = max(total[2], more[2])


def build(node: Node) -> Usage | None:
    """The fdinfo source, if `fdinfo.enabled`: every device not ignored, a driver without a
    vendor plug-in too (it has no ioctl table to count, but may print usage stats)."""
    cfg = node.cfg
    if not cfg.fdinfo.enabled:
        return None
    return Usage(
        FdinfoReader(node.watched, cfg.discovery.root),
        node.resolver,
        node.table,
        node.watched,
        cfg.attribution.cgroup_root,
        pending_seconds=cfg.attribution.pending_seconds,
        on_cgroup=node.attributor.watch,  # reaped as the calls' cgroups are
        on_exhausted=partial(node.table.set, EXHAUSTED),
        activity=node.activity,
        clock=time.monotonic,
    )
