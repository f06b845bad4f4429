"""Kernel events: the ring-buffer records of bpf/kubenpu.bpf.c decoded (their layouts are
kubenpu/kernel/abi.py's), and their aggregation. Events are folded at once into counts keyed by
(cgroup id, device, kind), so everything downstream works per distinct key, not per call.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from kubenpu.kernel.abi import BIRTH, EVENT, LOST_SLOTS
from kubenpu.kernel.records import Birth, Event, Key
from kubenpu.metrics.catalogue import Drop
from kubenpu.vendors import Kind

SIZE = EVENT.size
_KINDS = frozenset(Kind)


# What each slot of the BPF `lost` array counts, by index (abi.LOST_SLOTS). late_sighting loses
# no call: the ring buffer had no room for an aggregate-mode first sighting, so the new cgroup is
# resolved at the next map read instead of at once. untimed loses no call either, only its
# duration. Every other slot is a Drop.
LATE_SIGHTING, UNTIMED = "late_sighting", "untimed"
KERNEL_LOST = tuple(n if n in (LATE_SIGHTING, UNTIMED) else Drop(n) for n in LOST_SLOTS)


class BadRecord(ValueError):
    """A ring-buffer record that is not a `struct event` of a known kind."""


def _fields(data: bytes) -> tuple[int, ...]:
    if len(data) < SIZE:
        raise BadRecord(f"record of {len(data)} bytes, expected {SIZE}")
    fields = EVENT.unpack_from(data)
    if fields[6] not in _KINDS:
        raise BadRecord(f"unknown kind {fields[6]}")
    return fields


def decode(data: bytes) -> Event:
    """Raises BadRecord for a record too short or of an unknown kind."""
    return Event(*_fields(data)[:7])


def birth(data: bytes) -> Birth | None:
    """The new cgroup a birth record (tp_btf cgroup_mkdir) reports; None for any other record,
    told apart by its size."""
    return Birth(*BIRTH.unpack(data)) if len(data) == BIRTH.size else None


@dataclass
class Batch:
    """What a Tally collected since the last drain."""

    counts: Counter[Key] = field(default_factory=Counter)
    dropped: Counter[Drop] = field(default_factory=Counter)  # calls lost, by reason
    received: int = 0  # calls seen, counted or not
    late_sightings: int = 0  # first sightings the kernel ring buffer had no room for
    untimed: int = 0  # counted calls whose duration the kernel could not keep
    sighted: set[int] = field(default_factory=set)  # cgroup ids announced by first sightings
    tgids: set[int] = field(default_factory=set)  # callers: every event's, each sighting's
    events: list[Event] = field(default_factory=list)  # kept only when tracing
    untraced: int = 0  # events not kept because the trace backlog was full


class Tally:
    """Counts per Key, filled by the polling thread and drained by the attribution thread.

    The number of distinct keys is bounded by ``max_keys``, so memory does not grow with the
    call rate or with a flood of new keys.
    """

    def __init__(self, max_keys: int, keep_events: bool = False) -> None:
        self._max_keys = max_keys
        self._keep_events = keep_events
        self._batch = Batch()
        self._lock = threading.Lock()

    def add(self, key: Key, n: int = 1) -> None:
        with self._lock:
            self._add(key, n)

    def add_counts(self, increments: Mapping[Key, int]) -> None:
        with self._lock:
            for key, n in increments.items():
                self._add(key, n)

    def _add(self, key: Key, n: int) -> None:  # caller holds the lock
        batch = self._batch
        batch.received += n
        if key in batch.counts or len(batch.counts) < self._max_keys:
            batch.counts[key] += n
        else:
            batch.dropped[Drop.QUEUE_FULL] += n

    def put_back(self, counts: Mapping[Key, int]) -> None:
        """Counts drained but not counted downstream, for the next drain (not received again)."""
        with self._lock:
            self._batch.counts.update(counts)

    def drop(self, reason: Drop, n: int = 1) -> None:
        with self._lock:
            self._batch.dropped[reason] += n

    def kernel_lost(self, lost: Mapping[str, int]) -> None:
        """Increments of the BPF `lost` slots, by KERNEL_LOST name."""
        with self._lock:
            for name, n in lost.items():
                if name == LATE_SIGHTING:
                    self._batch.late_sightings += n
                elif name == UNTIMED:
                    self._batch.untimed += n
                else:
                    self._batch.dropped[Drop(name)] += n

    def add_event(self, data: bytes) -> None:
        """Events mode: each ring-buffer record is one call. Raises BadRecord."""
        fields = _fields(data)  # the hot path: no Event built unless tracing
        _, cgroup_id, tgid, _, major, minor, kind, _ = fields
        with self._lock:
            self._add(Key(cgroup_id, major, minor, kind), 1)
            self._batch.tgids.add(tgid)
        if self._keep_events:
            self._keep(Event(*fields[:7]))

    def _keep(self, event: Event) -> None:
        with self._lock:
            batch = self._batch
            if len(batch.events) < self._max_keys:
                batch.events.append(event)
            else:
                batch.untraced += 1

    def add_sighting(self, data: bytes) -> None:
        """Aggregate mode: a record announces a new key; the kernel map holds its count."""
        _, cgroup_id, tgid, *_ = _fields(data)
        with self._lock:
            self._batch.sighted.add(cgroup_id)
            self._batch.tgids.add(tgid)

    def sighted(self) -> bool:
        """Whether a new key was announced since the last drain."""
        with self._lock:
            return bool(self._batch.sighted)

    def drain(self) -> Batch:
        with self._lock:
            batch, self._batch = self._batch, Batch()
        return batch


K = TypeVar("K", bound=Hashable)


class Deltas(Generic[K]):
    """Turns the kernel's cumulative counters into increments since the previous read."""

    def __init__(self) -> None:
        self._last: dict[K, int] = {}

    def step(self, cumulative: Mapping[K, int]) -> dict[K, int]:
        if cumulative == self._last:  # an idle node's read: one comparison, not one per key
            return {}
        increments = {}
        for key, total in cumulative.items():
            delta = total - self._last.get(key, 0)
            if delta > 0:
                increments[key] = delta
            self._last[key] = total
        return increments

    def forget(self, keys: Iterable[K]) -> None:
        for key in keys:
            self._last.pop(key, None)
