"""Cgroup births (the kernel's tp_btf cgroup_mkdir records) through the real Probe: in both probe
modes they reach on_births at the end of the poll, on the polling thread, and are never taken for
a call."""

import struct

import pytest
from fakes import FakeKernel

from kubenpu.metrics.catalogue import Drop
from kubenpu.sources.calls.events import SIZE, Birth, Key, Tally, birth
from kubenpu.sources.calls.probe import Probe

BIRTH = struct.pack("<QQ", 7, 3)  # struct birth {u64 cgroup_id; u64 parent_id;}, packed here


def test_a_birth_record_is_told_from_a_call_by_its_size() -> None:
    assert birth(BIRTH) == Birth(cgroup_id=7, parent_id=3)
    assert birth(bytes(SIZE)) is None
    assert len(BIRTH) != SIZE


def a_birth_and_three_calls(aggregate: bool) -> tuple[FakeKernel, Tally, list[Birth], Probe]:
    """A started Probe whose ring holds a birth and then three calls of one key."""
    kernel = FakeKernel(aggregate=aggregate)
    tally = Tally(max_keys=16)
    births: list[Birth] = []
    probe = Probe(kernel, tally, on_births=births.extend)
    probe.start()
    kernel.emit(BIRTH)
    kernel.calls(Key(7, 226, 0, 2), 3)
    return kernel, tally, births, probe


@pytest.mark.parametrize("aggregate", [True, False])
def test_births_reach_on_birth_and_calls_the_tally(aggregate: bool) -> None:
    _, tally, births, probe = a_birth_and_three_calls(aggregate)
    probe.poll(0)
    probe.read()
    batch = tally.drain()
    assert births == [Birth(7, 3)]
    assert batch.counts == {Key(7, 226, 0, 2): 3}
    assert batch.dropped[Drop.BAD_RECORD] == 0


def test_births_without_a_listener_are_skipped_not_dropped() -> None:
    kernel = FakeKernel(aggregate=False)
    tally = Tally(max_keys=16)
    probe = Probe(kernel, tally)
    probe.start()
    kernel.emit(BIRTH)
    probe.poll(0)
    batch = tally.drain()
    assert batch.received == 0
    assert batch.dropped[Drop.BAD_RECORD] == 0


def test_a_poll_that_fails_midway_keeps_what_it_delivered() -> None:
    """ring_buffer__poll can fail after its callbacks consumed records: those calls stay in the
    Tally and those births reach on_births; the records after stay in the ring for the next."""
    kernel, tally, births, probe = a_birth_and_three_calls(aggregate=False)
    kernel.poll_raises, kernel.poll_fails_after = OSError("polling the ring buffer"), 3
    with pytest.raises(OSError):
        probe.poll(0)
    assert births == [Birth(7, 3)]
    assert tally.drain().counts == {Key(7, 226, 0, 2): 2}
    probe.poll(0)
    assert tally.drain().counts == {Key(7, 226, 0, 2): 1}
