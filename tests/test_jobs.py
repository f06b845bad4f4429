"""GPU jobs per pod (kubenpu.sources.jobs, kubenpu.kernel.jobs): the kernel's maps read back from
real bpf(2) maps on the host (no program runs here: tests/test_node_vm.py runs the tracepoints on a
real scheduler), and the stage's attribution, retirement and export with a fake probe.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
from fakes import Clock, FakeResolver
from helpers import eventually, memory_growth, values

from kubenpu.config import Config
from kubenpu.discovery import Device
from kubenpu.kernel import abi, bpfsys, btf, hooks
from kubenpu.kernel.core import OBJECTS, shared_libbpf
from kubenpu.kernel.errors import Cause, ProbeError
from kubenpu.kernel.jobs import JobMaps, JobsKernel, Ring, tracepoints
from kubenpu.kernel.records import Durations, JobStep, JobTimes
from kubenpu.metrics.catalogue import (
    JOB_RUN,
    JOB_WAIT,
    JOB_WAIT_BEHIND,
    JOB_WAIT_IDLE,
    JOBS,
    JOBS_IN_FLIGHT,
    JOBS_LOST,
    POD_HANGS,
    RESET_VICTIMS,
)
from kubenpu.metrics.points import ExpHist
from kubenpu.metrics.series import Series
from kubenpu.resolve import Attribution
from kubenpu.resolve.cgroups import ProcCgroups
from kubenpu.sources.base import Node
from kubenpu.sources.contention import DONE, MARGIN_NS, QUEUED, RUN
from kubenpu.sources.jobs import (
    FIRST_CHECK_SECONDS,
    MAX_HELD_RESETS,
    STALE_RISE_SECONDS,
    Jobs,
)
from kubenpu.sources.jobs import build as jobs_build
from kubenpu.sources.registry import table

RING = 0xFFFF_8880_0123_4000  # a scheduler's kernel address
GPU = "0000:03:00.0"
POD_A = Attribution(namespace="ns", pod="a", container="c", pod_uid="u-a")
MS = 1_000_000


def histogram(*ns: int) -> Durations:
    """The kernel's slots for these durations (abi.duration_slot, the kernel's math)."""
    slots = [0] * abi.DURATION_SLOTS
    for n in ns:
        slots[abi.duration_slot(n)] += 1
    return Durations(sum(ns), tuple(slots), ())


def times(queued: int, waits: list[int], runs: list[int]) -> JobTimes:
    return JobTimes(queued, len(runs), histogram(*waits), histogram(*runs))


# --- the kernel's maps --------------------------------------------------------------------


@pytest.fixture
def maps() -> Iterator[JobMaps]:
    """Real kernel maps of the jobs object's shapes."""
    fds = {
        abi.JOB_TIMES: bpfsys.map_create(
            1, abi.JOB_KEY.size, abi.JOB_TIMES_VALUE.size, 64, "job_times"
        ),
        abi.RINGS: bpfsys.map_create(1, 8, abi.RING.size, 8, "rings"),
        abi.JOB_LOST: bpfsys.map_create(2, 4, 8, len(abi.JOB_LOST_REASONS), "job_lost"),
    }
    yield JobMaps(fds)
    for fd in fds.values():
        os.close(fd)


def test_the_maps_read_back_every_field_in_place(maps: JobMaps) -> None:
    wait, run = histogram(3 * MS, 120 * MS), histogram(50 * MS, 51 * MS)
    value = abi.JOB_TIMES_VALUE.pack(5, 2, wait.sum_ns, run.sum_ns, 3, *wait.slots, *run.slots)
    bpfsys.update(maps.fds[abi.JOB_TIMES], abi.JOB_KEY.pack(77, RING), value)
    bpfsys.update(
        maps.fds[abi.RINGS],
        RING.to_bytes(8, "little"),
        abi.RING.pack(b"gfx_0.0.0", b"0000:03:00.0"),
    )
    bpfsys.update(maps.fds[abi.JOB_LOST], (1).to_bytes(4, "little"), (9).to_bytes(8, "little"))
    assert maps.read() == {(77, RING): JobTimes(5, 2, wait, run, timeouts=3)}
    assert maps.rings() == {RING: Ring("gfx_0.0.0", "0000:03:00.0")}
    assert maps.lost() == {"unmatched": 0, "keys_full": 9, "events_full": 0}


def test_forgetting_a_gone_cgroup_deletes_its_keys_only(maps: JobMaps) -> None:
    empty = abi.JOB_TIMES_VALUE.pack(*[0] * (5 + 2 * abi.DURATION_SLOTS))
    for cgroup, ring in ((1, RING), (1, RING + 64), (2, RING)):
        bpfsys.update(maps.fds[abi.JOB_TIMES], abi.JOB_KEY.pack(cgroup, ring), empty)
    maps.forget([1])
    assert set(maps.read()) == {(2, RING)}


@pytest.mark.parametrize(
    ("symbols", "first"),
    [
        (["drm_sched_job_queue", "drm_sched_job_run", "drm_sched_job_done"], "drm_sched_job_queue"),
        (["drm_sched_job", "drm_run_job", "drm_sched_process_job"], "drm_sched_job"),
        (["drm_sched_job", "drm_run_job"], None),  # not all three: no set
        ([], None),  # gpu_sched not loaded
    ],
)
def test_the_tracepoint_set_is_the_one_the_kernel_has(tmp_path: Path, symbols, first) -> None:
    kallsyms = tmp_path / "kallsyms"
    lines = [f"0000000000000000 d __tracepoint_{s}\t[gpu_sched]" for s in symbols]
    kallsyms.write_text("\n".join(["0000000000000000 T _stext", *lines, ""]))
    found = tracepoints(kallsyms)
    assert (found[0][0] if found else None) == first


@pytest.fixture
def held(monkeypatch) -> set[str]:
    """The capabilities the loader sees this process hold (CAP_SYS_ADMIN unless a test takes
    it away): its flavour follows them."""
    caps = {"SYS_ADMIN", "BPF", "PERFMON"}
    monkeypatch.setattr(hooks, "effective_capabilities", lambda: caps)
    return caps


@pytest.mark.parametrize(
    ("line", "hooked"),
    [
        ("ffffffffc0a01230 t drm_sched_job_timedout\t[gpu_sched]", True),
        ("ffffffffc0a01230 t drm_sched_job_timedout.cold\t[gpu_sched]", False),
        ("ffffffffc0a01230 t drm_sched_job_begin\t[gpu_sched]", False),
    ],
)
def test_the_timeout_work_is_hooked_only_where_the_kernel_has_it(
    tmp_path: Path, held: set[str], line: str, hooked: bool
) -> None:
    kallsyms = tmp_path / "kallsyms"
    names = ["drm_sched_job_queue", "drm_sched_job_run", "drm_sched_job_done"]
    tracepoints = "".join(f"0 d __tracepoint_{n}\t[gpu_sched]\n" for n in names)
    kallsyms.write_text(f"0000000000000000 T _stext\n{tracepoints}{line}\n")
    kernel = RefusingJobsKernel(kallsyms, refused="")
    said = kernel.start()
    assert said.endswith("; fentry drm_sched_job_timedout") is hooked
    assert ("job_timedout" in kernel.loaded[0]) is hooked


class RefusingJobsKernel(JobsKernel):
    """The loader, but a kernel that refuses to load `refused` (the host loads no programs)."""

    def __init__(self, kallsyms: Path, refused: str, btf_root: Path = Path("/nonexistent")) -> None:
        super().__init__(kallsyms=kallsyms, btf_root=btf_root)
        self.refused, self.loaded, self.btf = refused, [], []

    def _load(self, programs: set[str], btf_path: Path | None) -> None:
        self.btf.append(btf_path and btf_path.read_bytes())  # what libbpf would parse
        if self.refused in programs:
            raise ProbeError(f"{self.refused}: -EINVAL")
        self.loaded.append(programs)


@pytest.mark.parametrize(
    ("refused", "said"),
    [
        ("job_timedout", "fentry drm_sched_job_timedout failed (job_timedout: -EINVAL)"),
        ("job_done", None),
    ],
)
def test_the_jobs_load_without_the_timeout_program_if_only_it_fails(
    tmp_path: Path, held: set[str], refused: str, said: str | None
) -> None:
    kallsyms = tmp_path / "kallsyms"
    names = ["__tracepoint_drm_sched_job_queue", "__tracepoint_drm_sched_job_run"]
    names += ["__tracepoint_drm_sched_job_done", "drm_sched_job_timedout"]
    kallsyms.write_text("".join(f"ffffffffc0a01230 t {n}\t[gpu_sched]\n" for n in names))
    kernel = RefusingJobsKernel(kallsyms, refused)
    if said is None:  # a program the jobs need: the start fails, to be retried
        with pytest.raises(ProbeError):
            kernel.start()
        return
    assert kernel.start().endswith(f"; {said}: no reset victims")
    assert kernel.loaded == [{"job_queued", "job_run", "job_done"}]


def _gpu_sched(root: Path) -> bytes:
    """A sysfs BTF directory: vmlinux's (a header and two strings) and gpu_sched's over it."""
    header = btf.HEADER
    (root / "vmlinux").write_bytes(header.pack(btf.MAGIC, 1, 0, 24, 0, 0, 0, 4) + b"\0ab\0")
    (root / "gpu_sched").write_bytes(header.pack(btf.MAGIC, 1, 0, 24, 0, 0, 0, 3) + b"\0c\0")
    return btf.module("gpu_sched", root)


@pytest.mark.parametrize(
    ("refused", "said"),
    [
        ("", "raw_tp workqueue_execute_start"),
        ("job_timedout_raw", "raw_tp workqueue_execute_start failed (job_timedout_raw: -EINVAL)"),
    ],
)
def test_without_sys_admin_the_raw_tracepoints_load_against_the_modules_btf(
    tmp_path: Path, held: set[str], refused: str, said: str
) -> None:
    """CAP_BPF + CAP_PERFMON: the raw_tp programs, their reads relocated against vmlinux's and
    gpu_sched's BTF from sysfs as one file; the timeout's program is an extra there too."""
    held.discard("SYS_ADMIN")
    kallsyms = tmp_path / "kallsyms"
    names = ["drm_sched_job", "drm_run_job", "drm_sched_process_job"]
    kallsyms.write_text("".join(f"0 d __tracepoint_{n}\t[gpu_sched]\n" for n in names))
    kernel = RefusingJobsKernel(kallsyms, refused, btf_root=tmp_path)
    whole = _gpu_sched(tmp_path)
    how = kernel.start()
    assert how == f"raw_tp drm_sched_job, drm_run_job, drm_sched_process_job; {said}" + (
        ": no reset victims" if refused else ""
    )
    steps = {"job_queued_6_1_raw", "job_run_6_1_raw", "job_done_6_1_raw"}
    assert kernel.loaded == [steps | ({"job_timedout_raw"} - {refused})]
    assert set(kernel.btf) == {whole}


def test_without_the_modules_btf_the_raw_tracepoints_do_not_load(
    tmp_path: Path, held: set[str]
) -> None:
    held.discard("SYS_ADMIN")
    kallsyms = tmp_path / "kallsyms"
    names = ["drm_sched_job_queue", "drm_sched_job_run", "drm_sched_job_done"]
    kallsyms.write_text("".join(f"0 d __tracepoint_{n}\t[gpu_sched]\n" for n in names))
    with pytest.raises(ProbeError, match=r"^no BTF of the gpu_sched module .*/vmlinux: No such"):
        RefusingJobsKernel(kallsyms, "", btf_root=tmp_path).start()


@pytest.mark.parametrize(
    ("caps", "said"),
    [
        ({"BPF"}, "missing CAP_PERFMON"),
        ({"PERFMON", "SYS_PTRACE"}, "missing CAP_BPF"),
        (set(), "missing CAP_BPF, CAP_PERFMON"),
    ],
)
def test_the_jobs_need_bpf_and_perfmon(held: set[str], caps: set[str], said: str) -> None:
    held.clear()
    held.update(caps)
    with pytest.raises(ProbeError) as err:
        JobsKernel().check()
    assert err.value.cause is Cause.CAPABILITIES
    assert (
        str(err.value) == f"the GPU jobs probe needs CAP_BPF + CAP_PERFMON, {said} (docs/jobs.md)"
    )


@pytest.mark.parametrize("caps", [{"BPF", "PERFMON"}, {"SYS_ADMIN"}])
def test_the_jobs_load_with_bpf_and_perfmon_or_sys_admin(held: set[str], caps: set[str]) -> None:
    held.clear()
    held.update(caps)
    JobsKernel().check()


def test_every_program_of_both_flavours_is_in_the_object() -> None:
    """The built object (opened by the host's libbpf, not loaded) has each step's program in
    both flavours and both timeout programs."""
    lib = shared_libbpf()
    obj = lib.open(OBJECTS / abi.JOBS_OBJECT)
    try:
        for variant in abi.JOB_TRACEPOINTS:
            for _, program in variant:
                for name in (program, program + abi.RAW):
                    assert lib.lib.bpf_object__find_program_by_name(obj, name.encode()), name
        for _, program in (abi.JOB_TIMEOUT, abi.JOB_TIMEOUT_RAW):
            assert lib.lib.bpf_object__find_program_by_name(obj, program.encode()), program
    finally:
        lib.lib.bpf_object__close(obj)


# --- the stage -----------------------------------------------------------------------------


class FakeJobsKernel:
    """The probe: start() fails `failures` times (no scheduler yet), then attaches."""

    def __init__(self, failures: int = 0, absent: int = 0) -> None:
        self.failures = failures
        self.absent = absent  # available() is False this many times
        self.times: dict[tuple[int, int], JobTimes] = {}
        self.ring_names = {
            RING: Ring("gfx_0.0.0", GPU),
            RING + 1: Ring("testdrm-ring", "kubenpu_testdrm"),
        }
        self.lost_counts = {"unmatched": 0, "keys_full": 0, "events_full": 0}
        self.steps: list[JobStep] = []  # the ring buffer's records not yet read
        self.forgotten: list[int] = []
        self.closed = False

    def check(self) -> None:
        pass

    def available(self) -> bool:
        if self.absent:
            self.absent -= 1
            return False
        return True

    def start(self) -> str:
        if self.failures:
            self.failures -= 1
            raise ProbeError("no DRM GPU scheduler tracepoints")
        return "tp_btf fake"

    def read(self) -> dict[tuple[int, int], JobTimes]:
        return dict(self.times)

    def rings(self) -> dict[int, Ring]:
        return self.ring_names

    def lost(self) -> dict[str, int]:
        return dict(self.lost_counts)

    def events(self) -> list[JobStep]:
        found, self.steps = self.steps, []
        return found

    def forget(self, cgroup_ids: Iterable[int]) -> None:
        """The keys leave the table, as JobsKernel.forget deletes them."""
        self.forgotten += cgroup_ids
        self.times = {k: t for k, t in self.times.items() if k[0] not in self.forgotten}

    def close(self) -> None:
        self.closed = True


DEVICES = [Device(GPU, "amdgpu", "1002:744c", 0, (), "amdgpu")]


def stage(kernel: FakeJobsKernel, resolver: FakeResolver, clock: Clock, metrics: Series) -> Jobs:
    jobs = Jobs(
        kernel, resolver, metrics, DEVICES, pending_seconds=5, retry_seconds=0.01, clock=clock
    )
    jobs.start()
    eventually(jobs.attached.is_set, "attached")
    return jobs


def test_the_probe_is_retried_until_the_scheduler_is_loaded_and_it_loads(caplog) -> None:
    """No scheduler yet is one info line, not an error; a failed load is an error, retried."""
    caplog.set_level(logging.INFO, "kubenpu.sources.jobs")
    kernel = FakeJobsKernel(failures=2, absent=3)
    jobs = stage(kernel, FakeResolver(), Clock(), table(60, 1000))
    assert (kernel.absent, kernel.failures) == (0, 0)
    said = [(r.levelname, r.getMessage().split(":")[0]) for r in caplog.records]
    assert said.count(("INFO", "GPU jobs")) == 2  # "not loaded yet" once, then "attached"
    assert [level for level, _ in said].count("ERROR") == 1  # the first failure of the streak
    jobs.close()
    assert kernel.closed


class Refused(FakeJobsKernel):
    """A probe that can never load; `absent`: no scheduler either, as on most nodes."""

    def check(self) -> None:
        self.tries = getattr(self, "tries", 0) + 1
        raise ProbeError(
            "the GPU jobs probe needs CAP_BPF + CAP_PERFMON, missing CAP_BPF", Cause.CAPABILITIES
        )


def test_missing_capabilities_are_one_error_and_no_retry(caplog) -> None:
    """Said at once, before any scheduler is loaded: the capabilities never change."""
    kernel = Refused(absent=1_000_000)
    jobs = Jobs(kernel, FakeResolver(), table(60, 1000), DEVICES, retry_seconds=0.01)
    jobs.start()
    jobs._thread.join(5)
    assert not jobs._thread.is_alive() and kernel.tries == 1 and not jobs.attached.is_set()
    [error] = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert error == "GPU jobs off: the GPU jobs probe needs CAP_BPF + CAP_PERFMON, missing CAP_BPF"
    jobs.read()  # never attached: nothing to read, nothing raised


def test_the_first_look_for_the_scheduler_waits_and_a_close_ends_the_wait() -> None:
    """The agent's jobs source looks for the DRM GPU scheduler (a pass over all of kallsyms on
    most nodes) only jobs.FIRST_CHECK_SECONDS after its start, off the start's path; a close
    within the wait ends the thread without a look."""
    kernel = Refused(absent=1_000_000)  # each look counted in `tries`
    jobs = Jobs(kernel, FakeResolver(), table(60, 1000), DEVICES, first_check_seconds=3600)
    jobs.start()
    jobs.close()
    assert not jobs._thread.is_alive() and getattr(kernel, "tries", 0) == 0
    node = Node(Config(), table(60, 1000), DEVICES, DEVICES, FakeResolver(), None, None)  # type: ignore[arg-type]
    built = jobs_build(node)
    assert built is not None and built._first_check == FIRST_CHECK_SECONDS > 0
    built.close()


def test_jobs_are_set_per_pod_device_and_ring_with_the_kernels_histograms() -> None:
    kernel, resolver, metrics = FakeJobsKernel(), FakeResolver(), table(60, 1000)
    resolver.answers[7] = POD_A
    kernel.times = {(7, RING): times(3, [2 * MS, 40 * MS], [50 * MS, 50 * MS])}
    jobs = stage(kernel, resolver, Clock(), metrics)
    jobs.read()
    key = ("ns", "a", "u-a", "c", GPU, "amdgpu", "gfx_0.0.0")
    assert values(metrics, JOBS) == {key: 2}
    assert values(metrics, JOBS_IN_FLIGHT) == {key: 1}
    [[run]] = [[p.value for p in points] for s, points in metrics.collect() if s is JOB_RUN]
    assert isinstance(run, ExpHist) and run.total == 0.1
    assert run.slots[abi.duration_slot(50 * MS)] == 2 and sum(run.slots) == 2
    [[wait]] = [[p.value for p in points] for s, points in metrics.collect() if s is JOB_WAIT]
    assert sum(wait.slots) == 2 and wait.total == 0.042


def test_a_cgroup_the_resolver_cannot_name_waits_then_takes_the_settled_answer() -> None:
    """Nothing is lost while it waits: the kernel's values are cumulative."""
    kernel, resolver, clock = FakeJobsKernel(), FakeResolver(), Clock()
    metrics = table(60, 1000)
    kernel.times = {(8, RING + 1): times(1, [MS], [10 * MS])}
    jobs = stage(kernel, resolver, clock, metrics)
    jobs.read()
    assert values(metrics, JOBS) == {}
    clock.now += 5
    kernel.times = {(8, RING + 1): times(2, [MS, MS], [10 * MS, 10 * MS])}
    jobs.read()
    # a platform device's id is platform:<name>; the settled answer has no pod
    assert values(metrics, JOBS) == {
        ("", "", "", "platform:kubenpu_testdrm", "", "testdrm-ring"): 2
    }


def test_a_gone_cgroup_keeps_its_last_values_retires_and_leaves_the_kernel_table() -> None:
    kernel, resolver, clock = FakeJobsKernel(), FakeResolver(), Clock()
    metrics = table(10, 1000, clock=clock)
    resolver.answers[7] = POD_A
    kernel.times = {(7, RING): times(4, [MS] * 4, [MS] * 4)}
    jobs = stage(kernel, resolver, clock, metrics)
    jobs.read()
    resolver.dead.add(7)
    jobs.read()
    assert kernel.forgotten == [7]
    assert sum(values(metrics, JOBS).values()) == 4  # kept until the TTL
    clock.now += 11
    assert values(metrics, JOBS) == {}


def test_dead_non_pod_cgroups_jobs_fold_into_the_unattributed_series_and_free_theirs() -> None:
    """The unattributed unit never retires, and it kept each dead non-pod cgroup's jobs for
    good. A reaped cgroup's jobs are folded into its series' totals (its jobs in flight are
    not: its keys left the kernel's table), and waves of reaped cgroups leave nothing behind."""
    kernel, resolver, metrics = FakeJobsKernel(), FakeResolver(), table(60, 1000)
    for cgroup in range(2_000):
        resolver.answers[cgroup] = Attribution(reason="not_pod")
        resolver.dead.add(cgroup)  # each read sets a gone cgroup's last values, then reaps it
    jobs = stage(kernel, resolver, Clock(), metrics)

    def wave(first: int) -> None:
        cgroups = range(first, first + 500)
        kernel.times = {(c, RING): times(2, [MS], [MS]) for c in cgroups}  # one in flight each
        jobs.read()
        assert kernel.times == {}
        kernel.forgotten.clear()  # the fake's record, not the agent's memory

    after, _ = memory_growth(lambda n: wave(n * 500), 3)
    assert after[2] - after[0] < 10_000  # each cgroup's jobs kept: ~300 KB a wave
    key = ("", "", "", GPU, "amdgpu", "gfx_0.0.0")
    assert values(metrics, JOBS) == {key: 2_000}
    assert values(metrics, JOBS_IN_FLIGHT) == {}
    [[run]] = [[p.value for p in points] for s, points in metrics.collect() if s is JOB_RUN]
    assert run.count == 2_000


def test_job_series_count_against_the_series_cap() -> None:
    """A (pod, device, ring) is four series under the cap: its four points (the wait and run
    histograms, the job count, the jobs in flight). It once counted as one, 8 of them in room
    for 8 series."""
    kernel, resolver = FakeJobsKernel(), FakeResolver()
    metrics = table(60, 8)
    for cgroup in (1, 2, 3):
        resolver.answers[cgroup] = Attribution(namespace="ns", pod=f"p{cgroup}", container="c")
        kernel.times[(cgroup, RING)] = times(1, [MS], [MS])
    stage(kernel, resolver, Clock(), metrics).read()
    assert len(values(metrics, JOBS)) == 2
    [overflow] = [
        p
        for s, points in metrics.collect()
        if s.name == "kubenpu.overflow_series"
        for p in points
        if p.attrs["source"] == "jobs"
    ]
    assert overflow.value == 1


def test_the_kernels_losses_are_counted_by_reason() -> None:
    kernel = FakeJobsKernel()
    kernel.lost_counts = {"unmatched": 3, "keys_full": 0, "events_full": 2}
    metrics = table(60, 1000)
    stage(kernel, FakeResolver(), Clock(), metrics).read()
    assert values(metrics, JOBS_LOST) == {("unmatched",): 3, ("events_full",): 2}


def step(kind: int, ms: int, fence: int, cgroup: int = 0) -> JobStep:
    return JobStep(kind, ms * MS, fence, RING, cgroup)


def test_blocked_by_seconds_per_pod_pair_and_idle_with_an_unnamed_pod_waiting() -> None:
    """B waits 40 ms behind A's job and 10 ms on the idle ring; B's cgroup is unnamed at the
    first read, so its seconds wait for the read that names it, none lost. A step older than
    the replayed frontier is counted late."""
    kernel, resolver, metrics = FakeJobsKernel(), FakeResolver(), table(60, 1000)
    resolver.answers[7] = POD_A
    now = [0]
    jobs = Jobs(kernel, resolver, metrics, DEVICES, 5, 0.01, Clock(), now_ns=lambda: now[0])
    jobs.start()
    eventually(jobs.attached.is_set, "attached")
    kernel.steps = [
        step(QUEUED, 0, 1, 7),
        step(RUN, 0, 1),
        step(QUEUED, 10, 2, 8),
        step(DONE, 50, 1),
        step(RUN, 60, 2),
        step(DONE, 70, 2),
    ]
    now[0] = 70 * MS + MARGIN_NS
    jobs.read()
    assert values(metrics, JOB_WAIT_BEHIND) == {}
    resolver.answers[8] = Attribution(namespace="ns", pod="b", container="c", pod_uid="u-b")
    kernel.steps = [step(QUEUED, 1, 3, 7)]  # older than the frontier: late
    jobs.read()
    b = ("ns", "b", "u-b", "c", GPU, "amdgpu", "gfx_0.0.0")
    assert values(metrics, JOB_WAIT_BEHIND) == {(*b, "ns", "a"): 0.04}
    assert values(metrics, JOB_WAIT_IDLE) == {b: 0.01}
    assert values(metrics, JOBS_LOST)[("events_late",)] == 1


def test_the_objects_structs_have_abis_layouts() -> None:
    """The compiled object's BTF against the layouts the maps are read with."""
    out = subprocess.run(
        ["bpftool", "-j", "btf", "dump", "file", str(OBJECTS / abi.JOBS_OBJECT)],
        capture_output=True,
        check=True,
    ).stdout
    types = {t["name"]: t for t in json.loads(out)["types"] if t.get("kind") == "STRUCT"}
    offsets = {m["name"]: m["bits_offset"] // 8 for m in types["job_times"]["members"]}
    slots = 8 * abi.DURATION_SLOTS
    assert offsets == {
        "queued": 0,
        "done": 8,
        "wait_sum_ns": 16,
        "run_sum_ns": 24,
        "timeouts": 32,
        "wait": 40,
        "run": 40 + slots,
    }
    sizes = {name: types[name]["size"] for name in ("job_key", "job_times", "ring")}
    assert sizes == {
        "job_key": abi.JOB_KEY.size,
        "job_times": abi.JOB_TIMES_VALUE.size,
        "ring": abi.RING.size,
    }
    # a ring buffer's record type is in no map's BTF: the source asserts its size at compile
    source = (Path(__file__).parents[1] / "bpf" / "jobs.bpf.c").read_text()
    assert f"sizeof(struct job_event) == {abi.JOB_EVENT.size}," in source


# --- resets: the guilty pod (the uevent's PID=) and the victims (the kernel's timeouts) -----


def timed_out(t: JobTimes, n: int = 1) -> JobTimes:
    """`t` after `n` timeouts of its ring that found its jobs in flight."""
    return t._replace(timeouts=t.timeouts + n)


@pytest.fixture
def procs(tmp_path: Path) -> tuple[ProcCgroups, dict[str, int]]:
    """Three pods' cgroups; pid 4242 is the guilty one's task."""
    cgroups = tmp_path / "cgroup"
    for name in ("guilty", "victim", "idle"):
        (cgroups / "kubepods" / name).mkdir(parents=True)
    ids = {n: (cgroups / "kubepods" / n).stat().st_ino for n in ("guilty", "victim", "idle")}
    (tmp_path / "proc" / "4242").mkdir(parents=True)
    (tmp_path / "proc" / "4242" / "cgroup").write_text("0::/kubepods/guilty\n")
    return ProcCgroups(str(cgroups), proc=str(tmp_path / "proc")), ids


def reset_stage(procs, clock: Clock | None = None):
    found, ids = procs
    kernel, resolver, metrics = FakeJobsKernel(), FakeResolver(), table(60, 1000)
    for name, cgroup in ids.items():
        resolver.answers[cgroup] = Attribution(namespace="ns", pod=name, container="c")
    jobs = Jobs(
        kernel,
        resolver,
        metrics,
        DEVICES,
        retry_seconds=0.01,
        clock=clock or Clock(),
        cgroups=found,
    )
    jobs.start()
    eventually(jobs.attached.is_set, "attached")
    return jobs, kernel, metrics, ids


def on_gpu(pod: str) -> tuple[str, ...]:
    return ("ns", pod, "c", GPU, "amdgpu")


def test_a_reset_counts_the_guilty_pod_by_its_pid_and_the_pods_in_flight_at_the_timeout(
    procs,
) -> None:
    jobs, kernel, metrics, ids = reset_stage(procs)
    kernel.times = {
        (ids["guilty"], RING): timed_out(times(1, [], [])),  # its hung job
        # in flight at the timeout, all done by the read: a victim all the same
        (ids["victim"], RING): timed_out(times(3, [MS] * 3, [MS] * 3)),
        (ids["idle"], RING): times(1, [MS], [MS]),  # done before the timeout: not a victim
        (ids["idle"], RING + 1): timed_out(times(5, [], [])),  # another device's ring
    }
    jobs.reset(GPU, 4242)
    jobs.read()
    assert values(metrics, POD_HANGS) == {on_gpu("guilty"): 1}
    assert values(metrics, RESET_VICTIMS) == {on_gpu("victim"): 1}
    jobs.read()  # the rises are taken: counted once
    assert values(metrics, RESET_VICTIMS) == {on_gpu("victim"): 1}


def test_each_reset_takes_one_rise_in_order_and_one_that_names_no_one_has_victims_only(
    procs,
) -> None:
    jobs, kernel, metrics, ids = reset_stage(procs)
    kernel.times = {
        (ids["guilty"], RING): timed_out(times(2, [], []), 2),  # in flight at both
        (ids["victim"], RING): timed_out(times(3, [], [])),  # at the first only
    }
    jobs.reset(GPU, 4242)
    jobs.reset(GPU, None)  # no task named
    jobs.read()
    assert values(metrics, POD_HANGS) == {on_gpu("guilty"): 1}
    assert values(metrics, RESET_VICTIMS) == {on_gpu("victim"): 1, on_gpu("guilty"): 1}


def test_a_reset_without_a_scheduler_timeout_has_no_victims(procs) -> None:
    jobs, kernel, metrics, ids = reset_stage(procs)
    kernel.times = {(ids["victim"], RING): times(3, [], [])}  # in flight, never timed out
    jobs.reset(GPU, 4242)
    jobs.read()
    assert values(metrics, POD_HANGS) == {on_gpu("guilty"): 1}
    assert values(metrics, RESET_VICTIMS) == {}


def test_a_timeout_whose_reset_comes_later_is_paired_with_it(procs) -> None:
    jobs, kernel, metrics, ids = reset_stage(procs)
    kernel.times = {(ids["victim"], RING): timed_out(times(3, [], []))}
    jobs.read()  # the timeout is seen before the uevent is
    jobs.reset(GPU, 4242)
    jobs.read()
    assert values(metrics, RESET_VICTIMS) == {on_gpu("victim"): 1}


def test_a_timeout_no_reset_takes_is_dropped_and_said(procs, caplog) -> None:
    clock = Clock()
    jobs, kernel, metrics, ids = reset_stage(procs, clock)
    kernel.times = {(ids["victim"], RING): timed_out(times(3, [], []))}
    with caplog.at_level(logging.INFO, "kubenpu.sources.jobs"):
        jobs.read()
        clock.now += STALE_RISE_SECONDS - 1
        jobs.read()
        assert "no reset" not in caplog.text
        clock.now += 1
        jobs.read()
    assert "had no reset in 30 s" in caplog.text
    jobs.reset(GPU, 4242)  # a later reset: the old timeout is not its victim
    jobs.read()
    assert values(metrics, RESET_VICTIMS) == {}
    assert values(metrics, POD_HANGS) == {on_gpu("guilty"): 1}


def test_a_reset_whose_pods_are_not_known_yet_is_counted_at_a_later_read(tmp_path: Path) -> None:
    kernel, resolver, clock = FakeJobsKernel(), FakeResolver(), Clock()
    metrics = table(60, 1000)
    kernel.times = {(9, RING): timed_out(times(2, [], []))}
    jobs = stage(kernel, resolver, clock, metrics)
    jobs.reset(GPU, None)
    jobs.read()
    assert values(metrics, RESET_VICTIMS) == {}
    resolver.answers[9] = POD_A
    jobs.read()
    assert values(metrics, RESET_VICTIMS) == {("ns", "a", "u-a", "c", GPU, "amdgpu"): 1}


def test_kallsyms_is_scanned_again_only_once_the_loaded_modules_changed(tmp_path: Path) -> None:
    """available() at each retry scans kallsyms (1.3 s under TCG) only when a module came or
    went since the scan that found nothing; a found set is scanned for again (a failed start
    is retried)."""
    kallsyms, modules = tmp_path / "kallsyms", tmp_path / "modules"
    kallsyms.write_text("0000000000000000 T _stext\n")
    modules.write_text("vgem 16384 0 - Live 0x0000000000000000\n")
    kernel = JobsKernel(kallsyms=kallsyms, modules=modules)
    assert not kernel.available()
    names = ["drm_sched_job_queue", "drm_sched_job_run", "drm_sched_job_done"]
    kallsyms.write_text("".join(f"0 d __tracepoint_{n}\t[gpu_sched]\n" for n in names))
    modules.write_text("vgem 16384 3 - Live 0x0000000000000000\n")  # its use count only
    assert not kernel.available()  # not scanned: the same modules
    modules.write_text(modules.read_text() + "gpu_sched 61440 0 - Live 0x0000000000000000\n")
    assert kernel.available() and kernel.available()
    kallsyms.write_text("0000000000000000 T _stext\n")
    assert not kernel.available()  # gone again with the same modules: a found set is not kept
    modules.unlink()  # no module support: scanned every time
    kallsyms.write_text("".join(f"0 d __tracepoint_{n}\t[gpu_sched]\n" for n in names))
    assert kernel.available()


class SlowStart(FakeJobsKernel):
    """A load that outlasts the stop (a module's BTF under a busy CPU): start() runs until the
    probe is closed under it, or `seconds` pass; close() says whether a start was under way."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds
        self.entered = threading.Event()
        self.under_way = False
        self.closed_under_start = False

    def start(self) -> str:
        self.under_way = True
        self.entered.set()
        deadline = time.monotonic() + self.seconds
        while not self.closed and time.monotonic() < deadline:
            time.sleep(0.01)
        self.under_way = False
        return "tp_btf slow"

    def close(self) -> None:
        self.closed_under_start = self.under_way
        super().close()


def test_a_stop_while_the_probe_starts_waits_for_the_start_then_closes_it() -> None:
    """SIGTERM during the load: libbpf's object must not be closed under bpf_object__load."""
    kernel = SlowStart(seconds=2.0)
    jobs = Jobs(kernel, FakeResolver(), table(60, 1000), DEVICES, retry_seconds=0.01)
    thread = jobs.start()
    # The stop's wait for the thread ends before the load does (it is bounded; the load is not).
    thread.join = lambda timeout=None: threading.Thread.join(thread, 0.01)  # type: ignore[method-assign]
    assert kernel.entered.wait(10)
    jobs.close()
    assert kernel.closed and not kernel.closed_under_start


class Late(FakeJobsKernel):
    """A scheduler that loads when the test says."""

    def __init__(self) -> None:
        super().__init__()
        self.loaded = threading.Event()

    def available(self) -> bool:
        return self.loaded.is_set()


def test_resets_held_before_the_probe_attaches_are_bounded(procs, caplog) -> None:
    """Nothing reads them until it attaches (on some nodes never): a flood was held for good.
    The newest MAX_HELD_RESETS are counted once it does; the first dropped is said."""
    found, ids = procs
    kernel, resolver, metrics = Late(), FakeResolver(), table(60, 1000)
    resolver.answers[ids["guilty"]] = Attribution(namespace="ns", pod="guilty", container="c")
    jobs = Jobs(kernel, resolver, metrics, DEVICES, retry_seconds=0.01, cgroups=found)
    jobs.start()
    with caplog.at_level(logging.WARNING, "kubenpu.sources.jobs"):
        for _ in range(MAX_HELD_RESETS + 2):
            jobs.reset(GPU, 4242)
    assert len(caplog.messages) == 1 and "1024 device resets wait" in caplog.messages[0]
    kernel.loaded.set()
    eventually(jobs.attached.is_set, "attached")
    jobs.read()
    assert values(metrics, POD_HANGS) == {on_gpu("guilty"): MAX_HELD_RESETS}
    jobs.close()


class FakeClients:
    """fdinfo's clients: the cgroup id of each (device, drm-client-id)'s lowest pid."""

    def __init__(self, held: dict[tuple[str, int], int]) -> None:
        self.held = held
        self.seen: set[int] = set()  # the tgids fdinfo is asked to scan

    def client_cgroups(self) -> dict[tuple[str, int], int]:
        return dict(self.held)

    def saw(self, tgids: Iterable[int], cgroup_ids: Iterable[int]) -> None:
        self.seen |= set(tgids)


def test_job_client_ids_are_joined_to_fdinfos_clients_and_disagreements_said(caplog) -> None:
    """Client 5's jobs came from pod a's task, whose fd pod a holds: agree. Client 6's from
    pod a's task but its fd is held by pod b (passed over a socket): said, and the jobs stay
    pod a's. Client 7 is not in fdinfo yet: joined at the read that has it. Each once."""
    caplog.set_level(logging.INFO, "kubenpu.sources.jobs")
    kernel, resolver, metrics = FakeJobsKernel(), FakeResolver(), table(60, 1000)
    resolver.answers[7] = POD_A
    resolver.answers[8] = Attribution(namespace="ns", pod="b", container="c", pod_uid="u-b")
    clients = FakeClients({(GPU, 5): 7, (GPU, 6): 8})
    jobs = Jobs(kernel, resolver, metrics, DEVICES, 5, 0.01, Clock(), clients=clients)
    jobs.start()
    eventually(jobs.attached.is_set, "attached")
    kernel.steps = [JobStep(QUEUED, 0, f, RING, 7, f // 10, 300 + f) for f in (50, 51, 60, 70)]
    jobs.read()
    assert jobs.joins == {"agree": 1, "disagree": 1}
    assert clients.seen == {350, 351, 360, 370}  # the queueing processes: fdinfo scans them
    clients.held[(GPU, 7)] = 7
    kernel.steps = [JobStep(QUEUED, 0, 52, RING, 7, 5)]  # client 5 again: compared once
    jobs.read()
    assert jobs.joins == {"agree": 2, "disagree": 1}
    said = [r.getMessage() for r in caplog.records if "client" in r.getMessage()]
    assert said == [
        "GPU jobs: client ids joined to fdinfo's clients: client 5 on 0000:03:00.0 is pod ns/a's "
        "in both",
        "GPU jobs: client 6 on 0000:03:00.0 queued jobs from pod ns/a, but its fd is held by pod "
        "ns/b; the jobs count for the queueing task's (1 such clients)",
    ]
