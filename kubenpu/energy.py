"""Energy per pod: one interval's device energy increment split among its DRM clients' pods.

The model (docs/metrics.md#energy-per-pod):
- Each recipient's weight is its busy time on the device in the interval, summed over engine
  classes (busy ns; for drivers that count cycles, busy cycles against the elapsed cycles).
- The device's idle weight is the interval less all busy time, never below 0: with several
  engine classes busy at once the busy sum can pass the interval, and then nothing is idle.
- Busy time whose pod is not known (host processes, clients pending a CRI answer) goes to the
  device's unattributed share, never to a pod.
- The increment is split in whole µJ by largest remainder, so the shares sum to it exactly; the
  fractions a recipient was not given carry to its next interval, so rounding favours no one.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from fractions import Fraction
from typing import TypeVar

IDLE = "idle"
UNATTRIBUTED = "unattributed"

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
