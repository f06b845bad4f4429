"""Why calls were lost before being counted: the reasons of kubenpu_events_dropped_total.

The event side counts by them (kubenpu.events, the probe, attribution) and the metric catalogue
lists them. They live here, below both, so that the catalogue, and kubenpuctl with it, loads
nothing of the kernel side.
"""

from __future__ import annotations

from enum import StrEnum


class Drop(StrEnum):
    """Why calls were lost (kubenpu_events_dropped_total{reason})."""

    RINGBUF_FULL = "ringbuf_full"  # events mode: the kernel ring buffer had no room
    MAP_FULL = "map_full"  # aggregate mode: the counts map had no room for a new key
    QUEUE_FULL = "queue_full"  # a batch already held probe.queue_size distinct keys
    DEVICE_UNKNOWN = "device_unknown"  # a call on a device the agent did not list
    BAD_RECORD = "bad_record"  # a ring-buffer record that could not be decoded
    # a call made while a new probe took over from a pinned one (docs/pinning.md): counted once
    # by the retiring probe or not at all; an upper bound of the calls a hand-over lost
    HANDOVER = "handover"
