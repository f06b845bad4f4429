"""GPU jobs per pod (docs/jobs.md): the kernel's per-{cgroup, ring} job counts and histograms
(kubenpu.kernel.jobs), attributed like the calls and put into the series table at each fdinfo read.

The DRM GPU scheduler is a module: its tracepoints appear when a driver built on it loads, so
the probe attaches on the `jobs` thread, retried every `retry_seconds` until it does (a kernel
BTF load takes a moment; counting never waits on it). Reads run on the attribution thread, as
the resolver wants, and only once attached. The kernel's values are cumulative, so a cgroup the
resolver cannot name yet loses nothing: its jobs are set once it can, or after
`pending_seconds` with the settled answer, which is then kept for the cgroup. A cgroup that is
gone has its last values set, its container retired, and its keys deleted from the kernel's
table (which has room for abi's JOB_KEYS).

A device reset (kubenpu.sources.wedges calls reset() on its thread) is taken in at once with its
guilty task's cgroup (the uevent's PID=, read before the task can exit). Its victims are the keys
whose scheduler timeout count (JobTimes.timeouts: the kernel counts, at the ring's timeout, every
key with jobs in flight) rose on the device's rings: read then, not at the uevent, after which they
may long be done. The next read pairs each reset, in order, with one rise of those keys and counts
it per pod (POD_HANGS, RESET_VICTIMS). A rise no reset takes within `STALE_RISE_SECONDS` (the
driver recovered without one) is dropped, and said.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import NamedTuple, Protocol

from kubenpu.discovery import Device, platform_id
from kubenpu.kernel.abi import JOB_LOST_REASONS
from kubenpu.kernel.errors import ProbeError
from kubenpu.kernel.jobs import JobsKernel, Ring
from kubenpu.kernel.records import JobStep, JobTimes
from kubenpu.metrics.catalogue import (
    JOB_RUN,
    JOB_WAIT,
    JOB_WAIT_BEHIND,
    JOB_WAIT_IDLE,
    JOBS,
    JOBS_IN_FLIGHT,
    JOBS_LOST,
    POD_HANGS,
    RESET_VICTIMS,
    Spec,
)
from kubenpu.metrics.inputs import Where
from kubenpu.metrics.points import Point, Snapshot, plus, summed
from kubenpu.metrics.series import NodeFamily, PodFamily, PodRow, Series, added, keyed
from kubenpu.resolve import Attribution
from kubenpu.resolve.cgroups import ProcCgroups
from kubenpu.resolve.hold import Hold, Resolve
from kubenpu.services import Streak, Worker
from kubenpu.sources.base import Node
from kubenpu.sources.contention import OTHER, UNKNOWN, Contention
from kubenpu.sources.usage import Usage

log = logging.getLogger(__name__)

STALE_RISE_SECONDS = 30.0  # a timeout's reset uevent comes within the driver's reset, or never
# build()'s wait before the first look for the DRM GPU scheduler: on a node without one the
# look is a pass over all of /proc/kallsyms, which beside the calls' probe load and first counts
# delayed an agent's first metric by about 6 of its 20 guest seconds under TCG
# (docs/performance.md); the jobs' probe attaches this much later where a driver is loaded.
FIRST_CHECK_SECONDS = 10.0
MAX_HELD_RESETS = 1024  # resets waiting for a read; a device resets a few times a minute at most


def _job_points(rows: list[PodRow]) -> Snapshot:
    """The GPU job histograms, counts and jobs in flight of each (pod, device, ring)."""
    by_spec: dict[Spec, list[Point]] = {s: [] for s in (JOB_WAIT, JOB_RUN, JOBS, JOBS_IN_FLIGHT)}
    for row in rows:
        attrs, times = {**row.where, "ring": row.key}, list(row.value.values())
        done = sum(t.done for t in times)
        in_flight = max(0, sum(t.queued for t in times) - done)
        by_spec[JOB_WAIT].append(Point(attrs, summed(t.wait for t in times), row.start_ns))
        by_spec[JOB_RUN].append(Point(attrs, summed(t.run for t in times), row.start_ns))
        by_spec[JOBS].append(Point(attrs, done, row.start_ns))
        by_spec[JOBS_IN_FLIGHT].append(Point(attrs, in_flight, row.start_ns))
    return list(by_spec.items())


def _resets(spec: Spec) -> PodFamily:
    """put(family, where, "", 1): one device reset the container hung or lost work in. Not a
    sign of life: a reset names a container that may be gone (a pod it alone names retires
    after metrics.series_ttl_seconds). A series under the cap, as the pod's others."""
    return PodFamily(
        "resets",
        lambda rows: [(spec, [Point(r.where, r.value, r.start_ns) for r in rows])],
        added,
        capped=True,
        live=False,
    )


def _fold(retired: JobTimes | None, gone: JobTimes) -> JobTimes:
    """A gone cgroup's jobs added into its series' retired ones. Its jobs in flight are not:
    its keys leave the kernel's table, so no done can come for them."""
    if retired is None:
        return gone._replace(queued=gone.done)
    return JobTimes(
        retired.queued + gone.done,
        retired.done + gone.done,
        plus(retired.wait, gone.wait),
        plus(retired.run, gone.run),
        retired.timeouts + gone.timeouts,
    )


# put(JOB_TIMES, where, ring, (cgroup id, times)): the kernel's cumulative GPU jobs of one cgroup
# on one ring; a new (pod, device, ring) takes room under metrics.max_series as four series (its
# four points: the wait and run histograms, the job count and the jobs in flight). A gone cgroup
# is retired into the series' folded total (retire).
JOB_TIMES = PodFamily(
    "jobs",
    _job_points,
    keyed(lambda t: max(sum(t.wait.slots), sum(t.run.slots))),
    capped=True,
    cost=4,
    fold=_fold,
)
RESETS = {spec: _resets(spec) for spec in (POD_HANGS, RESET_VICTIMS)}
# set(LOST, "", {reason: n}): the job losses by reason, cumulative: the kernel side's, and
# the job steps the blocked-by replay took late.
LATE = "events_late"
LOST = NodeFamily(
    JOBS_LOST.name,
    lambda rows, start: [
        (JOBS_LOST, [Point({"reason": r}, n, start) for r, n in rows[""].items()])
    ],
    initial=lambda: {"": dict.fromkeys((*JOB_LOST_REASONS, LATE), 0)},
)
_SEP = "\n"  # in a behind row's key: no ring, namespace or pod name holds a newline


def _behind_points(rows: list[PodRow]) -> Snapshot:
    points = []
    for row in rows:
        ring, namespace, pod = row.key.split(_SEP)
        attrs = {**row.where, "ring": ring, "behind_namespace": namespace, "behind_pod": pod}
        points.append(Point(attrs, row.value / 1e9, row.start_ns))
    return [(JOB_WAIT_BEHIND, points)]


def _idle_points(rows: list[PodRow]) -> Snapshot:
    points = [Point({**r.where, "ring": r.key}, r.value / 1e9, r.start_ns) for r in rows]
    return [(JOB_WAIT_IDLE, points)]


# put(BEHIND, where, "ring\nbehind namespace\nbehind pod", ns): queue wait behind that pod's
# jobs; put(IDLE, where, ring, ns): on an idle ring. Counters, in ns until rendered.
BEHIND = PodFamily("jobs_behind", _behind_points, added, capped=True)
IDLE = PodFamily("jobs_idle", _idle_points, added, capped=True)
FAMILIES = (JOB_TIMES, *RESETS.values(), LOST, BEHIND, IDLE)


class _Reset(NamedTuple):
    device: str
    guilty: int | None  # the cgroup id of the task the kernel named


class Clients(Protocol):
    """What the client-id join needs of the fdinfo source (kubenpu.sources.usage.Usage)."""

    def client_cgroups(self) -> dict[tuple[str, int], int]: ...
    def saw(self, tgids: Iterable[int], cgroup_ids: Iterable[int]) -> None: ...


class JobsProbe(Protocol):
    """What Jobs needs of kubenpu.kernel.jobs.JobsKernel (a fake's in tests)."""

    def check(self) -> None: ...
    def available(self) -> bool: ...
    def start(self) -> str: ...
    def read(self) -> dict[tuple[int, int], JobTimes]: ...
    def rings(self) -> dict[int, Ring]: ...
    def lost(self) -> dict[str, int]: ...
    def events(self) -> list[JobStep]: ...
    def forget(self, cgroup_ids: Iterable[int]) -> None: ...
    def close(self) -> None: ...


class Jobs:
    """The GPU jobs source: attaches on its own thread, read on the attribution thread."""

    name = "jobs"

    def __init__(
        self,
        kernel: JobsProbe,
        resolver: Resolve,
        metrics: Series,
        devices: Iterable[Device],
        pending_seconds: float = 5.0,
        retry_seconds: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        cgroups: ProcCgroups | None = None,
        first_check_seconds: float = 0.0,
        max_pairs: int = 16,
        now_ns: Callable[[], int] = time.monotonic_ns,
        clients: Clients | None = None,
    ) -> None:
        self._kernel = kernel
        self._metrics = metrics
        self._resolver = resolver
        self._hold = Hold(resolver, pending_seconds, clock)
        self._clock = clock
        self._retry = retry_seconds
        self._first_check = first_check_seconds
        self._vendor = {d.id: d.vendor or "" for d in devices}
        self._first_seen: dict[int, float] = {}  # cgroup id -> first read, while held
        self._who: dict[int, Attribution] = {}  # cgroup id -> its answer, once given
        self.attached = threading.Event()
        self._stop = threading.Event()
        # Held by a start under way and by close(): libbpf's object must not close under its load.
        self._loading = threading.Lock()
        self._thread: Worker | None = None
        self._failures = Streak("attaching the GPU jobs probe", log)
        self._cgroups = cgroups
        self._resets: collections.deque[_Reset] = collections.deque()
        self._dropped = 0  # resets dropped while MAX_HELD_RESETS waited, said once
        self._paired: dict[tuple[int, int], int] = {}  # key -> its timeouts taken by resets
        self._rising_since: dict[tuple[int, int], float] = {}  # key -> unpaired rise first seen
        self._contention = Contention(max_pairs)
        self._now_ns = now_ns  # bpf_ktime_get_ns's clock, CLOCK_MONOTONIC
        # Blocked-by ns whose cgroups the resolver cannot name yet: (ring, waiter, behind or
        # None for idle) -> ns, put once it can.
        self._owed: collections.Counter[tuple[int, int, int | None]] = collections.Counter()
        # The client-id join (6.17 on): (ring, client id, queueing cgroup) not yet compared with
        # fdinfo's client, and those compared; how many agreed and disagreed.
        self._clients = clients
        self._unjoined: set[tuple[int, int, int]] = set()
        self._joined: set[tuple[int, int, int]] = set()
        self.joins = {"agree": 0, "disagree": 0}

    def start(self) -> Worker:
        """The attach thread, started; it ends once attached (or when the kernel cannot)."""
        self._thread = Worker(self.name, self._attach, lasting=False)
        self._thread.start()
        return self._thread

    def _attach(self) -> None:
        if self._stop.wait(self._first_check):  # closed before the first look
            return
        try:
            self._kernel.check()  # first and once: capabilities do not change, so no retry
        except ProbeError as exc:
            log.error("GPU jobs off: %s", exc)
            return
        said = False
        while not self._stop.is_set():
            if not self._kernel.available():  # most nodes' normal state: not an error
                if not said:
                    log.info("GPU jobs: no driver on the DRM GPU scheduler loaded yet")
                    said = True
                self._stop.wait(self._retry)
                continue
            try:
                with self._loading:
                    if self._stop.is_set():  # closed while it waited
                        return
                    how = self._kernel.start()
            except Exception as exc:  # logged, retried: the thread never dies silently
                self._failures.failed(exc)
                self._stop.wait(self._retry)
                continue
            self._failures.ok()
            log.info("GPU jobs: attached (%s)", how)
            self.attached.set()
            return

    def read(self) -> None:
        """Set every {cgroup, ring}'s jobs whose pod the resolver names (or has settled), then
        retire the cgroups that are gone."""
        if not self.attached.is_set():
            return
        now = self._now_ns()  # before the ring buffer is read: no step after it is replayed
        steps = self._kernel.events()
        rings, table = self._kernel.rings(), self._kernel.read()
        cgroups = set()
        for (cgroup_id, ring_addr), times in table.items():
            cgroups.add(cgroup_id)
            ring, who = rings.get(ring_addr), self._attribute(cgroup_id)
            if ring is None or who is None:
                continue  # read again next time: the values are cumulative
            self._metrics.put(JOB_TIMES, self._where(who, ring), ring.name, (cgroup_id, times))
        self._contend(steps, now, rings)
        self._join(rings, steps)
        self._metrics.set(LOST, "", {**self._kernel.lost(), LATE: self._contention.late})
        self._count_resets(table, rings)
        dead = [c for c in cgroups if c in self._who and not self._resolver.alive(c)]
        self._reap(dead, [(c, rings.get(a)) for c, a in table if c in dead])

    def _contend(self, steps: list[JobStep], now: int, rings: dict[int, Ring]) -> None:
        """The blocked-by replay up to now, its nanoseconds put per pod where the resolver
        names both cgroups (else kept for a later read)."""
        self._contention.add(steps)
        self._contention.advance(now)
        behind, idle = self._contention.take()
        self._owed.update(behind)
        self._owed.update({(ring, waiter, None): ns for (ring, waiter), ns in idle.items()})
        for key, ns in list(self._owed.items()):
            ring_addr, waiter, blocker = key
            ring, who = rings.get(ring_addr), self._attribute(waiter)
            labels = self._behind_labels(blocker)
            if ring is None or who is None or labels is None:
                continue
            where = self._where(who, ring)
            if blocker is None:
                self._metrics.put(IDLE, where, ring.name, ns)
            else:
                self._metrics.put(BEHIND, where, _SEP.join((ring.name, *labels)), ns)
            del self._owed[key]

    def _join(self, rings: dict[int, Ring], steps: list[JobStep]) -> None:
        """Each job client (ring, client id, queueing cgroup) once against fdinfo's client of
        that id on the ring's device: the pods of the queueing task and of the client's lowest
        pid should be one. The queueing task's is kept where not (docs/jobs.md, Which pod)."""
        found, self._contention.clients = self._contention.clients, set()
        if self._clients is None:
            return
        # The processes that queued jobs are DRM clients: fdinfo's next read scans them (a
        # driver whose job ioctl the call probe does not count would not name them else).
        self._clients.saw({s.tgid for s in steps if s.tgid}, ())
        self._unjoined |= found - self._joined
        held = self._clients.client_cgroups()
        for key in list(self._unjoined):
            ring_addr, client_id, cgroup = key
            ring = rings.get(ring_addr)
            holder = None if ring is None else held.get((self._device(ring.device), client_id))
            queuer = self._attribute(cgroup)
            owner = None if holder is None else self._attribute(holder)
            if ring is None or queuer is None or owner is None:
                continue  # fdinfo has not read the client yet, or a pod is not named yet
            self._unjoined.discard(key)
            self._joined.add(key)
            agree = (queuer.namespace, queuer.pod, queuer.pod_uid) == (
                owner.namespace,
                owner.pod,
                owner.pod_uid,
            )
            self.joins["agree" if agree else "disagree"] += 1
            if not agree:
                log.warning(
                    "GPU jobs: client %d on %s queued jobs from pod %s/%s, but its fd is held "
                    "by pod %s/%s; the jobs count for the queueing task's (%d such clients)",
                    client_id,
                    ring.device,
                    queuer.namespace,
                    queuer.pod,
                    owner.namespace,
                    owner.pod,
                    self.joins["disagree"],
                )
            elif self.joins["agree"] == 1:
                log.info(
                    "GPU jobs: client ids joined to fdinfo's clients: client %d on %s is pod "
                    "%s/%s's in both",
                    client_id,
                    ring.device,
                    queuer.namespace,
                    queuer.pod,
                )

    def _behind_labels(self, blocker: int | None) -> tuple[str, str] | None:
        """(behind_namespace, behind_pod) of a blocking cgroup: other past the cap, the
        unattributed conventions' empty pod for a job not seen queued; None while unnamed."""
        if blocker is None or blocker == UNKNOWN:
            return ("", "")
        if blocker == OTHER:
            return ("", "other")
        who = self._attribute(blocker)
        return None if who is None else (who.namespace, who.pod)

    def finish(self) -> None:
        """The last read, at the stop: the kernel's values since the last read are not lost."""
        self.read()

    def reset(self, device: str, pid: int | None) -> None:
        """A reset of `device` now, its guilty task's pid where the kernel named one. Only a
        read takes resets in, and none reads before the probe attaches (on some nodes, never):
        at most MAX_HELD_RESETS wait, the oldest dropped beyond, and said. The reset itself is
        counted by the uevents source all the same."""
        if len(self._resets) == MAX_HELD_RESETS:
            self._resets.popleft()
            self._dropped += 1
            if self._dropped == 1:
                log.warning(
                    "GPU jobs: %d device resets wait for the probe to attach; the oldest "
                    "one's pods are not counted, and any more past it",
                    MAX_HELD_RESETS,
                )
        found = self._cgroups.of_pid(pid) if pid and self._cgroups else None
        self._resets.append(_Reset(device, found[0] if found else None))

    def _count_resets(self, table: dict[tuple[int, int], JobTimes], rings: dict[int, Ring]) -> None:
        """The resets taken in since the last read, in order, each with one timeout rise of the
        keys on its device, per pod; one whose pods the resolver cannot name yet waits (with the
        later ones) for the next read."""
        rising = {k for k, t in table.items() if t.timeouts > self._paired.get(k, 0)}
        while self._resets:
            r = self._resets[0]
            keys = [k for k in rising if self._on(rings.get(k[1]), r.device)]
            cgroups = [(POD_HANGS, r.guilty)] if r.guilty else []
            cgroups += [(RESET_VICTIMS, c) for c in sorted({c for c, _ in keys} - {r.guilty})]
            answers = [(spec, self._attribute(c)) for spec, c in cgroups]
            if any(who is None for _, who in answers):
                return
            self._resets.popleft()
            for k in keys:
                self._paired[k] = self._paired.get(k, 0) + 1
                if self._paired[k] == table[k].timeouts:
                    rising.discard(k)
            vendor = self._vendor.get(r.device, "")
            for spec, who in answers:
                assert who is not None
                self._metrics.put(RESETS[spec], Where.of(who, r.device, vendor), "", 1)
        self._drop_stale(rising, table)

    def _drop_stale(
        self, rising: set[tuple[int, int]], table: dict[tuple[int, int], JobTimes]
    ) -> None:
        """Rises no reset took for STALE_RISE_SECONDS: timeouts the driver recovered from."""
        now = self._clock()
        self._rising_since = {k: self._rising_since.get(k, now) for k in rising}
        for key, since in list(self._rising_since.items()):
            if now - since >= STALE_RISE_SECONDS:
                log.info(
                    "GPU jobs: a scheduler timeout of cgroup %d's jobs had no reset in %.0f s; "
                    "not counted as a reset's victim",
                    key[0],
                    STALE_RISE_SECONDS,
                )
                self._paired[key] = table[key].timeouts
                del self._rising_since[key]

    def _on(self, ring: Ring | None, device: str) -> bool:
        return ring is not None and self._device(ring.device) == device

    def _attribute(self, cgroup_id: int) -> Attribution | None:
        if (who := self._who.get(cgroup_id)) is not None:
            return who
        since = self._first_seen.setdefault(cgroup_id, self._clock())
        answer = self._hold.answer(cgroup_id, since)
        if answer is None:
            return None
        self._first_seen.pop(cgroup_id, None)
        self._who[cgroup_id] = answer[0]
        return answer[0]

    def _where(self, who: Attribution, ring: Ring) -> Where:
        device = self._device(ring.device)
        return Where.of(who, device, self._vendor.get(device, ""))

    def _reap(self, dead: list[int], keys: list[tuple[int, Ring | None]]) -> None:
        """Gone cgroups, whose last values this read set (`keys`: their rings): their values
        stay in their series' totals, their container retires, their keys leave the kernel's
        table."""
        if not dead:
            return
        for cgroup_id, ring in keys:
            if ring is not None:
                where = self._where(self._who[cgroup_id], ring)
                self._metrics.retire(JOB_TIMES, where, ring.name, cgroup_id)
        for cgroup_id in dead:
            who = self._who.pop(cgroup_id)
            for key in [k for k in self._paired if k[0] == cgroup_id]:
                del self._paired[key]
                self._rising_since.pop(key, None)
            self._metrics.gone(Where.of(who))
        self._kernel.forget(dead)
        self._contention.forget(dead)
        gone = set(dead)
        self._unjoined = {k for k in self._unjoined if k[2] not in gone}
        self._joined = {k for k in self._joined if k[2] not in gone}

    def _device(self, name: str) -> str:
        """The agent's device id of a scheduler's device name: a PCI address is its own; a
        platform device's is platform:<name> (kubenpu.discovery)."""
        return name if name in self._vendor else platform_id(name)

    def close(self) -> None:
        """Stop attaching; a start under way is waited for, then closed with the rest."""
        self._stop.set()
        with self._loading:
            self._kernel.close()
        if self._thread is not None:
            self._thread.join(5.0)


def build(node: Node) -> Jobs | None:
    """The GPU jobs source, if `probe.jobs`; its start() attaches on its own thread once the DRM
    GPU scheduler is loaded."""
    cfg = node.cfg
    if not cfg.probe.jobs:
        return None
    cgroups = ProcCgroups(cfg.attribution.cgroup_root)  # a reset's guilty pid to its cgroup
    usage = node.built.get("fdinfo")  # its clients, for the client-id join
    pending = cfg.attribution.pending_seconds
    return Jobs(
        JobsKernel(),
        node.resolver,
        node.table,
        node.found,
        pending,
        cgroups=cgroups,
        first_check_seconds=FIRST_CHECK_SECONDS,
        max_pairs=cfg.metrics.max_behind_pairs,
        clients=usage if isinstance(usage, Usage) else None,
    )
