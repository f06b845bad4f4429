"""Who holds each device: the kubelet's allocations, refreshed on their own thread, and which
of them are idle.

Every `interval` seconds the `allocations` thread asks the kubelet (PodResources List), maps
each id to a device (kubenpu.resolve.podresources.mapping) and compares each held allocation's
use signals (kubenpu.activity: submit-class calls and engine busy time, of that container on
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

from kubenpu.activity import Activity, Use, User
from kubenpu.discovery import Device
from kubenpu.metrics.inputs import AllocationState, Held
from kubenpu.metrics.store import Metrics
from kubenpu.resolve.podresources.client import Allocated, PodResourcesClient, PodResourcesError
from kubenpu.resolve.podresources.mapping import Mapper, Unmapped

log = logging.getLogger(__name__)

_REDISCOVER_SECONDS = 60.0  # a sysfs scan, off the counting path; its warnings repeat with it


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
    `interval` seconds on a daemon thread until `close()`."""

    def __init__(
        self,
        client: PodResourcesClient,
        mapper: Mapper,
        metrics: Metrics,
        interval: float,
        activity: Activity,
        rediscover: Callable[[], Iterable[Device]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._mapper = mapper
        self._metrics = metrics
        self._activity = activity
        self._rediscover = rediscover
        self._discovered = clock()
        self._interval = interval
        self._clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
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
            self._metrics.podresources_error()
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
        self._metrics.set_allocations(
            AllocationState(
                shares,
                dict(self._idle),
                dict(self._idle_for),
                self._count_unallocated(shares, managed, use),
                unmapped,
            )
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

    def _allocatable(self) -> set[str]:
        """The devices the kubelet can allocate, where GetAllocatableResources answers."""
        try:
            found = self._client.allocatable()
        except PodResourcesError as err:  # once per connection: not available on it
            if self._stop.is_set():
                return set()  # close() ended the request
            self._metrics.podresources_error()
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
        container gone from the activity (retired) leaves with its series."""
        allocated = {(h.namespace, h.pod, h.container, h.device) for h in shares}
        seen, self._seen = self._seen, use
        for u in self._unallocated.keys() - use.keys():
            del self._unallocated[u]
        for u, (calls, _busy) in use.items():
            new = calls - seen.get(u, (0, 0.0))[0]
            if u[3] in managed and u not in allocated and new > 0:
                n, first = self._unallocated.get(u, (0, time.time_ns()))
                self._unallocated[u] = (n + new, first)
        return dict(self._unallocated)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="allocations", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stops the thread; closing the client first ends a request in flight (a kubelet that
        accepts and never answers), so the stop takes no request timeout."""
        self._stop.set()
        self._client.close()
        if self._thread is not None:
            self._thread.join(self._interval + 1)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.refresh()
            except (
                Exception
            ):  # no bad answer may stop the refreshes; counting never depends on them
                log.exception("allocations refresh failed")
                self._metrics.podresources_error()
            self._stop.wait(self._interval)
