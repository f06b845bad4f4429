import struct

import pytest

from kubenpu.kernel.abi import dev_t, split_dev_t
from kubenpu.metrics.catalogue import Drop
from kubenpu.sources.calls.events import SIZE, BadRecord, Deltas, Key, Tally, decode


def raw(cgroup_id=7, major=226, minor=128, kind=1, cmd=0xC0306443, tgid=42, ts=99) -> bytes:
    return struct.pack("<QQIIIIII", ts, cgroup_id, tgid, cmd, major, minor, kind, 0)


def test_decode_matches_the_c_struct_layout():
    assert SIZE == 40
    ev = decode(raw())
    assert (ev.ts_ns, ev.cgroup_id, ev.tgid, ev.cmd, ev.major, ev.minor, ev.kind) == (
        99,
        7,
        42,
        0xC0306443,
        226,
        128,
        1,
    )


def test_tally_folds_events_per_key_and_drains_once():
    tally = Tally(max_keys=10)
    for _ in range(3):
        tally.add_event(raw(kind=1))
    tally.add_event(raw(kind=2))
    batch = tally.drain()
    assert batch.counts == {Key(7, 226, 128, 1): 3, Key(7, 226, 128, 2): 1}
    assert (batch.received, batch.dropped) == (4, {})
    assert not tally.drain().counts


def test_tally_bounds_distinct_keys_and_reports_the_overflow():
    tally = Tally(max_keys=2)
    for cgroup in (1, 2, 3, 3, 1):
        tally.add_event(raw(cgroup_id=cgroup))
    batch = tally.drain()
    assert batch.counts == {Key(1, 226, 128, 1): 2, Key(2, 226, 128, 1): 1}
    assert (batch.dropped, batch.received) == ({Drop.QUEUE_FULL: 2}, 5)


def test_sightings_do_not_count_calls():
    tally = Tally(max_keys=2)
    tally.add_sighting(raw(cgroup_id=5))
    batch = tally.drain()
    assert batch.sighted == {5}
    assert not batch.counts and batch.received == 0


def test_deltas_turn_cumulative_counts_into_increments():
    deltas = Deltas()
    k1, k2 = Key(1, 226, 0, 1), Key(2, 226, 0, 3)
    assert deltas.step({k1: 5}) == {k1: 5}
    assert deltas.step({k1: 8, k2: 2}) == {k1: 3, k2: 2}
    assert deltas.step({k1: 8, k2: 2}) == {}
    deltas.forget([k1])
    assert deltas.step({k1: 1}) == {k1: 1}  # a key the kernel recreated starts from zero again


def test_deltas_rebase_on_a_total_that_went_down():
    """A lower total without forget() (a kernel entry deleted and made again) is the new base:
    the next increments count from it, not from the old, higher total."""
    deltas: Deltas[str] = Deltas()
    assert deltas.step({"k": 10}) == {"k": 10}
    assert deltas.step({"k": 3}) == {}
    assert deltas.step({"k": 5}) == {"k": 2}


@pytest.mark.parametrize(
    ("record", "why"),
    [(raw()[:39], "39 bytes"), (raw(kind=0), "unknown kind 0"), (raw(kind=9), "unknown kind 9")],
)
def test_bad_records_are_rejected_with_a_reason(record, why):
    with pytest.raises(BadRecord, match=why):
        decode(record)
    tally = Tally(max_keys=10)
    with pytest.raises(BadRecord):
        tally.add_event(record)
    with pytest.raises(BadRecord):
        tally.add_sighting(record)
    batch = tally.drain()
    assert (batch.received, batch.sighted) == (0, set())


def test_kernel_lost_slots_are_drops_except_late_sightings():
    tally = Tally(max_keys=10)
    tally.kernel_lost({"ringbuf_full": 2, "map_full": 3, "late_sighting": 4})
    batch = tally.drain()
    assert batch.dropped == {Drop.RINGBUF_FULL: 2, Drop.MAP_FULL: 3}
    assert batch.late_sightings == 4


def test_dev_t_is_the_kernel_internal_encoding():
    assert dev_t(226, 128) == 0xE200080
    assert split_dev_t(0xE200080) == (226, 128)
    assert split_dev_t(dev_t(511, 0xFFFFF)) == (511, 0xFFFFF)


def test_callers_tgids_come_with_events_and_sightings():
    tally = Tally(10)
    tally.add_event(raw(tgid=7))
    tally.add_event(raw(tgid=8))
    tally.add_sighting(raw(cgroup_id=5, tgid=9))
    assert tally.drain().tgids == {7, 8, 9}
    assert tally.drain().tgids == set()
