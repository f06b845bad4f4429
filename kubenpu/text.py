"""How kubenpuctl's commands print values: one style for bytes (IEC) and for untrusted names."""

from __future__ import annotations

_IEC = ("KiB", "MiB", "GiB", "TiB", "PiB")


def iec_bytes(n: float) -> str:
    """512B, 96.0MiB, 1.5GiB, 256GiB: three digits at most before the unit, powers of 1024."""
    if n < 1023.5:  # the bounds are where the rounded text would reach the next unit
        return f"{n:.0f}B"
    for unit in _IEC:
        n /= 1024
        if n < 1023.5 or unit == _IEC[-1]:
            return f"{n:.1f}{unit}" if n < 99.95 else f"{n:.0f}{unit}"
    raise AssertionError("unreachable")


def printable(text: str) -> str:
    """`text` with every character a terminal would act on escaped, as Python writes it (\\x1b,
    \\n, \\u202e): names come from pods, drivers and runtimes, and may hold anything."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)
