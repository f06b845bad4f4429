"""The agent with exactly the capabilities the Helm chart grants for each probe.hook, on real
kernels in QEMU.

The guest (tests/vm/least_privilege_guest.py) runs the agent as uid 0 with every other capability
dropped from all sets, bounding included, and no_new_privs: what a container gets from
`drop: [ALL]` + `add: [...]` with allowPrivilegeEscalation: false. With the chart's set for a hook
it must load, attach and count exactly, 32-bit (compat) callers included; with one capability
fewer it must fail with its one-line error naming the missing capability, which proves the set
minimal. drm_ioctl's set (SYS_ADMIN) is also shown to be needed: BPF + PERFMON, which contain
every smaller set, fail. One boot per kernel runs both hooks. On a kernel booted without lockdown
one more run of the LSM hook with the chart's set and the default exit (probe.durations_exit
drm_ioctl), under perf_event_paranoid=2, the upstream default, must time every counted call at a
kretprobe on drm_ioctl (Debian's 3 refuses its perf event to CAP_PERFMON: the LSM hook's main run
keeps the syscall exit).

The same boot measures what fdinfo (config.fdinfo.enabled) adds (issue 10.6): reading
/proc/PID/fd needs DAC access to the directory (owned by the process's uid, mode 0500) and
readlink/fdinfo need ptrace-read access (PTRACE_MODE_READ_FSCREDS): another uid, or a target with
capabilities the reader lacks, needs CAP_SYS_PTRACE. tests/vm/fdinfo_privilege_guest.py scans a
uid-1000 holder and a root holder with every capability under each set of FDINFO_PLAN: the
chart's set must read both, and every set with one of fdinfo's capabilities fewer must not.
Kernels: KUBENPU_LEAST_PRIVILEGE_KERNELS (default "6.1 6.12 7.3 6.12-lockdown"); a name of
tests/vm/build.sh, + "-lockdown" to boot it with lockdown=confidentiality.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from guest import boot, kernel_matrix, matrix_kernel
from helpers import (
    by_reason,
    chart_capabilities,
    expected_counts,
    helm_values,
    ioctl_counts,
    otlp_counts,
    timed_calls_mismatches,
)

KERNELS = kernel_matrix("KUBENPU_LEAST_PRIVILEGE_KERNELS")
HOOKS = ("security_file_ioctl", "drm_ioctl")
# The agent's start-up line per hook (every kernel of the matrix has security_file_ioctl_compat).
ATTACHED = {
    "security_file_ioctl": "probe attached: fentry on "
    "security_file_ioctl+security_file_ioctl_compat (core)",
    "drm_ioctl": "probe attached: fentry-module on drm_ioctl (core)",
}
BPF_PERFMON = ["BPF", "PERFMON"]
# The LSM hook at the default exit, drm_ioctl's: without CAP_SYS_ADMIN (drm.ko's BTF) a kretprobe,
# whose perf event Debian's perf_event_paranoid=3 refuses to CAP_PERFMON, and lockdown's
# confidentiality mode refuses to all: this run sets the upstream default, 2, on kernels booted
# without lockdown.
KRETPROBE = "security_file_ioctl-kretprobe"

pytestmark = pytest.mark.vm


def refused_sets(chart: list[str]) -> dict[str, tuple[list[str], str]]:
    """Sets that must not attach, each with the capability its error must name: one fewer each,
    and BPF + PERFMON while the chart needs more. A set inside another refused set is left out
    (capabilities only ever allow more), which saves a start."""
    sets = {f"without-{c}": ([k for k in chart if k != c], c) for c in chart}
    if chart != BPF_PERFMON:
        sets["bpf-perfmon"] = (BPF_PERFMON, next(c for c in chart if c not in BPF_PERFMON))
    return {
        name: (caps, missing)
        for name, (caps, missing) in sets.items()
        if not any(set(caps) < set(other) for other, _ in sets.values())
    }


CHART_CAPS = {hook: chart_capabilities(hook) for hook in HOOKS}
REFUSED = {hook: refused_sets(CHART_CAPS[hook]) for hook in HOOKS}
REFUSED_RUNS = [(hook, name) for hook in HOOKS for name in REFUSED[hook]]


FDINFO_CHART = chart_capabilities("security_file_ioctl", fdinfo=True)
JOBS_CAPS = chart_capabilities("security_file_ioctl", jobs=True)  # config.probe.jobs: true
# The GPU jobs probe's flavour by capability set: its start-up line (docs/jobs.md).
JOBS_PLAN = {"chart": JOBS_CAPS, "SYS_ADMIN": ["SYS_ADMIN"]}
JOBS_ATTACHED = {
    "chart": "GPU jobs: attached (raw_tp drm_sched_job",
    "SYS_ADMIN": "GPU jobs: attached (tp_btf drm_sched_job",
}
JOBS_TIMEOUT = {
    "chart": "; raw_tp workqueue_execute_start)\n",
    "SYS_ADMIN": "; fentry drm_sched_job_timedout)\n",
}
FDINFO_EXTRA = [c for c in FDINFO_CHART if c not in CHART_CAPS["security_file_ioctl"]]
FDINFO_PLAN = {"fdinfo-chart": FDINFO_CHART} | {
    f"fdinfo-without-{c}": [k for k in FDINFO_CHART if k != c] for c in FDINFO_EXTRA
}


@pytest.fixture(scope="module", params=KERNELS)
def guest_out(request, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp(f"least-privilege-{request.param}")
    plan = []
    for hook in HOOKS:
        plan.append({"name": hook, "caps": CHART_CAPS[hook], "hook": hook, "scenario": True})
        plan += [
            {"name": f"{hook}-{name}", "caps": caps, "hook": hook, "attach": "fentry"}
            for name, (caps, _) in REFUSED[hook].items()
        ]
    if not matrix_kernel(request.param)[1]:  # no lockdown
        chart = CHART_CAPS["security_file_ioctl"]
        plan.append(
            {"name": KRETPROBE, "caps": chart, "hook": "security_file_ioctl", "scenario": True}
            | {"durations_exit": "", "paranoid": 2}
        )
    plan += [
        {"name": f"jobs-{name}", "caps": caps, "attach": "fentry", "jobs": True}
        for name, caps in JOBS_PLAN.items()
    ]
    plan.append({"name": "jobs-btf-check", "caps": JOBS_CAPS, "btf_check": True})
    plan += [{"name": name, "caps": caps, "fdinfo": True} for name, caps in FDINFO_PLAN.items()]
    (out / "plan.json").write_text(json.dumps(plan))
    kernel, extra = matrix_kernel(request.param)
    return boot(kernel, "/src/tests/vm/least_privilege.sh", out, *extra)


def _result(out: Path, name: str) -> dict:
    return json.loads((out / name / "result.json").read_text())


def _assert_only(caps: dict, granted: list[str]) -> None:
    """The agent process had `granted` and nothing else, in every set."""
    assert caps["CapEff"] == caps["CapPrm"] == caps["CapBnd"] == sorted(granted)
    assert caps["CapInh"] == caps["CapAmb"] == []
    assert caps["NoNewPrivs"] == "1"


def test_chart_default_is_the_least_privilege_hook():
    assert helm_values()["config"]["probe"]["hook"] == "security_file_ioctl"
    assert CHART_CAPS["security_file_ioctl"] == BPF_PERFMON


def test_gpu_jobs_add_no_capability_to_the_chart():
    assert JOBS_CAPS == CHART_CAPS["security_file_ioctl"] == BPF_PERFMON


@pytest.mark.parametrize("name", JOBS_PLAN)
def test_the_gpu_jobs_probe_attaches_with_the_charts_capabilities(guest_out, name):
    """With the test driver's scheduler ring loaded, the jobs probe attaches in its flavour:
    raw_tp with the chart's CAP_BPF + CAP_PERFMON, tp_btf with CAP_SYS_ADMIN; each with its
    ring-timeout program (the reset victims), and no error."""
    result = _result(guest_out, f"jobs-{name}")
    if result["testdrm_skipped"]:
        pytest.skip(f"no test driver, so no DRM GPU scheduler: {result['testdrm_skipped']}")
    _assert_only(result["caps"], JOBS_PLAN[name])
    assert JOBS_ATTACHED[name] in result["agent_log"]
    assert JOBS_TIMEOUT[name] in result["agent_log"]
    assert result["errors"] == []


def test_a_module_btf_without_the_schedulers_types_is_one_line(guest_out):
    """gpu_sched's BTF empty (the kernel's vmlinux BTF real): the load fails with libbpf's own
    words naming the scheduler's struct and member it could not relocate, in one line."""
    result = _result(guest_out, "jobs-btf-check")
    if result["testdrm_skipped"]:
        pytest.skip(f"no test driver, so no DRM GPU scheduler: {result['testdrm_skipped']}")
    said = result["said"]
    assert (result["rc"], said.count("\n")) == (0, 0), said
    assert said.startswith("loading the jobs object: "), said
    assert "failed to resolve CO-RE relocation" in said and "struct drm_" in said, said


@pytest.mark.parametrize("hook", HOOKS)
def test_agent_counts_exactly_with_chart_capabilities(guest_out, hook):
    result = _result(guest_out, hook)
    _assert_only(result["caps"], CHART_CAPS[hook])
    assert ATTACHED[hook] in result["agent_log"]
    expected, prom = expected_counts(result["expected"]), result["prometheus"]
    assert ioctl_counts(prom) == expected  # 64- and 32-bit callers
    assert otlp_counts(result["otlp"]) == expected
    assert by_reason(prom, "kubenpu_unattributed_calls_total") == result["expected_unattributed"]
    assert by_reason(prom, "kubenpu_events_dropped_total") == {}
    # every counted call timed, each failure counted by error, 32-bit callers included
    assert len(result["returns"]) > 5
    assert timed_calls_mismatches(result["durations"], result["returns"]) == []
    assert ioctl_counts(prom, "kubenpu_ioctl_duration_seconds_count") == expected  # on /metrics


def test_the_charts_capabilities_time_drm_calls_at_drm_ioctls_kretprobe(guest_out):
    """The chart's default: the LSM hook, CAP_BPF + CAP_PERFMON, probe.durations_exit
    drm_ioctl. fexit cannot reach drm.ko's BTF, so the agent ends calls at a kretprobe on
    drm_ioctl, and every counted call is timed exactly, 32-bit callers included."""
    if not (guest_out / KRETPROBE).exists():
        pytest.skip("lockdown=confidentiality refuses kprobes")
    result = _result(guest_out, KRETPROBE)
    _assert_only(result["caps"], CHART_CAPS["security_file_ioctl"])
    assert "counted calls timed at the exit of drm_ioctl (kretprobe)\n" in result["agent_log"]
    expected, prom = expected_counts(result["expected"]), result["prometheus"]
    assert ioctl_counts(prom) == expected
    assert len(result["returns"]) > 5
    assert timed_calls_mismatches(result["durations"], result["returns"]) == []
    assert ioctl_counts(prom, "kubenpu_ioctl_duration_seconds_count") == expected


@pytest.mark.parametrize(("hook", "name"), REFUSED_RUNS)
def test_agent_fails_with_fewer_capabilities(guest_out, hook, name):
    caps, missing = REFUSED[hook][name]
    result = _result(guest_out, f"{hook}-{name}")
    _assert_only(result["caps"], caps)
    assert (result["rc"], result["attached"]) == (2, False)
    (error,) = result["errors"]  # one line for the operator
    assert f"ERROR kubenpu: cannot attach to {hook}: core: " in error
    assert f"missing CAP_{missing}" in error


def _fdinfo_read(out: Path, name: str) -> dict:
    return json.loads((out / f"{name}.json").read_text())


def test_fdinfo_needs_ptrace_and_dac_read_search():
    assert FDINFO_EXTRA == ["DAC_READ_SEARCH", "SYS_PTRACE"]


def test_the_charts_capabilities_read_every_fdinfo_holder(guest_out):
    result = _fdinfo_read(guest_out, "fdinfo-chart")
    for who in ("uid1000", "root"):
        assert result[who]["drm_fds"] == 1, result
        assert "unreadable" not in result[who]["skipped"], result


def test_the_charts_capabilities_read_the_test_drivers_telemetry(guest_out):
    """sysfs and hwmon are world-readable: the chart's set reads the test driver's hwmon whole
    (power1_input 25 W, energy1_input, temp1_input, power1_cap), with nothing unreadable."""
    result = _fdinfo_read(guest_out, "fdinfo-chart")
    if result["testdrm_skipped"]:
        pytest.skip(f"no test driver: {result['testdrm_skipped']}")
    device = result["telemetry"]["platform:kubenpu_testdrm"]
    assert device["power_uw"] == 25_000_000
    assert device["energy_uj"] == 0  # energy1_input: no SUBMIT in this boot
    assert device["values"] == 4  # power1_input, power1_cap, temp1_input, in0_input
    assert "unreadable" not in device["skipped"], device


@pytest.mark.parametrize("name", [n for n in FDINFO_PLAN if n != "fdinfo-chart"])
def test_one_fdinfo_capability_fewer_cannot_read_them_all(guest_out, name):
    result = _fdinfo_read(guest_out, name)
    assert any(result[who]["skipped"].get("unreadable") for who in ("uid1000", "root")), result
