"""The agent under a reduced capability set, run as root inside the QEMU guest.

tests/vm/least_privilege.sh runs it; the host test writes /out/plan.json, a list of runs:
  {"name": DIR, "caps": ["BPF", ...], "hook": H, "scenario": true}  the e2e scenario (aggregate
                                                      mode), plus calls from a 32-bit drmcall
  {"name": DIR, "caps": [...], "hook": H, "attach": "fentry"}  does it attach? (or how it fails)
  {"name": DIR, "caps": [...], "btf_check": true}  the GPU jobs probe's start with a gpu_sched
                                                   BTF that lacks the scheduler's types
  {"name": NAME, "caps": [...], "fdinfo": true}  which DRM fdinfo can it read? (all of them run
                                                 by fdinfo_privilege_guest.measure, in one go)
Each run keeps uid 0 and only `caps` in every set (bounding too), with no inheritable or ambient
capabilities and no_new_privs: what runc gives a container with `drop: [ALL]`, `add: caps` and
allowPrivilegeEscalation: false. The capabilities the agent process really had are recorded.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path

import fdinfo_privilege_guest
from e2e_guest import Scenario, pods
from guestlib import (
    ATTACHED,
    CREATE_DUMB,
    PY,
    SLOW,
    SYNCOBJ_WAIT,
    TCGETS,
    VGEM_FENCE_ATTACH,
    Agent,
    Call,
    device_node,
    drmcall_argv,
    load_testdrm,
    reports,
    systemd_cgroup,
)

STATUS_FIELDS = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs")
# drmcall built with gcc -m32 (tests/vm/build.sh): its ioctls enter the kernel as compat calls.
DRMCALL32 = "/usr/local/bin/drmcall32"


def launcher(caps: list[str]) -> tuple[str, ...]:
    keep = ",".join(["-all", *(f"+{c.lower()}" for c in caps)])
    return (
        "setpriv",
        "--inh-caps=-all",
        "--ambient-caps=-all",
        f"--bounding-set={keep}",
        "--no-new-privs",
        "--",
    )


def _decode(mask: str) -> list[str]:
    """capsh --decode=0x...: '0x...=cap_bpf,cap_perfmon' -> ['BPF', 'PERFMON']."""
    out = subprocess.run(
        ["capsh", f"--decode={mask}"], check=True, capture_output=True, text=True
    ).stdout
    names = out.strip().partition("=")[2]
    return sorted(n.removeprefix("cap_").upper() for n in names.split(",") if n)


def process_caps(pid: int) -> dict:
    """The capability sets of the agent once setpriv has exec'd it (before that: setpriv's).
    /proc/PID/exe names the new program before execve installs its credentials, so until then
    the status still shows setpriv's: a permitted set wider than the bounding set it already
    lowered (one CI run read them). An exec'd program's permitted set is within its bounding
    set, so the read is retried until it is."""
    proc = Path(f"/proc/{pid}")
    deadline = time.monotonic() + 30 * SLOW
    while not _execd(proc, status := _status(proc)):
        if time.monotonic() > deadline:
            raise SystemExit(f"pid {pid} never became the agent: {status}")
        time.sleep(0.05)
    found = {f: status[f].strip() for f in STATUS_FIELDS}
    return {f: (v if f == "NoNewPrivs" else _decode(v)) for f, v in found.items()}


def _status(proc: Path) -> dict[str, str]:
    text = (proc / "status").read_text()
    return dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)


def _execd(proc: Path, status: dict[str, str]) -> bool:
    if not (proc / "exe").resolve().name.startswith("python"):
        return False
    return int(status["CapPrm"], 16) & ~int(status["CapBnd"], 16) == 0


class LeastPrivilegeScenario(Scenario):
    loader = "core"  # what the chart renders by default (no BCC fallback)
    jobs = False  # the GPU jobs probe has runs of its own (tests/test_least_privilege_vm.py)
    # Without CAP_SYS_ADMIN fexit on drm_ioctl (the default exit) is out of reach on the LSM hook,
    # and its kretprobe is refused under Debian's perf_event_paranoid=3: the syscall's return is
    # the exit these capabilities time every counted call at. A plan run's `durations_exit` ""
    # (the default) with `paranoid` 2 (the upstream default) times them at the kretprobe.
    durations_exit = "syscall"

    def __init__(self, out: Path, caps: list[str], hook: str) -> None:
        super().__init__(out, "aggregate")
        self.launcher = launcher(caps)
        self.hook = hook

    def run(self) -> dict:
        # The other hook's run in this boot left pod A's cgroup behind; the scenario makes it.
        with contextlib.suppress(FileNotFoundError):
            systemd_cgroup(pods(self.mode)[0]).rmdir()
        return super().run()

    def workload(self, pod: dict | None, cgroup: Path, vgem_scale: int, virtio_scale: int) -> None:
        """The e2e workload, then the same kinds from a 32-bit process (compat ioctls)."""
        super().workload(pod, cgroup, vgem_scale, virtio_scale)
        vg = device_node(self.vgem, "card")
        calls = [
            Call.drm(vg, CREATE_DUMB, 3 * vgem_scale),
            Call.drm(vg, VGEM_FENCE_ATTACH, 2 * vgem_scale),
            Call.drm(vg, SYNCOBJ_WAIT, 1 * vgem_scale),
            Call(vg, TCGETS, 64, 3, raw=True),  # not a DRM ioctl: not counted
        ]
        argv = [DRMCALL32, *drmcall_argv(calls, cgroup)[1:]]
        done = subprocess.run(argv, check=True, capture_output=True, text=True)
        self.returns.add(cgroup, calls, reports(done.stdout, calls))
        self.expect(pod, self.vgem, "alloc", 3 * vgem_scale)
        self.expect(pod, self.vgem, "submit", 2 * vgem_scale)
        self.expect(pod, self.vgem, "wait", 1 * vgem_scale)

    def start_agent(self) -> Agent:
        agent = super().start_agent()
        self.caps = process_caps(agent.pid)
        return agent


def scenario(out: Path, plan: dict, testdrm_skipped: str) -> dict:
    run = LeastPrivilegeScenario(out, plan["caps"], plan["hook"])
    run.durations_exit = plan.get("durations_exit", run.durations_exit)
    paranoid = Path("/proc/sys/kernel/perf_event_paranoid")
    before = paranoid.read_text()
    paranoid.write_text(str(plan.get("paranoid", before.strip())))
    try:
        return {**run.run(), "caps": run.caps, "testdrm_skipped": testdrm_skipped}
    finally:
        paranoid.write_text(before)


def attach_check(
    out: Path, launch: tuple[str, ...], attach: str, hook: str | None = None, jobs: bool = False
) -> dict:
    """Start the agent under `launch` (no exporters, no CRI) until it attaches or exits; record
    which, with its exit code and the capabilities it had. `hook` None: the agent's default. The
    loader is the chart's default (core), but for the kprobe attach, which only BCC has. With
    `jobs` (probe.jobs) it waits for the GPU jobs probe's line too."""
    probe = {"attach": attach, "jobs": jobs, **({"hook": hook} if hook else {})}
    probe["loader"] = "bcc" if attach == "kprobe" else "core"
    config = {"probe": probe, "export": {"prometheus": {"enabled": False}}}
    agent = Agent(out, config, launcher=launch)
    found = process_caps(agent.pid)
    agent.wait_attached()
    deadline = time.monotonic() + 60 * SLOW
    while jobs and "GPU jobs" not in agent.log() and time.monotonic() < deadline:
        time.sleep(0.5)
    rc = agent.stop()
    text = agent.log()
    return {
        "rc": rc,
        "caps": found,
        "attached": ATTACHED in text,
        "errors": [line for line in text.splitlines() if " ERROR " in line],
        "agent_log": text,
    }


# The jobs probe's start (kubenpu.kernel.jobs) against a sysfs BTF directory whose gpu_sched is
# empty split BTF over the real vmlinux: its one-line error, printed.
_BTF_CHECK = """
import shutil, struct, sys
from pathlib import Path
from kubenpu.kernel import btf
from kubenpu.kernel.errors import ProbeError
from kubenpu.kernel.jobs import JobsKernel
root = Path(sys.argv[1])
shutil.copy("/sys/kernel/btf/vmlinux", root / "vmlinux")
(root / "gpu_sched").write_bytes(btf.HEADER.pack(btf.MAGIC, 1, 0, 24, 0, 0, 0, 1) + bytes(1))
try:
    print("started: " + JobsKernel(btf_root=root).start())
except ProbeError as err:
    print(err)
"""


def btf_check(out: Path, launch: tuple[str, ...]) -> dict:
    """What the jobs probe says, under `launch`, when the module's BTF lacks its types."""
    root = Path("/tmp/btf-check")
    root.mkdir(exist_ok=True)
    done = subprocess.run(
        [*launch, PY, "-c", _BTF_CHECK, str(root)], capture_output=True, text=True, check=False
    )
    (out / "btf-check.log").write_text(done.stdout + done.stderr)
    return {"said": done.stdout.strip(), "rc": done.returncode}


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "/out")
    plan = json.loads((out / "plan.json").read_text())
    # Loaded first: its DRM GPU scheduler ring is what the agent's jobs probe attaches to.
    testdrm_skipped = load_testdrm()
    for run in (r for r in plan if not r.get("fdinfo")):
        where = out / run["name"]
        where.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        if run.get("scenario"):
            result = scenario(where, run, testdrm_skipped)
        elif run.get("btf_check"):
            result = btf_check(where, launcher(run["caps"])) | {"testdrm_skipped": testdrm_skipped}
        else:
            launch = launcher(run["caps"])
            attach = run.get("attach", "auto")
            result = attach_check(where, launch, attach, run.get("hook"), run.get("jobs", False))
            result["testdrm_skipped"] = testdrm_skipped
        result["seconds"] = time.monotonic() - started
        (where / "result.json").write_text(json.dumps(result, indent=1, sort_keys=True))
        print(f"least privilege {run['name']} ({','.join(run['caps'])}): {result['seconds']:.0f}s")
    fdinfo_privilege_guest.measure(out, [r for r in plan if r.get("fdinfo")], launcher)
    return 0


if __name__ == "__main__":
    sys.exit(main())
