"""Who holds each device: the kubelet's allocations, refreshed on their own thread, and which
of them are idle.

Every `interval` seconds the `allocations` thread asks the kubelet (PodResources List), maps
each id to a device (kubenpu.resolve.podresources.mapping) and compares each held allocation's
use signals (kubenpu.sources.activity: submit-class calls and engine busy time, of that container on
that device, from attribution and usage) with the previous refresh: unchanged means the whole
interval was idle. A kubelet that does not answer is a counted error and a retry at the next
refresh; the last allocations stay exported meanwhile. GetAllocatableResources only adds the
devices a plugin manages but nobody holds (calls there are unallocated use); when it is not
available the List is used all the same. An id that names no device makes the next refresh
rediscover the devices (at most every `_REDISCOVER_SECONDS`), so a hot-plugged card maps.
Counting never waits on this thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable

from kubenpu.discovery import Device, discover, not_ignored
from kubenpu.metrics.catalogue import (
    ALLOCATED,
    ALLOCATED_IDLE,
    ALLOCATED_IDLE_FOR,
    ALLOCATIONS_UNMAPPED,
    PODRESOURCES_ERRORS,
    UNALLOCATED_CALLS,
)
from kubenpu.metrics.inputs import AllocationState, Held
from kubenpu.metrics.points import Point, Snapshot
from kubenpu.metrics.series import NodeFamily, Series, counter
from kubenpu.resolve.podresources.client import Allocated, PodResourcesClient, PodResourcesError
from kubenpu.resolve.podresources.mapping import Mapper, Unmapped
from kubenpu.services import Worker
from kubenpu.sources.activity import Activity, Use, User
from kubenpu.sources.base import Node, Report

log = logging.getLogger(__name__)

_REDISCOVER_SECONDS = 60.0  # a sysfs scan, off the counting path; its warnings repeat with it
_UIDS_MAX_AGE = 60.0  # seconds: how stale the pods' uids may get (a pod recreated under its name)


def _series(state: AllocationState) -> int:
    return sum(
        map(len, (state.shares, state.idle, state.idle_for, state.unallocated, state.unmapped))
    )


def _capped(state: AllocationState, room: int) -> tuple[AllocationState, int, int]:
    """`state` in at most `room` series, the series it holds and how many it left out: the
    unmapped counts (a few, by resource and reason) first, then each Held's series together, in
    the order held, then the unallocated calls."""
    kept, dropped = AllocationState(uids=state.uids), 0  # the uids are labels, not series

    def take(cost: int) -> bool:
        nonlocal room, dropped
        if cost > room:
            dropped += cost
            return False
        room -= cost
        return True

    for key, n in state.unmapped.items():
        if take(1):
            kept.unmapped[key] = n
    parts = ((state.shares, kept.shares), (state.idle, kept.idle), (state.idle_for, kept.idle_for))
    for held in dict.fromkeys([*state.shares, *state.idle, *state.idle_for]):
        present = [(src, dst) for src, dst in parts if held in src]
        if take(len(present)):
            for src, dst in present:
                dst[held] = src[held]
    for user, calls in state.unallocated.items():
        if take(1):
            kept.unallocated[user] = calls
    return kept, _series(kept), dropped


def _points(rows: dict[str, AllocationState], start: int) -> Snapshot:
    a = rows.get("", AllocationState())

    def pod(namespace: str, name: str, *rest: tuple[str, str]) -> dict[str, str]:
        uid = a.uids.get((namespace, name), "")
        return dict([("namespace", namespace), ("pod", name), ("pod_uid", uid), *rest])

    def holder(h: Held) -> dict[str, str]:
        return pod(
            h.namespace, h.pod, *zip(("container", "device", "resource"), h[2:], strict=True)
        )

    def user(u: tuple[str, str, str, str]) -> dict[str, str]:
        return pod(u[0], u[1], ("container", u[2]), ("device", u[3]))

    return [
        (ALLOCATED, [Point(holder(h), n, start) for h, n in a.shares.items()]),
        (ALLOCATED_IDLE, [Point(holder(h), s, t) for h, (s, t) in a.idle.items()]),
        (ALLOCATED_IDLE_FOR, [Point(holder(h), s, start) for h, s in a.idle_for.items()]),
        (UNALLOCATED_CALLS, [Point(user(u), n, t) for u, (n, t) in a.unallocated.items()]),
        (
            ALLOCATIONS_UNMAPPED,
            [Point({"resource": r, "reason": why}, n, start) for (r, why), n in a.unmapped.items()],
        ),
    ]


# set(ALLOCATIONS, "", state): the last refresh's allocations, replacing the last, within the
# room the cap leaves beside the other series: 50,000 pods' allocations were 150,000 series past it.
ALLOCATIONS = NodeFamily("allocations", _points, fit=_capped)
ERRORS = counter(PODRESOURCES_ERRORS)
FAMILIES = (ALLOCATIONS, ERRORS)


def held(
    allocated: list[Allocated], mapper: Mapper
) -> tuple[dict[Held, int], dict[tuple[str, str], int]]:
    """Shares per Held, and the ids that map to no device by (resource, reason)."""
    shares: Counter[Held] = Counter()
    unmapped: Counter[tuple[str, str]] = Counter()
    for a in allocated:
        device = mapper.device(a.resource, a.id, a.cdi, a.numa)
        if isinstance(device, Unmapped):
            unmapped[(a.resource, device.value)] += 1
        else:
            shares[Held(a.namespace, a.pod, a.container, device, a.resource)] += 1
    return dict(shares), dict(unmapped)


class Allocations:
    """Refreshes the allocation series. `refresh()` is one step; `start()` runs it every
    `interval` seconds on a daemon thread until `close()`, each through the source's Report."""

    name = "allocations"

    def __init__(
        self,
        client: PodResourcesClient,
        mapper: Mapper,
        metrics: Series,
        interval: float,
        activity: Activity,
        rediscover: Callable[[], Iterable[Device]] | None = None,
        pod_uids: Callable[[], dict[tuple[str, str], str] | None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        stale_after: float | None = None,
    ) -> None:
        self._client = client
        self._mapper = mapper
        self._metrics = metrics
        self._report = Report(self.name, metrics)
        self._stale_after = stale_after  # its thread's: kubenpu.services.Worker
        self._activity = activity
        self._rediscover = rediscover
        self._pod_uids = pod_uids
        self._uids: dict[tuple[str, str], str] = {}  # the runtime's last answer
        self._asked: tuple[set[tuple[str, str]], float] = (set(), 0.0)  # for which pods, when
        self._discovered = clock()
        self._interval = interval
        self._clock = clock
        self._stop = threading.Event()
        self._thread: Worker | None = None
        self._last: dict[Held, tuple[Use, float]] = {}  # use signals at the last refresh
        self._idle: dict[Held, tuple[float, int]] = {}
        self._idle_for: dict[Held, float] = {}  # the current streak
        self._seen: dict[User, Use] = {}
        self._unallocated: dict[User, tuple[int, int]] = {}  # calls, first seen (ns)
        self._failing = False
        self._told_allocatable = False

    def refresh(self) -> bool:
        """One refresh; False when the kubelet did not answer List (counted, logged once a
        streak)."""
        try:
            allocated, skipped = self._client.list()
        except PodResourcesError as err:
            if self._stop.is_set():
                return False  # close() ended the request: not the kubelet's failure
            self._metrics.set(ERRORS, "", 1)
            if not self._failing:
                log.warning("PodResources: %s; keeping the last allocations, retrying", err)
            self._failing = True
            return False
        if self._failing:
            log.info("PodResources answers again")
        self._failing = False
        shares, unmapped = self._held(allocated)
        for reason, n in skipped.items():
            unmapped[("", reason)] = unmapped.get(("", reason), 0) + n
        use = self._activity.snapshot()
        self._account_idle(shares, use)
        managed = {h.device for h in shares} | self._allocatable()
        unallocated = self._count_unallocated(shares, managed, use)
        uids = self._uids_of({(h.namespace, h.pod) for h in shares} | {u[:2] for u in unallocated})
        self._metrics.set(
            ALLOCATIONS,
            "",
            AllocationState(
                shares, dict(self._idle), dict(self._idle_for), unallocated, unmapped, uids
            ),
        )
        return True

    def _held(
        self, allocated: list[Allocated]
    ) -> tuple[dict[Held, int], dict[tuple[str, str], int]]:
        shares, unmapped = held(allocated, self._mapper)
        stale = self._clock() - self._discovered >= _REDISCOVER_SECONDS
        if self._rediscover and stale and any(r == Unmapped.NO_DEVICE for _, r in unmapped):
            self._mapper = Mapper(self._rediscover())
            self._discovered = self._clock()
            shares, unmapped = held(allocated, self._mapper)
        return shares, unmapped

    def _uids_of(self, pods: set[tuple[str, str]]) -> dict[tuple[str, str], str]:
        """The uid of each pod the series name, from the runtime's last answer. It is asked
        again when the pods named change, or when its answer is _UIDS_MAX_AGE old (a pod
        recreated under its name gets its new uid within that): one list (ListPodSandbox) at every
        refresh cost the runtime a list every interval for nothing new. While the runtime does
        not answer, the last answer stays and the next refresh asks again."""
        now = self._clock()
        fresh = pods == self._asked[0] and now - self._asked[1] < _UIDS_MAX_AGE
        if pods and self._pod_uids is not None and not fresh:
            answer = self._pod_uids()
            if answer is not None:
                self._uids, self._asked = answer, (set(pods), now)
        return {pod: uid for pod, uid in self._uids.items() if pod in pods}

    def _allocatable(self) -> set[str]:
        """The devices the kubelet can allocate, where GetAllocatableResources answers."""
        try:
            found = self._client.allocatable()
        except PodResourcesError as err:  # once per connection: not available on it
            if self._stop.is_set():
                return set()  # close() ended the request
            self._metrics.set(ERRORS, "", 1)
            level = logging.DEBUG if self._told_allocatable else logging.WARNING
            log.log(level, "PodResources: %s; using List alone", err)
            self._told_allocatable = True
            return set()
        shares, _ = held(found or [], self._mapper)
        return {h.device for h in shares}

    def _account_idle(self, shares: dict[Held, int], use: dict[User, Use]) -> None:
        now = self._clock()
        last, self._last = self._last, {}
        for h in shares:
            signals = use.get((h.namespace, h.pod, h.container, h.device), (0, 0.0))
            seconds, start = self._idle.get(h, (0.0, time.time_ns()))
            streak = 0.0
            if h in last and last[h][0] == signals:
                seconds += now - last[h][1]
                streak = self._idle_for.get(h, 0.0) + now - last[h][1]
            self._idle[h] = (seconds, start)
            self._idle_for[h] = streak
            self._last[h] = (signals, now)
        for h in self._idle.keys() - shares.keys():  # released: its series retires
            del self._idle[h], self._idle_for[h]

    def _count_unallocated(
        self, shares: dict[Held, int], managed: set[str], use: dict[User, Use]
    ) -> dict[User, tuple[int, int]]:
        """Adds the submit-class calls each container made since the last refresh on a managed
        device (one allocations name, or the kubelet can allocate) while it held none of it. A
        container gone from the activity (retired) leaves with its series. Calls that name no
        pod (host processes, unattributed calls, ctr's containers) are not counted: only a
        pod's container can hold an allocation."""
        allocated = {(h.namespace, h.pod, h.container, h.device) for h in shares}
        seen, self._seen = self._seen, use
        for u in self._unallocated.keys() - use.keys():
            del self._unallocated[u]
        for u, (calls, _busy) in use.items():
            new = calls - seen.get(u, (0, 0.0))[0]
            if u[1] and u[3] in managed and u not in allocated and new > 0:
                n, first = self._unallocated.get(u, (0, time.time_ns()))
                self._unallocated[u] = (n + new, first)
        return dict(self._unallocated)

    def start(self) -> Worker:
        """The refresh thread, started: it fails liveness when a refresh is older than
        `stale_after`."""
        self._thread = Worker(self.name, self._loop, stale_after=self._stale_after)
        self._thread.start()
        return self._thread

    def close(self) -> None:
        """Stops the thread; closing the client first ends a request in flight (a kubelet that
        accepts and never answers), so the stop takes no request timeout."""
        self._stop.set()
        self._client.close()
        if self._thread is not None:
            self._thread.join(self._interval + 1)

    def _loop(self) -> None:
        while not self._stop.is_set():
            if self._thread is not None:
                self._thread.beat()
            self._report.read(self.refresh)  # no bad answer stops the refreshes
            self._stop.wait(self._interval)


def build(node: Node) -> Allocations | None:
    """The allocations source, if `attribution.pod_resources.enabled`: the kubelet's
    allocations, refreshed on their own thread (a dead kubelet never stalls counting)."""
    cfg = node.cfg
    pr = cfg.attribution.pod_resources
    if node.activity is None or not pr.enabled:
        return None
    return Allocations(
        PodResourcesClient(pr.socket, pr.timeout_seconds),
        Mapper(node.watched),
        node.table,
        pr.interval_seconds,
        node.activity,
        # A device plugged in after the start maps once discovery sees it.
        lambda: not_ignored(discover(cfg.discovery.root), cfg.discovery.ignore_devices),
        node.resolver.pod_uids,
        # A refresh asks the kubelet twice (List, GetAllocatableResources) and the runtime once
        # (the pods' uids), each up to its timeout: three such steps without a beat are stalled.
        stale_after=3
        * (pr.interval_seconds + 2 * pr.timeout_seconds + cfg.attribution.cri.timeout_seconds),
    )
