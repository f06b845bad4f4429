"""A device's energy: its increments across reads (`Meter`: the driver's counter through wraps
and resets, else power integrated over time), and each interval's increment split among its DRM
clients' pods.

The model (docs/metrics.md#energy-per-pod):
- Each recipient's weight is its busy time on the device in the interval, summed over engine
  classes (busy ns; for drivers that count cycles, busy cycles against the elapsed cycles).
- The device's idle weight is the interval less all busy time, never below 0: with several
  engine classes busy at once the busy sum can pass the interval, and then nothing is idle.
- Busy time whose pod is not known (host processes, clients pending a CRI answer) goes to the
  device's unattributed share, never to a pod.
- The increment is split in whole µJ by largest remainder, so the shares sum to it exactly; the
  fractions a recipient was not given carry to its next interval, so rounding favours no one.

A driver counter's step is checked against what the device could have made in the interval
(`most_uj`): a rise past it, or a fall to a value past it, is no energy but a bad reading
(docs/metrics.md#the-energy-counter-rule). Power integrated where there is no counter is held
to the same ceiling: a reading past it (2^63-1 µW) is no energy.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Generic, TypeVar

IDLE = "idle"
UNATTRIBUTED = "unattributed"
# Telemetry's skip reasons for a counter step that is not taken as it reads.
COUNTER_RESET = "counter_reset"
COUNTER_IMPLAUSIBLE = "counter_implausible"
POWER_IMPLAUSIBLE = "power_implausible"  # a power reading past what the device can draw
# The most a device can draw: POWER_MARGIN times its highest power limit (the limit is what
# firmware holds the average to; peaks and a counter updated late pass it, never twice over),
# or FALLBACK_WATTS where the driver publishes no limit (more than any one accelerator draws).
POWER_MARGIN = 2
FALLBACK_WATTS = 3_000
_WRAP_32 = 1 << 32

_K = TypeVar("_K", bound=Hashable)


def apportion(total: int, weights: Mapping[_K, int], carry: dict[_K, Fraction]) -> dict[_K, int]:
    """total (>= 0) split in proportion to weights (>= 0), summing to total exactly.

    carry holds each recipient's remainder from earlier calls; it is updated in place and keeps
    only this call's recipients. With no positive weight nothing is split: {}.
    """
    weights = {k: w for k, w in weights.items() if w > 0}
    whole = sum(weights.values())
    if not whole or total <= 0:
        return {}
    shares = {k: total * w // whole for k, w in weights.items()}
    remainders = {
        k: Fraction(total * w % whole, whole) + carry.get(k, 0) for k, w in weights.items()
    }
    left = total - sum(shares.values())  # 0 <= left < len(weights)
    # Ties go by key text, so a split is the same however the mapping was built.
    for key in sorted(remainders, key=lambda k: (-remainders[k], str(k)))[:left]:
        shares[key] += 1
        remainders[key] -= 1
    carry.clear()
    carry.update({k: r for k, r in remainders.items() if r > 0})
    return {k: s for k, s in shares.items() if s}


def split(
    microjoules: int,
    interval: int,
    busy: Mapping[_K | None, int],
    carry: dict[_K | str, Fraction],
) -> dict[_K | str, int]:
    """One interval's energy among pods (busy's keys), IDLE and UNATTRIBUTED (busy's None key).

    interval and busy are in one unit: ns for busy time, cycles for busy cycles.
    """
    weights: dict[_K | str, int] = {}
    for key, value in busy.items():
        name = UNATTRIBUTED if key is None else key
        weights[name] = weights.get(name, 0) + max(value, 0)
    weights[IDLE] = max(interval - sum(weights.values()), 0)
    if not any(weights.values()):
        weights[IDLE] = 1  # no interval and no busy time: the energy was still used
    return apportion(microjoules, weights, carry)


def weights(
    busy: Mapping[_K | None, list[int]], interval_ns: int
) -> tuple[dict[_K | None, int], int]:
    """Each recipient's weight and the interval, in one unit: busy ns against the interval's ns
    when the driver prints engine time, else busy cycles against the elapsed cycles. busy holds
    [busy ns, busy cycles, elapsed cycles] per recipient."""
    if any(b[0] for b in busy.values()) or not any(b[1] for b in busy.values()):
        return {k: b[0] for k, b in busy.items()}, interval_ns
    return {k: b[1] for k, b in busy.items()}, max(b[2] for b in busy.values())


def most_uw(limit_uw: int | None) -> int:
    """The most power (µW) the device can draw, its highest power limit limit_uw (None or 0:
    not published)."""
    return POWER_MARGIN * limit_uw if limit_uw else FALLBACK_WATTS * 1_000_000


def most_uj(limit_uw: int | None, interval_ns: int) -> int:
    """The most energy (µJ) the device could make in interval_ns."""
    return most_uw(limit_uw) * max(interval_ns, 0) // 1_000_000_000


def step(last: int, new: int, most: int, wide: bool) -> tuple[int | None, str | None]:
    """The µJ a driver counter made from last to new, when at most most µJ was possible, and the
    skip reason if it is not new - last: COUNTER_RESET (counted from 0 since) or
    COUNTER_IMPLAUSIBLE (None: no energy known). wide: the counter has read 2^32 or more, so it
    is not 32 bits wide and cannot wrap there."""
    delta = new - last
    if 0 <= delta <= most:
        return delta, None
    if delta < 0 and not wide and last < _WRAP_32 <= last * 2 and delta + _WRAP_32 <= most:
        return delta + _WRAP_32, None  # fell from the top half of 32 bits: a wrap
    if delta < 0 and new <= most:
        return new, COUNTER_RESET  # a restart (module reload): the counter since
    return None, COUNTER_IMPLAUSIBLE  # more than the device can make, or a fall to no restart


@dataclass
class Meter(Generic[_K]):
    """One device's energy across reads, and its shares so far."""

    counter: int | None = None  # the driver's last energy counter value
    wide: bool = False  # the counter has read 2^32 or more: no 32-bit wraps
    at_ns: int | None = None  # when the last read was
    source: str = ""  # driver or integrated, once known
    total_uj: int = 0  # energy since the agent started: what the shares sum to
    integrated_rem: int = 0  # µW·ns not yet a whole µJ
    idle_uj: int = 0
    unattributed_uj: int = 0
    carry: dict[_K | str, Fraction] = field(default_factory=dict)

    def delta(
        self, energy_uj: int | None, power_uw: int | None, now: int, limit_uw: int | None = None
    ) -> tuple[int | None, str | None]:
        """The µJ used since the last read (None: no energy source, or none known), and the skip
        reason of a counter step not taken as it reads (see step; limit_uw: the device's
        highest power limit) or of a power reading past what the device can draw (most_uw). An
        implausible reading is the next one's baseline, so one bad read costs one interval and
        a counter that jumped for good is followed from there."""
        if energy_uj is not None:
            self.source = "driver"
            last, self.counter = self.counter, energy_uj
            if last is None or self.at_ns is None:
                self.wide = energy_uj >= _WRAP_32
                return 0, None  # the first reading is the baseline
            delta, reason = step(last, energy_uj, most_uj(limit_uw, now - self.at_ns), self.wide)
            # An implausible value proves nothing of the counter's width.
            self.wide = self.wide or (reason != COUNTER_IMPLAUSIBLE and energy_uj >= _WRAP_32)
            return delta, reason
        if power_uw is not None and self.at_ns is not None:
            self.source = "integrated"
            if power_uw > most_uw(limit_uw):
                return None, POWER_IMPLAUSIBLE  # more than the device can draw: no energy
            work = power_uw * (now - self.at_ns) + self.integrated_rem
            delta, self.integrated_rem = divmod(work, 1_000_000_000)
            return delta, None
        return None, None

    def split(
        self, delta: int, interval_ns: int, busy: Mapping[_K | None, list[int]]
    ) -> dict[_K, int]:
        """delta µJ shared by busy time: the idle and unattributed shares kept here, the pods'
        returned."""
        self.total_uj += delta
        weighed, interval = weights(busy, interval_ns)
        pods: dict[_K, int] = {}
        for key, share in split(delta, interval, weighed, self.carry).items():
            if key == IDLE:
                self.idle_uj += share
            elif key == UNATTRIBUTED:
                self.unattributed_uj += share
            else:
                pods[key] = share
        return pods
