"""Host-side helpers shared by several test files (see each section's comment)."""

import time
from collections.abc import Callable
from typing import TypeVar

from kubenpu.resolve import Attribution, Resolver

T = TypeVar("T")

# --- resolve: wait for what a Resolver answers once its CRI lookup (off the caller's thread) ends


def eventually(check: Callable[[], T | None], what: str, bound: float = 30.0) -> T:
    """check()'s first answer that is not None or False; a generous bound, not a timing claim."""
    deadline = time.monotonic() + bound
    while (value := check()) is None or value is False:
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {bound:g}s")
        time.sleep(0.005)
    return value


def resolved(resolver: Resolver, cgroup_id: int) -> Attribution:
    """Polls resolve() until the pending lookup has answered."""
    return eventually(lambda: resolver.resolve(cgroup_id), f"cgroup {cgroup_id} resolved")
