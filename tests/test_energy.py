"""kubenpu/sources/energy.py's rules one case at a time, each where a plausible slip would show
(test_properties holds the same rules for all inputs; test_telemetry drives them through the
sysfs reads)."""

from __future__ import annotations

from fractions import Fraction

from kubenpu.sources.energy import COUNTER_IMPLAUSIBLE, COUNTER_RESET, Meter, apportion, most_uj

S = 1_000_000_000  # ns
WRAP = 1 << 32


def test_a_recipient_without_weight_gets_nothing_whatever_it_carries() -> None:
    carry = {"a": Fraction(9, 10)}
    assert apportion(1, {"a": 0, "b": 1, "c": 1}, carry) == {"b": 1}
    assert carry == {"c": Fraction(1, 2)}  # b took the µJ its half tied with c for


def test_ties_go_by_key_text_however_the_mapping_was_built() -> None:
    assert apportion(1, {"b": 1, "a": 1}, {}) == {"a": 1}
    assert apportion(1, {"a": 1, "b": 1}, {}) == {"a": 1}


def test_a_carry_past_one_is_given_and_its_rest_kept() -> None:
    carry = {"a": Fraction(9, 10)}
    assert apportion(1, {"a": 1, "b": 1}, carry) == {"a": 1}
    assert carry == {"a": Fraction(2, 5), "b": Fraction(1, 2)}


def test_an_interval_with_no_energy_or_no_weight_keeps_every_carry() -> None:
    carry = {"a": Fraction(1, 2), "b": Fraction(1, 3)}
    assert apportion(0, {"a": 1}, carry) == {}
    assert apportion(5, {"a": 0}, carry) == {}
    assert carry == {"a": Fraction(1, 2), "b": Fraction(1, 3)}


def test_the_most_a_device_can_make_is_whole_microjoules_and_nothing_in_no_time() -> None:
    assert most_uj(100_000_000, 1_500_000_001) == 300_000_000  # 2 x 100 W x 1.5 s, floored
    assert isinstance(most_uj(100_000_000, 1_500_000_001), int)
    assert most_uj(500_000_000, 0) == most_uj(None, 0) == most_uj(None, -S) == 0


def test_the_unattributed_share_adds_up_across_intervals() -> None:
    meter: Meter[str] = Meter()
    for _ in range(3):
        assert meter.split(10, S, {None: [S, 0, 0]}) == {}
    assert meter.unattributed_uj == 30 and meter.total_uj == 30 and meter.idle_uj == 0


def test_the_first_counter_reading_is_the_baseline_even_after_integrated_power() -> None:
    meter: Meter[str] = Meter()
    assert meter.delta(None, 50_000_000, 0) == (None, None)  # no earlier read to integrate from
    meter.at_ns = 0
    assert meter.delta(None, 50_000_000, S) == (50_000_000, None)
    assert meter.source == "integrated"
    meter.at_ns = S
    assert meter.delta(7_000, None, 2 * S) == (0, None)  # the counter appears: a baseline
    assert meter.source == "driver"


def read(meter: Meter[str], values: list[int]) -> list[tuple[int | None, str | None]]:
    """The meter's steps across counter readings 10 s apart (no power limit: 30 kJ possible)."""
    steps = []
    for i, value in enumerate(values):
        steps.append(meter.delta(value, None, i * 10 * S))
        meter.at_ns = i * 10 * S
    return steps


def test_a_counter_that_starts_at_2_32_is_wide_and_never_wraps() -> None:
    steps = read(Meter(), [WRAP, WRAP // 2 + 5, 3])
    assert steps == [(0, None), (WRAP // 2 + 5, COUNTER_RESET), (3, COUNTER_RESET)]


def test_a_counter_that_reaches_2_32_is_wide_from_then_on() -> None:
    steps = read(Meter(), [100, WRAP, WRAP // 2 + 5, 3])
    assert steps == [
        (0, None),
        (WRAP - 100, None),
        (WRAP // 2 + 5, COUNTER_RESET),
        (3, COUNTER_RESET),  # not a 32-bit wrap from the top half: the counter is wider
    ]


def test_below_2_32_a_fall_from_the_top_half_is_a_wrap() -> None:
    steps = read(Meter(), [WRAP - 10, 5])
    assert steps == [(0, None), (15, None)]


def test_one_garbage_reading_past_2_32_does_not_make_a_32_bit_counter_wide() -> None:
    """A 32-bit counter 195 J below its top (a 300 W limit, reads 1 s apart) reads one garbage
    value past 2^32, then goes on and wraps. The garbage and the reading after it are
    implausible (each the next one's baseline); the wrap still counts as one: taken as a wide
    counter's reset, it would lose the 195 J made before the top."""
    meter: Meter[str] = Meter()
    top = WRAP - 195_000_000
    steps = []
    for i, value in enumerate([top - 1000, 1 << 40, top, 100]):
        steps.append(meter.delta(value, None, i * S, limit_uw=300_000_000))
        meter.at_ns = i * S
    implausible = (None, COUNTER_IMPLAUSIBLE)
    assert steps == [(0, None), implausible, implausible, (195_000_100, None)]
