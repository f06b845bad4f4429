"""Text from outside the agent: how kubenpuctl's commands print values (one style for bytes, IEC,
and for untrusted names), and which names from sysfs and /proc are numbers."""

from __future__ import annotations

_IEC = ("KiB", "MiB", "GiB", "TiB", "PiB")
# The kernel writes numbers in ASCII digits. str.isdigit(), int() and a str pattern's \d take
# other scripts' too: isdigit() is true for '²', which int() refuses (a ValueError that stopped
# all telemetry), and int('\u0661'), an Arabic-Indic one, is 1, another node's number.
# Patterns on names use re.ASCII.


def ascii_digits(text: str) -> bool:
    """Whether `text` is one or more ASCII digits, the only digits the kernel writes in names."""
    return text.isascii() and text.isdigit()


def ascii_int(text: str) -> int:
    """`text` as a decimal integer of ASCII digits with an optional '-'; ValueError otherwise
    (int() also takes other scripts' digits, spaces and underscores)."""
    if not ascii_digits(text.removeprefix("-")):
        raise ValueError(text)
    return int(text)


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
