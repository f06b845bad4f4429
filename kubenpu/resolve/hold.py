"""The one hold-then-settle policy every source uses for what the resolver cannot name yet (the
calls, DRM clients' usage, GPU jobs), and what they need of the resolver."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Protocol

from kubenpu.resolve.result import Attribution

if TYPE_CHECKING:
    from kubenpu.resolve.cri import Sandbox


class Resolve(Protocol):
    """What the sources need of kubenpu.resolve.resolver.Resolver."""

    def resolve(self, cgroup_id: int) -> Attribution | None: ...

    def prefetch(self, cgroup_ids: Iterable[int]) -> None: ...

    def settle(self, cgroup_id: int) -> Attribution: ...

    def alive(self, cgroup_id: int) -> bool: ...

    def path(self, cgroup_id: int) -> str | None: ...

    def removed(self) -> bool: ...

    def forget(self, cgroup_id: int) -> None: ...

    def pod_uids(self) -> dict[tuple[str, str], str] | None: ...

    def sandboxes(self) -> dict[tuple[str, str], Sandbox] | None: ...


class Hold:
    """The one hold-then-settle policy for counts whose pod the resolver cannot name yet (calls
    in the Attributor, DRM clients' usage in kubenpu.sources.usage): wait for the resolver's answer,
    and after `pending_seconds`, or when the caller stops waiting, take its settled one."""

    def __init__(
        self, resolver: Resolve, pending_seconds: float, clock: Callable[[], float]
    ) -> None:
        self._resolver = resolver
        self._pending_seconds = pending_seconds
        self._clock = clock

    def answer(
        self, cgroup_id: int, since: float, *, settle: bool = False
    ) -> tuple[Attribution, bool] | None:
        """None while still held (held since `since`), else (the answer, whether settled)."""
        who = self._resolver.resolve(cgroup_id)
        if who is not None:
            return who, False
        if settle or self._clock() - since >= self._pending_seconds:
            return self._resolver.settle(cgroup_id), True
        return None
