"""Shared host-side test helpers: test files import these, never each other's private functions."""

from __future__ import annotations

# --- VM test records: the result.json files tests/vm/*_guest.py write -----------------------------
# /metrics samples in a record are read with the guests' own projections (tests/vm/guestlib.py).
from vm.guestlib import LABELS, by_reason, ioctl_counts

__all__ = ["by_reason", "expected_counts", "ioctl_counts", "otlp_counts"]


def expected_counts(rows: list[dict]) -> dict[tuple, float]:
    """A record's expected kubenpu_ioctl_total series ([{labels, value}]) by their LABELS values."""
    return {tuple(r["labels"]): r["value"] for r in rows}


def otlp_counts(points: list[dict]) -> dict[tuple, float]:
    """The kubenpu.ioctl points an OTLP receiver got ([{attributes, value}]) by LABELS values."""
    return {tuple(p["attributes"][k] for k in LABELS): p["value"] for p in points}
