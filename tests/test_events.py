import struct

from kubenpu.events import SIZE, Deltas, Key, Tally, decode


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
    assert (batch.received, batch.overflow) == (4, 0)
    assert not tally.drain().counts


def test_tally_bounds_distinct_keys_and_reports_the_overflow():
    tally = Tally(max_keys=2)
    for cgroup in (1, 2, 3, 3, 1):
        tally.add_event(raw(cgroup_id=cgroup))
    batch = tally.drain()
    assert batch.counts == {Key(1, 226, 128, 1): 2, Key(2, 226, 128, 1): 1}
    assert (batch.overflow, batch.received) == (2, 5)


def test_sightings_do_not_count_calls():
    tally = Tally(max_keys=2)
    tally.add_sighting(raw(cgroup_id=5))
    batch = tally.drain()
    assert batch.sighted == {5}
    assert not batch.counts and batch.received == 0


def test_deltas_turn_cumulative_counts_into_increments():
    tally, deltas = Tally(max_keys=10), Deltas()
    k1, k2 = Key(1, 226, 0, 1), Key(2, 226, 0, 3)
    deltas.feed({k1: 5}, tally)
    deltas.feed({k1: 8, k2: 2}, tally)
    deltas.feed({k1: 8, k2: 2}, tally)
    assert tally.drain().counts == {k1: 8, k2: 2}
    deltas.forget([k1])
    deltas.feed({k1: 1}, tally)  # a key the kernel recreated starts from zero again
    assert tally.drain().counts == {k1: 1}
