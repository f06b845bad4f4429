"""Attribution: (cgroup id, device, kind) tallies into labelled counts, held while the resolver
cannot name their pod yet (kubenpu.resolve.hold)."""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TextIO

from kubenpu.discovery import Device
from kubenpu.kernel.abi import ERRORS
from kubenpu.kernel.records import Durations
from kubenpu.metrics.catalogue import (
    DROP_REASONS,
    DROPPED,
    DURATIONS_FORGOTTEN,
    IOCTL_DURATION,
    IOCTL_ERRORS,
    IOCTL_REMOTE_NODE,
    LATE_SIGHTINGS,
    PENDING_AGE,
    PENDING_CALLS,
    PENDING_EXPIRED,
    RECEIVED,
    UNATTRIBUTED,
    UNATTRIBUTED_REASONS,
    UNTIMED,
)
from kubenpu.metrics.inputs import Where
from kubenpu.metrics.points import Point, Snapshot, plus, summed
from kubenpu.metrics.series import NodeFamily, PodFamily, PodRow, Series, by_label, counter, keyed
from kubenpu.resolve import Attribution, Unattributed
from kubenpu.resolve.hold import Hold, Resolve
from kubenpu.sources.activity import Activity
from kubenpu.sources.calls.events import Batch, Drop, Key
from kubenpu.vendors import Kind

log = logging.getLogger(__name__)


# The calls' families beside kubenpu_ioctl_total (the table's own): their durations and errors,
# and what became of the calls that were not counted under a pod.
def _duration_points(rows: list[PodRow]) -> Snapshot:
    """Each timed series' histogram (its cgroups' summed) and its non-zero error counts."""
    durations: list[Point] = []
    errors: list[Point] = []
    for row in rows:
        attrs = {**row.where, "kind": row.key}
        timed = list(row.value.values())
        durations.append(Point(attrs, summed(timed), row.start_ns))
        totals = map(sum, zip(*(x.errors for x in timed), strict=True))
        errors += [
            Point({**attrs, "error": name}, n, row.start_ns)
            for name, n in zip(ERRORS, totals, strict=True)
            if n
        ]
    return [(IOCTL_DURATION, durations), (IOCTL_ERRORS, errors)]


# put(DURATIONS, where, kind, (key, durations)): the kernel's cumulative durations and errors of
# one key (a cgroup) of a counted calls series. A series whose calls are not counted (capped) is
# not timed either; a new histogram takes room under metrics.max_series as one series. A gone
# key is retired into the series' folded total (retire).
DURATIONS = PodFamily(
    "durations",
    _duration_points,
    keyed(lambda d: sum(d.slots)),
    capped=True,
    needs_calls=True,
    live=False,
    fold=plus,
)
# put(REMOTE, where, kind, (key, n)): the kernel's cumulative remote calls of one key, as the
# durations are kept (one value per cgroup of the series, a gone one folded into the rest).
REMOTE = PodFamily(
    "remote_node",
    lambda rows: [
        (
            IOCTL_REMOTE_NODE,
            [Point({**r.where, "kind": r.key}, sum(r.value.values()), r.start_ns) for r in rows],
        )
    ],
    keyed(lambda n: 0),  # a count, not a histogram: no observations to bound
    capped=True,
    needs_calls=True,
    live=False,
    fold=lambda old, n: (old or 0) + n,
)
DROPS = by_label(DROPPED, DROP_REASONS)
EVENTS = counter(RECEIVED)
# Calls also counted, with empty pod labels, through add_calls().
UNNAMED = by_label(UNATTRIBUTED, UNATTRIBUTED_REASONS)
LATE = counter(LATE_SIGHTINGS)
UNTIMED_CALLS = counter(UNTIMED)
EXPIRED = counter(PENDING_EXPIRED)
FORGOTTEN = counter(DURATIONS_FORGOTTEN)
# set(HELD, "", (calls, seconds)): the calls held now, and how long the oldest have waited.
HELD = NodeFamily(
    PENDING_CALLS.name,
    lambda rows, start: [
        (PENDING_CALLS, [Point({}, rows[""][0], start)]),
        (PENDING_AGE, [Point({}, rows[""][1], start)]),
    ],
    initial=lambda: {"": (0, 0.0)},
)
FAMILIES = (
    DURATIONS,
    REMOTE,
    DROPS,
    EVENTS,
    UNNAMED,
    LATE,
    UNTIMED_CALLS,
    EXPIRED,
    FORGOTTEN,
    HELD,
)

_MAX_PENDING_KEYS = 10000  # keys held for pods the CRI cannot name yet
# A long flush (an adopted probe's totals for 1,000 pods: a cgroup walk and 1,000 CRI lookups
# started) counts the held cgroups whose answers came in this often, not only at its end.
_RETRY_PENDING_SECONDS = 0.1
# Calls held this long are logged, naming the CRI endpoint, once while any are held: a runtime
# that answers names a new pod well within a second, and a wrong or slow socket otherwise hides
# every new pod's calls for attribution.pending_seconds without a word.
_HELD_LOG_SECONDS = 10.0


@dataclass
class _Held:
    """Counts of a cgroup whose pod the resolver cannot name yet."""

    since: float
    counts: Counter[Key] = field(default_factory=Counter)


class Attributor:
    """Turns (cgroup id, device, kind) tallies into labelled counts, off the polling thread.

    While the resolver answers None (a CRI lookup in flight, or failing and retried), a cgroup's
    counts are held and retried at every flush; after `pending_seconds` they are counted with the
    resolver's settled answer. At most `max_pending` keys are held; calls beyond that are counted
    unattributed at once, with reason pending_full. Submit-class calls also go to `activity`
    (allocations' idle and unallocated-use signals), when given.
    """

    def __init__(
        self,
        devices: list[Device],
        resolver: Resolve,
        metrics: Series,
        trace: TextIO | None = None,
        *,
        pending_seconds: float = 120.0,
        max_pending: int = _MAX_PENDING_KEYS,
        activity: Activity | None = None,
        cri_endpoint: str = "the CRI endpoint",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """cri_endpoint: the resolver's, for the log line about held calls."""
        self._activity = activity
        self._by_node = {(n.major, n.minor): d for d in devices for n in d.nodes}
        self._resolver = resolver
        self._metrics = metrics
        self._trace = trace
        self._hold = Hold(resolver, pending_seconds, clock)
        self._pending_seconds = pending_seconds
        self._cri_endpoint = cri_endpoint
        self._max_pending = max_pending
        self._clock = clock
        self._seen: dict[int, set[Key]] = {}  # cgroup id -> its keys, until the cgroup is gone
        self._pending: dict[int, _Held] = {}
        self._held_keys = 0
        self._held_calls = 0
        self._held_shown = False  # HELD shows held calls: it is set again when none are
        self._held_logged = False  # the held calls were logged, and not all counted since
        self._expired_since_log = 0
        # The durations and remote calls last stored per key, valid while the store has dropped
        # no pod since.
        self._timed_set: dict[Key, Durations] = {}
        self._remote_set: dict[Key, int] = {}
        self._unplaced = {d.id for d in devices if not placed(d)}
        # Gone cgroups were found and may not be forgotten yet (held, or the reap's read
        # failed): the next dead_cgroups() checks again without waiting for a removal.
        self._gone_left = False

    def flush(self, batch: Batch) -> None:
        """Count a batch; the counts it did not get to (an exception) stay in `batch.counts`."""
        # The batch's cgroups the tree does not know share one walk, not one each.
        self._resolver.prefetch({*batch.sighted, *(key.cgroup_id for key in batch.counts)})
        # A first sighting is resolved at once, while a short-lived container still exists.
        for cgroup_id in batch.sighted:
            self._resolver.resolve(cgroup_id)
        if batch.received:
            self._metrics.set(EVENTS, "", batch.received)
        for reason, n in batch.dropped.items():
            self._metrics.set(DROPS, reason, n)
        if batch.late_sightings:
            self._metrics.set(LATE, "", batch.late_sightings)
        if batch.untimed:
            self._metrics.set(UNTIMED_CALLS, "", batch.untimed)
        counts = batch.counts
        retry_at = self._clock() + _RETRY_PENDING_SECONDS
        while counts:  # popped as counted: a caller can put back what an exception left
            key, n = counts.popitem()
            try:
                self._count(key, n)
            except Exception:
                counts[key] = n
                raise
            if self._clock() >= retry_at:
                self._retry_pending()
                retry_at = self._clock() + _RETRY_PENDING_SECONDS
        self._retry_pending()
        self._report_held()
        if self._trace:
            self._print_trace(batch)

    def timed(self, durations: dict[Key, Durations]) -> list[Key]:
        """The kernel's cumulative durations by key, to the series their calls are counted
        under. A key whose pod is not named yet (held, or unknown to the resolver) waits for
        the next read, which has its totals; one on a device not listed is left out, as its
        calls are (device_unknown). Returns the keys to delete from the kernel's map, counted:
        those no count claims whose cgroup the tree does not know (gone, never to be named)."""
        self._check_swept()
        if durations == self._timed_set:  # every value stored as it is (an idle node)
            return []
        # An idle key's value is already stored: setting it again would change nothing.
        changed = [(k, v) for k, v in durations.items() if self._timed_set.get(k) != v]
        # Their cgroups the tree does not know share one walk, as a flush's do: 2,000 keys
        # walked a tree of 10,000 directories 2,000 times, one at a time.
        self._resolver.prefetch({key.cgroup_id for key, _ in changed})
        orphans = []
        for key, value in changed:
            if self._orphan(key):
                orphans.append(key)
            elif self._put(DURATIONS, key, value):
                self._timed_set[key] = value
        if orphans:
            self._metrics.set(FORGOTTEN, "", len(orphans))
            for cgroup_id in {key.cgroup_id for key in orphans}:
                self._resolver.forget(cgroup_id)
        return orphans

    def _orphan(self, key: Key) -> bool:
        """A key with no count (its cgroup made no call this agent counted) whose cgroup the
        walk did not find: no call can come to it, nothing will name it."""
        if key.cgroup_id in self._seen:
            return False
        who = self._resolver.resolve(key.cgroup_id)
        return who is not None and who.reason == Unattributed.NOT_INDEXED

    def placed(self, remote: dict[Key, int]) -> None:
        """The kernel's cumulative remote calls by key (Kernel.read_remote), to the series
        their calls are counted under, as timed() does the durations. A device without a NUMA
        node has none to tell (the kernel counts none). The keys are the counts', which the
        counts' own reaping forgets."""
        self._check_swept()
        if remote == self._remote_set:  # an idle node
            return
        for key, n in remote.items():
            if self._remote_set.get(key) == n:
                continue
            dev = self._by_node.get((key.major, key.minor))
            if dev is not None and dev.id not in self._unplaced and self._put(REMOTE, key, n):
                self._remote_set[key] = n

    def _check_swept(self) -> None:
        if self._metrics.swept():  # a dropped pod took its stored values with it
            self._timed_set, self._remote_set = {}, {}

    def _put(self, family: PodFamily, key: Key, value: object) -> bool:
        """One key's cumulative value into the family, under the series its calls are counted
        under; False (left for the next read) while its pod is not named."""
        dev = self._by_node.get((key.major, key.minor))
        if dev is None or key.cgroup_id in self._pending:
            return False
        who = self._resolver.resolve(key.cgroup_id)
        if who is None:
            return False
        where = Where.of(who, dev.id, dev.vendor or "")
        return self._metrics.put(family, where, Kind(key.kind).label, (key, value))

    def pending(self) -> int:
        """Keys held for a pod the resolver cannot name yet."""
        return self._held_keys

    def _print_trace(self, batch: Batch) -> None:
        for ev in batch.events:
            dev = self._by_node.get((ev.major, ev.minor))
            who = self._resolver.resolve(ev.cgroup_id) or Attribution()  # pending: no labels yet
            line = {
                "ts_ns": ev.ts_ns,
                "tgid": ev.tgid,
                "cgroup_id": ev.cgroup_id,
                "namespace": who.namespace,
                "pod": who.pod,
                "container": who.container,
                "device": dev.id if dev else f"{ev.major}:{ev.minor}",
                "vendor": dev.vendor if dev else "",
                "nr": f"0x{ev.cmd & 0xFF:02X}",
                "kind": Kind(ev.kind).label,
            }
            print(json.dumps(line), file=self._trace)
        if batch.untraced:
            print(f"# {batch.untraced} events not shown: trace backlog full", file=self._trace)
        self._trace.flush()

    def _count(self, key: Key, n: int) -> None:
        dev = self._by_node.get((key.major, key.minor))
        if dev is None:
            self._metrics.set(DROPS, Drop.DEVICE_UNKNOWN, n)
            return
        self._seen.setdefault(key.cgroup_id, set()).add(key)
        held = self._pending.get(key.cgroup_id)
        who = None if held else self._resolver.resolve(key.cgroup_id)
        if who is not None:
            self._add(who, key, n, dev)
        elif held is not None and key in held.counts:
            held.counts[key] += n
            self._held_calls += n
        elif self._held_keys < self._max_pending:
            if held is None:
                held = self._pending[key.cgroup_id] = _Held(self._clock())
            held.counts[key] = n
            self._held_keys += 1
            self._held_calls += n
        else:
            self._metrics.set(UNNAMED, Unattributed.PENDING_FULL, n)
            self._add(Attribution(), key, n)

    def _add(self, who: Attribution, key: Key, n: int, dev: Device | None = None) -> None:
        dev = dev or self._by_node[(key.major, key.minor)]
        if who.reason:
            self._metrics.set(UNNAMED, who.reason, n)
        self._metrics.add_calls(
            namespace=who.namespace,
            pod=who.pod,
            container=who.container,
            device=dev.id,
            vendor=dev.vendor or "",
            kind=Kind(key.kind).label,
            n=n,
            pod_uid=who.pod_uid,
        )
        if self._activity is not None and key.kind == Kind.SUBMIT:
            self._activity.submitted((who.namespace, who.pod, who.container, dev.id), n)

    def _retry_pending(self, settle: bool = False) -> None:
        for cgroup_id, held in list(self._pending.items()):
            answer = self._hold.answer(cgroup_id, held.since, settle=settle)
            if answer is None:
                continue
            who, settled = answer
            calls = sum(held.counts.values())
            if settled:
                self._metrics.set(EXPIRED, "", calls)
                self._expired_since_log += calls
            del self._pending[cgroup_id]
            self._held_keys -= len(held.counts)
            self._held_calls -= calls
            for key, n in held.counts.items():
                self._add(who, key, n)

    def settle_all(self) -> None:
        """Count every held call now, with the best answer there is (before exit)."""
        self._retry_pending(settle=True)
        self._report_held()

    def _report_held(self) -> None:
        """The held calls' gauges; one warning when they have waited _HELD_LOG_SECONDS, and
        one line when none are held any more."""
        oldest = next(iter(self._pending.values()), None)  # held in order of arrival
        if oldest is None and not self._held_shown:
            return  # nothing held before or now: the gauges already say 0
        age = 0.0 if oldest is None else self._clock() - oldest.since
        self._metrics.set(HELD, "", (self._held_calls, age))
        self._held_shown = oldest is not None
        if oldest is not None and age >= _HELD_LOG_SECONDS and not self._held_logged:
            self._held_logged, self._expired_since_log = True, 0
            log.warning(
                "%d call(s) of %d cgroup(s) held for %.0f s: the CRI at %s has not named their "
                "pods (wrong socket, runtime down or slow: see kubenpu_cri_errors_total). They "
                "are counted under their pods when it answers, else with empty pod labels after "
                "attribution.pending_seconds (%g s); kubenpu_pending_calls shows how many wait",
                self._held_calls,
                len(self._pending),
                age,
                self._cri_endpoint,
                self._pending_seconds,
            )
        elif oldest is None and self._held_logged:
            self._held_logged = False
            log.info(
                "no calls held any more; %d of them counted with empty pod labels "
                "(kubenpu_pending_expired_calls_total)",
                self._expired_since_log,
            )

    def used(self) -> dict[int, set[str]]:
        """The devices (ids) each live cgroup has called, since it was first seen."""
        return {
            cgroup_id: {self._by_node[k.major, k.minor].id for k in keys}
            for cgroup_id, keys in self._seen.items()
        }

    def watch(self, cgroup_id: int) -> None:
        """Reap cgroup_id like a calling one (it holds a DRM client): retire its container when
        its directory is gone."""
        self._seen.setdefault(cgroup_id, set())

    def dead_cgroups(self) -> list[int]:
        """Cgroups seen here whose directory is gone and whose counts are not held; each one
        checked only when a cgroup may have been removed since (Resolve.removed)."""
        if not (self._gone_left or self._resolver.removed()):
            return []
        gone = [c for c in self._seen if not self._resolver.alive(c)]
        self._gone_left = bool(gone)
        return [c for c in gone if c not in self._pending]

    def forget(self, cgroup_ids: list[int]) -> list[Key]:
        """Retire dead cgroups' containers and forget them; returns their keys."""
        keys: list[Key] = []
        for cgroup_id in cgroup_ids:
            who = self._resolver.resolve(cgroup_id)
            gone = self._seen.pop(cgroup_id)
            if who is not None:  # a container without pod labels retires too
                for key in gone:  # its durations stay in its series' totals, not per cgroup
                    dev = self._by_node[(key.major, key.minor)]
                    where = Where.of(who, dev.id, dev.vendor or "")
                    self._metrics.retire(DURATIONS, where, Kind(key.kind).label, key)
                    self._metrics.retire(REMOTE, where, Kind(key.kind).label, key)
                self._metrics.gone(Where.of(who))
                if self._activity is not None:
                    self._activity.gone(who.namespace, who.pod, who.container)
            self._resolver.forget(cgroup_id)
            keys.extend(gone)
        for key in keys:
            self._timed_set.pop(key, None)
            self._remote_set.pop(key, None)
        return keys


def placed(device: Device) -> bool:
    """Whether the device has a NUMA node its calls can be remote from (sysfs numa_node -1, or
    none: an integrated GPU, a machine or kernel without NUMA)."""
    return device.numa_node is not None and device.numa_node >= 0
