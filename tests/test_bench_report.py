"""bench/report.py renders what bench_guest.py measured; here with made-up figures."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "bench_report", Path(__file__).parents[1] / "bench" / "report.py"
)
report = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(report)


def burst(issued: int, counted: int | None = None) -> dict:
    return {"issued": issued, "counted": issued if counted is None else counted, "dropped": {}}


def phases(loops_ns: list[float], cpu: float, rss: float) -> dict:
    """One arm's record of a full run: loops, three windows, the pod tour, start and memory."""
    windows = [
        {**burst(n), "target_rate": rate, "rate": n // 5, "cpu_per_second": cpu}
        | {"cpu_seconds_per_million": 1.0}
        for rate, n in ((20000, 100000), (200000, 1000000), (0, 2000000))
    ]
    return {
        "loops_ns": loops_ns,
        "loops": burst(500000),
        "windows": windows,
        "tour": burst(3000) | {"attributed": 3000, "series": 1001},
        "attach_seconds": 50.0,
        "first_metric_seconds": 55.0,
        "rss_mib_start": rss,
        "rss_mib_steady": rss + 3,
        "idle_cpu_per_second": cpu,
        "idle_cpu_per_second_pods": cpu,
        "idle_cpu_windows_pods": [cpu * 3, cpu * 2, cpu, cpu, cpu, cpu],
    }


FULL = {
    "kernel": "6.12.117+deb13-amd64",
    "cpus": 2,
    "loop_calls": 100000,
    "max_rate": 500000,
    "pods": 1000,
    "baseline_ns": [2000.0, 2000.0, 2400.0],
    "baseline_ns_median": 2000.0,
    "modes": {
        "aggregate": phases([2600.0, 2700.0, 2800.0], 0.02, 215),
        "events": phases([5000.0, 5000.0, 5000.0], 0.9, 214),
    },
    "bpftrace": {
        "hook": "security_file_ioctl",
        "program": "fentry:vmlinux:security_file_ioctl { @[cgroup, args.cmd] = count(); }",
        "attach_seconds": 4.0,
        "rss_mib_start": 100.0,
        "rss_mib_steady": 101.0,
        "idle_cpu_per_second": 0.0,
        "idle_cpu_per_second_pods": 0.0,
        "idle_cpu_windows_pods": [0.0] * 6,
        "loops_ns": [2400.0, 2500.0, 2600.0],
        "windows": phases([], 0.001, 0)["windows"],
        "tour": {"issued": 3000},
        "total": burst(3103010, 3103000),
    },
}


RESTART_ONLY = {
    "kernel": "6.12.117+deb13-amd64",
    "cpus": 2,
    "pods": 1000,
    "restart": {
        "bcc_attached_seconds": 50.0,
        "bcc_first_metric_seconds": 52.5,
        "bcc_rss_mib_start": 101.0,
        "cold_attached_seconds": 51.0,
        "cold_first_metric_seconds": 52.0,
        "cold_rss_mib_start": 58.0,
        "cold_rss_mib_steady": 61.0,
        "tour": {"issued": 3000, "counted": 3000, "dropped": {}},
        "adopt_attached_seconds": 5.0,
        "adopt_first_metric_seconds": 6.5,
        "adopt_rss_mib_start": 55.0,
        "adopt_rss_mib_steady": 60.0,
        "across": {"issued": 40010, "counted": 40010, "dropped": {}, "lost": 0},
    },
}


def test_floor_rows_set_the_bpftrace_arm_beside_the_aggregate_mode():
    text = report.render(FULL, None)
    head = "|  | KubeNPU aggregate | bpftrace one-liner on security_file_ioctl |"
    assert head in text
    assert "| ns per call vs no agent (median) | 1.35x | 1.25x |" in text
    assert "| added ns per call (best loop) | 600 | 400 |" in text
    assert "| agent CPU at 200000/s | 2.0 % | 0.1 % |" in text
    # every phase of the aggregate mode: 500,000 + 3,100,000 + 3,000; the floor missed 10
    assert (
        "| counted / issued, every phase | 3603000 / 3603000 "
        "| 3103000 / 3103010 (**10 not counted**) |" in text
    )
    assert "| start → first count (s) | 55.0 | 4.0 |" in text
    assert "| RSS with 1000 pods (MiB) | 218 | 101 |" in text
    assert "- aggregate: 6.0 %, 4.0 %, 2.0 %, 2.0 %, 2.0 %, 2.0 %\n" in text  # the settling


def test_a_run_without_the_floor_arm_still_renders():
    text = report.render({k: v for k, v in FULL.items() if k != "bpftrace"}, None)
    assert "Added cost per ioctl" in text
    assert "The floor" not in text


def test_restart_rows_show_start_times_memory_and_calls_lost():
    text = report.render(RESTART_ONLY, None)
    assert (
        "| cold start, BCC fallback (compiles on the node, no pinning) | 50.0 | 52.5 | 101 |"
        in text
    )
    assert "| cold start, pinning (CO-RE, loaded in the agent) | 51.0 | 52.0 | 58 | 61 |  |" in text
    adopt = "| restart that adopts the pins | 5.0 | 6.5 | 55 | 60 | 0 of 40010 (dropped: 0) |"
    assert adopt in text
    assert "no pinning (in process)" not in text  # a --restart run has no per-mode phases


def test_image_rows_give_each_variant_its_size():
    text = report.images(
        "default: docker.io/kubenpu/kubenpu-agent:0.1.0: 190 MB unpacked, 70M archive (/c/a)\n"
        "bcc: docker.io/kubenpu/kubenpu-agent:0.1.0-bcc: 415 MB unpacked, 141M archive (/c/b)\n"
    )
    assert "| default | `docker.io/kubenpu/kubenpu-agent:0.1.0` | 190 MB unpacked, 70M" in text
    assert "| bcc | `docker.io/kubenpu/kubenpu-agent:0.1.0-bcc` | 415 MB unpacked" in text


MICRO = {
    "python": "3.11.7",
    "decode_ns_per_event": 1.0,
    "tally_ns_per_event": 2.0,
    "events_path_ns_per_event": 3.0,
    "aggregate_ns_per_key": 4.0,
    "fdinfo_full_scan_ms": 600.0,
    "fdinfo_read_ms": 280.0,
}


def test_the_telemetry_row_sits_beside_the_fdinfo_read_when_measured():
    row = "| one telemetry read, every device of the 5 fixture machines (sysfs/hwmon) | 5.5 |"
    assert row in report.micro({**MICRO, "telemetry_read_ms": 5.5})
    assert "telemetry" not in report.micro(MICRO)  # figures from before it still render


def arm(tcgets: list[float], drm: list[float], idle: float = 0.01) -> dict:
    """One arm's rounds: a figure per round of each call, idle CPU, switches, start."""
    n = len(tcgets)
    return {
        "tcgets": tcgets,
        "drm": drm,
        "idle": [idle] * n,
        "switches": [50] * n,
        "start": [3.0] * n,
    }


PAIRED = {
    "kernel": "6.12.117+deb13-amd64",
    "cpus": 2,
    "hooks_loop_calls": 20000,
    "hooks_rounds": 4,
    "loops_per_round": 3,
    "rounds": {
        "clean": {"bpftool": True, "leftovers": []},
        "arms": {
            # The host drifts by round (1000, 1100, 900, 1000 with no agent): paired
            # differences take it out, so a constant +250 has an interval of width 0.
            "none": arm([1000, 1100, 900, 1000], [2000, 2100, 1900, 2000], 0.0),
            "agent": arm([1300, 1400, 1200, 1300], [2500, 2640, 2380, 2500]),
            "agent untimed": arm([1060, 1130, 950, 1030], [2300, 2400, 2200, 2300]),
            "bpftrace": arm([1050, 1150, 950, 1050], [2400, 2500, 2300, 2400]),
            # A timed floor as slow on TCGETS as no agent: its added ns are 0, there is no ratio.
            "bpftrace-timed drm_ioctl exit": arm([1000, 1100, 900, 1000], [2800, 2900, 2700, 2800]),
        },
    },
}


def settled_row(text: str, name: str) -> list[str]:
    [line] = [ln for ln in text.splitlines() if ln.startswith(f"| {name} |")]
    return [c.strip() for c in line.strip("|").split("|")][1:]


def test_arm_rows_compare_each_arm_with_no_agent_round_by_round():
    text = report.render(PAIRED, None)
    assert "| agent | 1300 | +300 | 2500 | +500 | 1.0 % | 10.0 | 3.0 |" in text
    assert "| none (no agent) | 1000 | +0 | 2000 | +0 | 0.0 % | 10.0 |  |" in text
    assert "every arm started with no tracing program of an earlier arm loaded" in text
    assert "Added cost per ioctl" not in text  # a --hooks run has no per-mode phases


def test_an_arm_that_started_beside_a_leftover_says_so():
    dirty = {
        **PAIRED,
        "rounds": {
            **PAIRED["rounds"],
            "clean": {
                "bpftool": True,
                "leftovers": [{"round": 0, "arm": "agent", "programs": [7]}],
            },
        },
    }
    assert "arms not checked or not clean" in report.render(dirty, None)


def test_paired_rows_take_the_drift_out_round_by_round():
    text = report.render(PAIRED, None)
    assert "Paired by round (4 rounds)" in text
    timed = settled_row(text, "agent - bpftrace")
    assert timed[0] == "+250 [+250, +250]"  # the same +250 in every round
    assert timed[1] == "6.00x [6.00, 6.00]"  # 300 added against 50
    assert timed[2] == "±0%"  # an interval of width 0 against the floor's 50 added ns
    # untimed vs the one-liner on TCGETS: +10, -20, 0, -20 by round; the interval holds 0
    untimed = settled_row(text, "agent untimed - bpftrace")
    assert untimed[0] == "-8 [-20, +5]"
    assert untimed[2] == "±25%"  # 12.5 ns of half-width against 50
    # A floor that adds nothing measurable has no ratio; the difference still shows.
    no_floor = settled_row(text, "agent - bpftrace-timed drm_ioctl exit")
    assert no_floor[:3] == ["+300 [+300, +300]", "-", "-"]
    assert "agent syscall exit - " not in text  # no such arm in this run


def job_arm(jobs_per_second: list[float], cpu: float, counted: list[int], probe: str = "") -> dict:
    """One arm of the GPU jobs row: jobs/s and CPU per round, jobs counted, the probe's line."""
    n = len(jobs_per_second)
    return {
        "jobs_per_second": jobs_per_second,
        "cpu": [cpu] * n,
        "issued": [8000] * n,
        "counted": counted,
        "probe": [probe] * n if probe else [],
    }


ATTACHED = "GPU jobs: attached (CO-RE)"
JOBS = {
    "kernel": "6.12.117+deb13-amd64",
    "cpus": 2,
    "jobs": {
        "program": "tracepoint:gpu_scheduler:drm_sched_job { @q[args.fence] = nsecs; }",
        "burst_jobs": 4000,
        "bursts": 2,
        "step_jobs": 1000,
        "rounds": 3,
        "arms": {
            # The host drifts by round (2000, 2200, 1800 with no agent); ratios are per round.
            "none": job_arm([2000, 2200, 1800], 0.0, []),
            "agent": job_arm([1900, 2090, 1800], 0.02, [8000] * 3, ATTACHED),
            "agent jobs off": job_arm([2000, 2200, 1800], 0.01, []),
            "bpftrace": job_arm([1960, 2156, 1764], 0.001, [8000, 8000, 7990]),
        },
    },
}


def test_job_rows_give_each_arm_its_rate_cpu_and_jobs_counted():
    text = report.render(JOBS, None)
    assert "3 rounds, each starting every arm afresh" in text
    assert (
        "in each, 2 bursts of 4000 jobs of no length from one process, on a fresh fd every 1000"
        in text
    )
    assert "| none (no agent) | 2000 | - | - | - |" in text
    # CPU s per M jobs per round: 0.02 / 1900, / 2090, / 1800 x 1e6; their median
    assert "| agent | 1900 | 2.0 % | 10.5 | 24000 / 24000 |" in text
    assert "| agent jobs off | 2000 | 1.0 % | 5.0 | - |" in text  # counts no jobs
    assert "| bpftrace | 1960 | 0.1 % | 0.5 | 23990 / 24000 (**10 not counted**) |" in text
    assert f"The agent's jobs probe said `{ATTACHED}`." in text
    assert "```\ntracepoint:gpu_scheduler:drm_sched_job { @q[args.fence] = nsecs; }\n```" in text


def test_job_ratios_are_taken_round_by_round():
    text = report.render(JOBS, None)
    assert "| agent / none | 0.95x [0.95, 1.00] |" in text  # 0.95, 0.95, 1.00
    assert "| agent jobs off / none | 1.00x [1.00, 1.00] |" in text
    assert "| bpftrace / none | 0.98x [0.98, 0.98] |" in text
    assert "| agent / agent jobs off | 0.95x [0.95, 1.00] |" in text  # the jobs probe alone
    assert "| agent / bpftrace | 0.97x [0.97, 1.02] |" in text


def test_a_job_row_with_fewer_arms_or_no_probe_says_so():
    arms = JOBS["jobs"]["arms"]
    off = job_arm([1900, 2090, 1800], 0.02, [0] * 3, "GPU jobs off: needs CAP_SYS_ADMIN")
    some = {**JOBS, "jobs": {**JOBS["jobs"], "arms": {"none": arms["none"], "agent": off}}}
    text = report.render(some, None)
    assert "said `GPU jobs off: needs CAP_SYS_ADMIN` (**not attached**)." in text
    assert "| agent | 1900 | 2.0 % | 10.5 | 0 / 24000 (**24000 not counted**) |" in text
    assert "| agent / none |" in text
    assert "bpftrace" not in text  # no such arm in this run (KUBENPU_BENCH_JOB_ARMS)


def test_a_kernel_without_the_test_driver_skips_the_job_rows():
    skipped = {**JOBS, "jobs": {"skipped": "modprobe: FATAL: Module kubenpu_testdrm not found"}}
    text = report.render(skipped, None)
    assert "Not measured: the test driver did not load (modprobe: FATAL: Module" in text
    assert "jobs/s ratio" not in text


def guard_arm(open_close: list[float], drm: list[float], tcgets: list[float], counted=()) -> dict:
    """One arm of the access guard's row: ns per call per round, and the guard's allowed counts
    against the calls issued (none for no guard)."""
    issued = [{"open": 3003, "ioctl": 3000}] * len(counted)
    return {"open_close": open_close, "drm": drm, "tcgets": tcgets} | {
        "counted": list(counted),
        "issued": issued,
    }


ALL_ALLOWED = [{"open": 3003, "ioctl": 3000}] * 3
GUARD = {
    "kernel": "7.3.4+deb13-amd64",
    "cpus": 2,
    "guard": {
        "loop_calls": 1000,
        "open_loop_calls": 100,
        "rounds": 3,
        "loops_per_round": 3,
        "leftovers": [],
        "arms": {
            # The host drifts by round (4000, 4400, 3600 for an open with no guard).
            "none": guard_arm([4000, 4400, 3600], [2000, 2200, 1800], [900, 990, 810]),
            "audit": guard_arm(
                [4300, 4700, 3900], [2200, 2400, 2000], [900, 990, 810], ALL_ALLOWED
            ),
            "enforce": guard_arm(
                [4300, 4800, 3900],
                [2200, 2400, 2000],
                [910, 980, 810],
                [{"open": 3003, "ioctl": 2990}] * 3,
            ),
        },
    },
}


def test_guard_rows_give_each_mode_its_cost_against_no_guard_round_by_round():
    text = report.render(GUARD, None)
    assert "### The access guard: cost per call, paired by round" in text
    assert "3 rounds, each starting every arm afresh" in text
    assert "every arm started with no guard program of an earlier arm loaded" in text
    assert "| none (no guard) | 4000 |  | 2000 |  | 900 |  | - |" in text
    # open + close: +300 in every round; TCGETS: +0, the same each round
    audit = "| audit | 4300 | +300 [+300, +300] | 2200 | +200 [+200, +200] | 900 | +0 [+0, +0] |"
    assert audit + " open 9009 / 9009, ioctl 9000 / 9000 |" in text
    # enforce: +300, +400, +300 for the open; TCGETS +10, -10, 0: an interval around 0
    assert "| enforce | 4300 | +333 [+300, +400] |" in text
    assert "| 910 | +0 [-10, +10] |" in text
    assert "ioctl 8970 / 9000 (**30 not allowed**) |" in text


def test_a_guard_arm_beside_a_leftover_program_says_so():
    left = [{"round": 1, "arm": "audit", "programs": ["guard_file_open"]}]
    text = report.render({**GUARD, "guard": {**GUARD["guard"], "leftovers": left}}, None)
    assert "arms started beside a leftover: [{'round': 1, 'arm': 'audit'" in text


def test_a_guard_run_of_some_calls_shows_those_alone():
    """KUBENPU_BENCH_GUARD_CALLS=tcgets,fifo: the non-device calls only, no card counted."""
    arm = lambda tcgets, fifo: {"tcgets": tcgets, "fifo": fifo, "counted": [], "issued": []}  # noqa: E731
    arms = {"none": arm([900, 990], [700, 770]), "enforce": arm([950, 1040], [700, 770])}
    text = report.render({**GUARD, "guard": {**GUARD["guard"], "rounds": 2, "arms": arms}}, None)
    assert "| arm | TCGETS ns/call | added [95 %] | FIONREAD on a FIFO ns/call |" in text
    assert "| enforce | 995 | +50 [+50, +50] | 735 | +0 [+0, +0] | - |" in text
    assert "open + close ns/call" not in text
