"""The kernel's records as Python reads them: a ring-buffer event, a cgroup birth, the key of the
`counts` map, the durations and the GPU jobs (their byte layouts are kernel/abi.py's).
kubenpu.sources.calls.events aggregates them."""

from __future__ import annotations

from typing import NamedTuple

from kubenpu.kernel.abi import JOB_EVENT


class Event(NamedTuple):
    ts_ns: int
    cgroup_id: int
    tgid: int
    cmd: int
    major: int
    minor: int
    kind: int


class Key(NamedTuple):
    cgroup_id: int
    major: int
    minor: int
    kind: int


class Birth(NamedTuple):
    cgroup_id: int
    parent_id: int


class Durations(NamedTuple):
    """One key's value of the `durations` map, cumulative: the sum of the durations, the calls
    by slot (abi.DURATION_SLOTS: under, the buckets, over) and by error (abi.ERRORS)."""

    sum_ns: int
    slots: tuple[int, ...]
    errors: tuple[int, ...]


class JobTimes(NamedTuple):
    """One {cgroup, ring}'s GPU jobs since the jobs probe attached (the `job_times` map): queued,
    done, and the wait (queued to run) and run (run to done) histograms of the done ones, in the
    durations' slots (no errors)."""

    queued: int
    done: int
    wait: Durations
    run: Durations
    timeouts: int = 0  # the ring's scheduler timeouts that found jobs of it in flight


class JobStep(NamedTuple):
    """One step of one GPU job (a `job_events` record, abi.JOB_EVENT)."""

    kind: int  # abi.JOB_EVENT_KINDS' index: queued, run, done
    ts_ns: int
    fence: int  # the job: its scheduler fence's address
    ring: int  # the scheduler's address
    cgroup_id: int = 0  # queued only: the submitting task's
    client_id: int = 0  # queued only, 6.17 on: the DRM client's drm-client-id
    tgid: int = 0  # queued only: the submitting process


def job_step(raw: bytes) -> JobStep:
    kind, tgid, ts, fence, ring, cgroup_id, client_id = JOB_EVENT.unpack_from(raw)
    return JobStep(kind, ts, fence, ring, cgroup_id, client_id, tgid)
