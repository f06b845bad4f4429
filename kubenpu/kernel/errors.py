"""The kernel side's one error type, and the causes a failed start names first."""

from __future__ import annotations

from enum import Enum


class Cause(Enum):
    """Why the probe did not start, as far as the loader can tell (docs/core.md)."""

    CAPABILITIES = "capabilities"  # the agent lacks what the hook needs: no loader gets past it
    NO_BTF = "no BTF"  # the kernel has no BTF: no CO-RE, no fentry
    LOCKDOWN = "lockdown"  # lockdown=confidentiality refuses the kprobe attach's reads
    # EPERM although the agent holds the hook's capabilities: seccomp, a security module, or
    # a kernel that allows no fentry there (BCC's kprobe may still load)
    REFUSED = "refused"
    OBJECT_MISSING = "object missing"
    OBJECT_CORRUPT = "object corrupt"
    OLD_LIBBPF = "old libbpf"  # libbpf.so.1 lacks a function the loader calls
    NO_LIBBPF = "no libbpf"
    OTHER = "other"


# Causes that another loader would fail on the same way: `probe.loader: auto` does not try it.
FINAL = frozenset({Cause.CAPABILITIES})


class ProbeError(Exception):
    """The probe could not be loaded, attached or read; the message is one line for the operator,
    the cause first."""

    def __init__(self, message: str, cause: Cause = Cause.OTHER) -> None:
        super().__init__(message)
        self.cause = cause
