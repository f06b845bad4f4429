"""Rules that hold for every input, checked by hypothesis over generated ones: the bounded
number parser (fdinfo and sysfs), the energy split, the energy counter across wraps and resets,
OTLP request splitting, and the idle streak against the idle total.

Deterministic (derandomize: the same examples every run, so CI cannot flake; no example
database) and small (max_examples), so `make test` stays quick; deadline=None because a shared
2-core host stalls. Hypothesis keeps a cache of constants in .hypothesis/ (git-ignored).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable
from fractions import Fraction

from hypothesis import example, given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.sdk.resources import Resource

from kubenpu.discovery import Device
from kubenpu.export import otlp
from kubenpu.kernel import abi
from kubenpu.metrics.catalogue import ALLOCATED_IDLE, ALLOCATED_IDLE_FOR, ENERGY, IOCTL, POWER
from kubenpu.metrics.points import Point
from kubenpu.metrics.series import Series
from kubenpu.resolve.podresources.client import Allocated
from kubenpu.resolve.podresources.mapping import Mapper
from kubenpu.sources import energy
from kubenpu.sources.activity import Activity
from kubenpu.sources.allocations import Allocations
from kubenpu.sources.fdinfo import _FREQ, _SIZE, MAX_VALUE, Skip, parse_number
from kubenpu.sources.registry import table

PROPERTY = settings(max_examples=150)  # the rest from tests/conftest.py's profile
SECOND = 1_000_000_000
_UNITS = [{"": 1}, _FREQ, _SIZE]


# --- the number parser ---------------------------------------------------------------------


@PROPERTY
@given(st.text(max_size=40), st.sampled_from(_UNITS), st.booleans())
def test_no_text_crashes_the_parser_and_every_number_is_bounded(text, units, signed) -> None:
    got = parse_number(text, units, signed=signed)
    assert isinstance(got, Skip) or (isinstance(got, int) and abs(got) <= MAX_VALUE)
    if isinstance(got, int) and not signed:
        assert got >= 0


@PROPERTY
@given(
    st.integers(-(2**70), 2**70),
    st.sampled_from(_UNITS).flatmap(lambda u: st.tuples(st.just(u), st.sampled_from(sorted(u)))),
    st.sampled_from(["", " ", "\t"]),
    st.booleans(),
)
def test_a_valid_number_parses_exactly(number, unit, space, signed) -> None:
    units, name = unit
    text = f"{number}{space if name else ''}{name}"
    got = parse_number(text, units, signed=signed)
    exact = number * units[name]
    if len(str(abs(number))) > 20:
        assert got is Skip.MALFORMED  # more digits than any u64 prints
    elif number < 0 and not signed:
        assert got is Skip.MALFORMED
    elif abs(exact) > MAX_VALUE:
        assert got is Skip.OUT_OF_RANGE
    else:
        assert got == exact


# --- the energy split ----------------------------------------------------------------------

_pods = st.sampled_from(["a", "b", "c", None])
_busy = st.dictionaries(_pods, st.integers(-10, 20 * SECOND), max_size=4)


@PROPERTY
@given(
    st.lists(
        st.tuples(st.integers(0, 10**12), st.integers(0, 10 * SECOND), _busy),
        min_size=1,
        max_size=12,
    )
)
def test_the_split_gives_every_microjoule_once_and_never_a_negative_share(intervals) -> None:
    carry: dict[Hashable, Fraction] = {}
    for delta, interval, busy in intervals:
        shares = energy.split(delta, interval, busy, carry)
        assert sum(shares.values()) == delta
        assert all(share > 0 for share in shares.values())
        # A recipient's carried remainder is under one µJ per recipient there can be.
        assert all(0 < c < len(busy) + 2 for c in carry.values())


# --- the energy counter --------------------------------------------------------------------

_limit = st.one_of(st.none(), st.just(0), st.integers(1_000_000, 1_000_000_000_000))


@PROPERTY
@given(
    st.integers(0, 2**64),
    st.lists(
        st.tuples(st.integers(0, 2**64), st.integers(0, 60 * SECOND), _limit),
        min_size=1,
        max_size=12,
    ),
)
def test_the_counter_never_counts_more_than_the_device_could_make(first, reads) -> None:
    meter: energy.Meter[str] = energy.Meter()
    now = 10 * SECOND
    meter.delta(first, None, now)
    meter.at_ns = now
    last = first
    for value, interval, limit in reads:
        now += interval
        delta, reason = meter.delta(value, None, now, limit)
        meter.at_ns = now
        most = energy.most_uj(limit, interval)
        if reason == energy.COUNTER_IMPLAUSIBLE:
            assert delta is None
        else:
            assert delta is not None and 0 <= delta <= most
        if reason is None and delta is not None and value >= last:
            assert delta == value - last  # a plausible rise is taken exactly
        if reason == energy.COUNTER_RESET:
            assert delta == value < last
        last = value


@PROPERTY
@given(
    st.integers(0, (1 << 32) - 1),
    st.lists(st.integers(0, 1 << 31), min_size=1, max_size=12),
)
def test_a_32_bit_counter_wraps_into_exact_increments(start, steps) -> None:
    """A counter 32 bits wide, read every 5 s on a 400 W card, each step within what it can
    make: the increments are the steps, whatever the wraps."""
    meter: energy.Meter[str] = energy.Meter()
    now = SECOND
    meter.delta(start, None, now)
    meter.at_ns = now
    value = start
    limit = 400_000_000
    for step in steps:
        now += 5 * SECOND
        value = (value + step) % (1 << 32)
        delta, reason = meter.delta(value, None, now, limit)
        meter.at_ns = now
        if reason is None:
            assert delta == step
        else:  # a fall from the lower half of 32 bits reads as a restart: never more
            assert reason == energy.COUNTER_RESET and delta == value < step


# --- OTLP request splitting ----------------------------------------------------------------

_label = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=30)
_points = st.lists(
    st.tuples(st.dictionaries(st.sampled_from("abcd"), _label, max_size=4), st.integers(0, 2**70)),
    max_size=30,
)


@PROPERTY
@given(st.lists(_points, min_size=1, max_size=3), st.integers(200, 4000))
def test_every_request_fits_and_every_point_is_sent_once(per_spec, max_bytes) -> None:
    specs = [IOCTL, ENERGY, POWER]
    snapshot = [
        (spec, [Point(attrs, value, 1) for attrs, value in points])
        for spec, points in zip(specs, per_spec, strict=False)
    ]
    resource = Resource({"k8s.node.name": "node", "service.name": "kubenpu"})
    sent: list[tuple[str, Point]] = []
    for batch in otlp.batches(snapshot, resource, max_bytes):
        request = encode_metrics(otlp.metrics_data(batch, resource))
        alone = sum(len(points) for _, points in batch) == 1
        assert alone or request.ByteSize() <= max_bytes
        sent += [(spec.name, point) for spec, points in batch for point in points]
    expected = [(spec.name, point) for spec, points in snapshot for point in points]
    assert sorted(map(repr, sent)) == sorted(map(repr, expected))


# --- the idle streak and the idle total ----------------------------------------------------

_DEVICE = Device("0000:03:00.0", "amdgpu", "1002:744c", None, (), "amdgpu")
_RESOURCE = "example.com/gpu"


class _Kubelet:
    """PodResources answers: the pods listed now, each holding the device."""

    def __init__(self) -> None:
        self.pods: set[str] = set()

    def list(self) -> tuple[list[Allocated], Counter[str]]:
        return [
            Allocated("ns", p, "main", _RESOURCE, _DEVICE.id) for p in sorted(self.pods)
        ], Counter()

    def allocatable(self) -> list[Allocated]:
        return []

    def close(self) -> None:
        pass


def _by_pod(metrics: Series, spec) -> dict[str, float]:  # type: ignore[no-untyped-def]
    return {p.attrs["pod"]: p.value for s, points in metrics.collect() if s is spec for p in points}


_step = st.tuples(
    st.floats(0, 100, allow_nan=False),  # seconds to the refresh
    st.sets(st.sampled_from("xyz")),  # pods holding the device at it
    st.sets(st.sampled_from("xyz")),  # pods that submitted before it
)


@PROPERTY
@given(st.lists(_step, min_size=1, max_size=15))
def test_the_idle_streak_never_passes_the_idle_total(steps) -> None:
    now = [1000.0]
    clock = lambda: now[0]  # noqa: E731
    metrics = table(300, 1000, clock=clock)
    activity = Activity(300, clock)
    kubelet = _Kubelet()
    allocations = Allocations(kubelet, Mapper([_DEVICE]), metrics, 10, activity, clock=clock)  # type: ignore[arg-type]
    held_since: dict[str, float] = {}
    total_before: dict[str, float] = {}
    for seconds, holding, submitting in steps:
        now[0] += seconds
        for pod in submitting:
            activity.submitted(("ns", pod, "main", _DEVICE.id), 1)
        kubelet.pods = holding
        assert allocations.refresh()
        held_since = {p: held_since.get(p, now[0]) for p in holding}
        totals = _by_pod(metrics, ALLOCATED_IDLE)
        streaks = _by_pod(metrics, ALLOCATED_IDLE_FOR)
        assert set(totals) == set(streaks) == holding
        for pod in holding:
            # Within 1 ns: the total is a sum of intervals, the streak one difference of clock
            # readings, and the two round apart (24.025000000000205 against ...09 once).
            assert 0 <= streaks[pod] <= totals[pod] + 1e-9
            assert totals[pod] <= now[0] - held_since[pod] + 1e-9
            assert totals[pod] >= total_before.get(pod, 0.0)  # a counter
            if pod in submitting:
                assert streaks[pod] == 0
        total_before = {p: totals[p] for p in holding}


# --- the kernel's duration buckets (abi.duration_slot mirrors bpf/kubenpu.bpf.c) -------------


@PROPERTY
@given(st.integers(0, 2**40))
@example(954)  # 0.03 % over the first edge: units of 2^-30 s put it under
@example(1_953_125)  # 2^-9 s exactly: the bucket under it
@example(64_000_000_000)
def test_a_duration_lands_in_the_bucket_of_its_exponential_histogram_index(ns) -> None:
    """Slot s > 0 holds (2^(i/4), 2^((i+1)/4)] seconds, i = s - 1 + FIRST_INDEX: the integer
    math agrees with the exact bounds but within 2 ppm of an edge (a unit is 1 ppm of the first)."""
    slot = abi.duration_slot(ns)
    seconds = Fraction(ns, SECOND)
    low = Fraction(2) ** Fraction(abi.FIRST_INDEX, 4)
    if slot == 0:
        assert seconds <= low * (1 + Fraction(2, 10**6))
        return
    if slot == abi.BUCKETS + 1:
        assert seconds >= 64 * (1 - Fraction(2, 10**6))
        return
    index = slot - 1 + abi.FIRST_INDEX
    lower, upper = 2 ** (index / 4), 2 ** ((index + 1) / 4)
    assert lower * (1 - 2e-6) <= float(seconds) <= upper * (1 + 2e-6)


def test_every_errno_has_one_slot_and_the_rest_are_other() -> None:
    numbers = [n for ns in abi.ERRNOS.values() for n in ns]
    assert len(numbers) == len(set(numbers))
    assert abi.error_slot(0) is None and abi.error_slot(7) is None
    assert abi.ERRORS[abi.error_slot(-512)] == "EINTR"  # ERESTARTSYS, as the caller sees it
    assert abi.ERRORS[abi.error_slot(-62)] == "ETIME"
    assert abi.ERRORS[abi.error_slot(-71)] == "other"  # EPROTO


def test_every_property_runs_without_a_deadline() -> None:
    """tests/conftest.py's profile is the one loaded, and what PROPERTY adds keeps it: no
    property fails on a busy machine for one slow example."""
    assert settings.default.deadline is None and PROPERTY.deadline is None
    assert settings.default.derandomize and settings.default.database is None
