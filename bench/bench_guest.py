"""The benchmark, run as root inside the QEMU guest (bench/bench.sh; bench/check.sh for --check).

    bench_guest.py OUT_DIR            the full benchmark; writes OUT_DIR/bench.json
    bench_guest.py OUT_DIR --check    only the max-rate exactness bursts; writes OUT_DIR/check.json
    bench_guest.py OUT_DIR --hooks    only the per-hook ioctl cost; writes OUT_DIR/bench.json
    bench_guest.py OUT_DIR --restart  only the restart rows; writes OUT_DIR/bench.json
    bench_guest.py OUT_DIR --where    where the per-call time goes; writes OUT_DIR/where.json
    bench_guest.py OUT_DIR --jobs     only the GPU jobs row; writes OUT_DIR/bench.json
    bench_guest.py OUT_DIR --guard    only the access guard's row; writes OUT_DIR/bench.json

Every figure comes from one boot, measured side by side: tight loops of counted ioctls with the
static C `drmcall` (no agent, then the agent in each probe mode), the agent's CPU from
/proc/PID/stat at paced rates, counted + dropped against issued after every burst, the time from
start to the first metric and the agent's RSS with 1,000 pods' worth of kubelet-style cgroups,
and what each probe.hook adds to a non-DRM ioctl (TCGETS on a pty, which the security_file_ioctl
hook sees as well) and to a counted DRM one, and restarts with the probe pinned in bpffs
(docs/pinning.md): a cold start whose loader child compiles, then a SIGKILL under a paced load and
a restart that adopts the pins: time to the first metric, RSS, and calls lost across it.
The GPU jobs row: jobs/s through the test driver's ring on the real DRM GPU scheduler
(tests/vm/kmod) with no agent, the agent, the agent without its jobs probe, and a bpftrace
one-liner on the scheduler's tracepoints that records the same timestamps.
The access guard's row (docs/guard.md): an allowed open + close and an allowed DRM ioctl on
vgem's card, TCGETS on a pty (a char device the guard does not guard) and FIONREAD on a FIFO (no
device), with no guard, the guard in audit and in enforce, paired by round.
The floor: a bpftrace one-liner that counts per cgroup and ioctl request in the kernel and does
nothing in user space (Bpftrace), run through the same phases in the same boot.
It plays kubelet and the runtime as tests/vm/e2e_guest.py does, with the same guest helpers
(tests/vm/guestlib.py).
bench/report.py turns the JSON into the table.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "vm"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from cri_server import CriTestServer
from guard_guest import Agent as GuardAgent
from guard_guest import guard_programs
from guestlib import (
    ATTACH_TIMEOUT,
    CREATE_DUMB,
    DRMCALL,
    MODES,
    PROMETHEUS,
    PY,
    TCGETS,
    TESTDRM,
    TESTDRM_JOB_0,
    Agent,
    Call,
    add_container,
    by_reason,
    device_node,
    drmcall_argv,
    load_testdrm,
    reports,
    scrape,
    systemd_cgroup,
)
from least_privilege_guest import launcher

from kubenpu.discovery import discover
from kubenpu.kernel import guard as g
from kubenpu.kernel.abi import JOB_TRACEPOINTS
from kubenpu.sources.jobs import FIRST_CHECK_SECONDS

CRI_SOCKET = "/run/kubenpu-bench-cri.sock"
SETTLE_TIMEOUT = 180
# No change in counted + dropped for this long: the agent will not account for more. Long,
# because the agent resolves every new pod (a CRI request each) before it counts their calls.
QUIET_SECONDS = 30
TICK = os.sysconf("SC_CLK_TCK")

PODS = 1000  # pods' worth of cgroups for the start and RSS figures
TOUR_CALLS = 3  # calls made from each of those pods
REPEATS = 5  # tight loops per phase, for the median
HOOK_ROUNDS = 6  # interleaved rounds of the per-call table (--rounds): arms paired by round
LOOPS_PER_ROUND = 3  # tight loops of each call per arm and round; the round's figure: their median
SETTLE_WINDOW = 1.0  # seconds: an arm's process is settled once it uses
SETTLED_CPU = 0.05  # at most this share of a vCPU over a window
LOOP_SECONDS = 1.0  # target length of one tight loop
WINDOW_SECONDS = 5.0  # length of one paced-rate window
IDLE_SECONDS = 5.0
IDLE_AFTER_TOUR = 6  # windows of IDLE_SECONDS after the pod tour; the last 3's median is the figure
CHECK_CALLS = 60_000  # per process, in --check
HOOKS = ("security_file_ioctl", "drm_ioctl")  # probe.hook
PTY = "/dev/ptmx"  # each open makes a new pty master: TCGETS on it is a plain tty ioctl
BPFTRACE = "/usr/bin/bpftrace"  # Debian's, in the guest root (tests/vm/build.sh)
DRM_MAJOR = 226
# The floor, per probe.hook: count per cgroup and request, as KubeNPU's program does per cgroup,
# device and kind. On security_file_ioctl it keeps DRM character devices only (major 226), the
# cheapest stand-in for KubeNPU's device-table lookup; drm_ioctl sees DRM calls only. BEGIN runs
# once every probe is attached, so its line marks the moment calls start being counted.
ONE_LINERS = {
    "security_file_ioctl": "fentry:vmlinux:security_file_ioctl"
    f" /args.file->f_inode->i_rdev >> 20 == {DRM_MAJOR}/ {{ @[cgroup, args.cmd] = count(); }}",
    "drm_ioctl": "fentry:drm:drm_ioctl { @[cgroup, args.cmd] = count(); }",
}
# The floor of call durations (docs/latency.md): the same counts, plus an entry timestamp per
# thread and a histogram at the exit KubeNPU uses. The exit leaves at the type test first, as
# KubeNPU's does, so other ioctls pay what KubeNPU's make them pay.
TIMED_ONE_LINERS = {
    "security_file_ioctl": ONE_LINERS["security_file_ioctl"].replace(
        "count(); }", "count(); @start[tid] = nsecs; }"
    )
    + " fexit:vmlinux:__x64_sys_ioctl /((args.regs->si >> 8) & 0xff) == 100 && @start[tid]/"
    " { @ns = hist(nsecs - @start[tid]); delete(@start[tid]); }",
    "drm_ioctl": ONE_LINERS["drm_ioctl"].replace("count(); }", "count(); @start[tid] = nsecs; }")
    + " fexit:drm:drm_ioctl /@start[tid]/"
    " { @ns = hist(nsecs - @start[tid]); delete(@start[tid]); }",
}
# The timed floor of the default (probe.durations_exit: drm_ioctl): the LSM hook's count and entry
# timestamp, the histogram at drm_ioctl's exit, which DRM calls alone pass.
TIMED_AT_DRM_IOCTL = ONE_LINERS["security_file_ioctl"].replace(
    "count(); }", "count(); @start[tid] = nsecs; }"
) + (" fexit:drm:drm_ioctl /@start[tid]/ { @ns = hist(nsecs - @start[tid]); delete(@start[tid]); }")
# The agent's default sources besides the calls, each off: what the per-source rows turn on alone.
SOURCES_OFF = {
    "fdinfo": {"fdinfo": {"enabled": False}},
    "telemetry": {"telemetry": {"enabled": False}},  # uevents too: they are telemetry's
    "jobs": {"probe": {"jobs": False}},
}
BPFTRACE_ATTACHED = "bpftrace attached"
PIN_DIR = "/sys/fs/bpf/kubenpu-bench"  # probe.pin_dir of the restart rows
RESTART_RATE = 2000  # calls/s of the paced load across the restart
RESTART_LOAD_SECONDS = 20
RESTART_KILL_AFTER = 5  # seconds into the load
# bpftool, for what is attached and each program's run time: the guest root has none, so
# bench/run.sh copies the host's into OUT (its libraries are in the root); else the PATH's.
BPFTOOL = ("/out/bpftool", "bpftool")
BPF_STATS = Path("/proc/sys/kernel/bpf_stats_enabled")
WAKEUP_SECONDS = 10  # the window over which an idle process's context switches are counted
JOB_ROUNDS = 3  # interleaved rounds of the jobs row, each starting every arm afresh
JOB_BURSTS = 2  # bursts of jobs per arm and round; the round's figure: their median
JOB_SECONDS = 2.0  # target length of one burst
# Jobs per drmcall step (an open, the jobs, a close that waits for them): jobs in flight stay
# under this, within the agent's fence table (16,384) and bpftrace's maps (4,096 keys each).
JOBS_PER_STEP = 1000
JOBS_COUNTED_TIMEOUT = 60  # seconds for the agent's /metrics to show a round's jobs
GPU_SCHEDULER_EVENTS = Path("/sys/kernel/tracing/events/gpu_scheduler")
OPENCLOSE = "/usr/local/bin/openclose"  # tests/vm/src/openclose.c: opens cannot be timed by drmcall
# No guard loaded, then the guard in each mode (open + receive hooks, the default), then enforce
# with guard.ioctl (the ioctl hooks too): arm -> (mode, ioctl).
GUARD_ARMS = {
    "none": None,
    "audit": ("audit", False),
    "enforce": ("enforce", False),
    "enforce, ioctl: true": ("enforce", True),
}
GUARD_FAIL_OPEN_SECONDS = 30.0  # never reached: the guard's agent beats every 0.5 s
OPENS_PER_IOCTL_LOOP = 0.1  # an open + close of a DRM node costs several ioctls: shorter loops
FIFO = Path("/tmp/kubenpu-bench-fifo")  # FIONREAD on it: an ioctl on no device at all
FIONREAD = 0x541B


def pod(i: int, namespace: str, name: str) -> dict:
    return {
        "id": f"{i:064x}",
        "namespace": namespace,
        "pod": name,
        "container": "main",
        "pod_uid": f"00000000-0000-4000-8000-{i:012x}",
    }


LOADER = pod(PODS + 1, "bench", "loader")  # runs every drmcall loop; pods are 1..PODS


# --- the guest's side of things --------------------------------------------------------------


def vgem_card() -> str:
    return device_node(next(d for d in discover("/") if d.vendor == "vgem"), "card")


def pin(cpu: int) -> Callable[[], None]:
    """A preexec_fn that pins the child to `cpu` before exec."""
    return lambda: os.sched_setaffinity(0, {cpu})


def drmcall(
    card: str, cgroup: Path, count: int, procs: int = 1, rate: float = 0
) -> tuple[int, float]:
    """`procs` concurrent drmcall loops of `count` counted calls each, one per CPU.
    Returns (calls issued, seconds of the slowest loop)."""
    calls = [Call.drm(card, CREATE_DUMB, count)]  # core ioctl, kind alloc: counted everywhere
    argv = drmcall_argv(calls, cgroup, rate / procs)
    ncpu = os.cpu_count() or 1
    running = [
        subprocess.Popen(
            argv, stdout=subprocess.PIPE, text=True, preexec_fn=pin(i % ncpu) if procs > 1 else None
        )
        for i in range(procs)
    ]
    issued, seconds = 0, 0.0
    for p in running:
        out, _ = p.communicate()
        if p.returncode != 0:
            raise SystemExit(f"drmcall failed ({p.returncode})")
        (step,) = reports(out, calls)
        issued += step["calls"]
        seconds = max(seconds, step["seconds"])
    return issued, seconds


def make_pods(cri: CriTestServer, n: int) -> list[Path]:
    """n pods with one container each: CRI knows them, and their cgroups exist."""
    cgroups = []
    for i in range(n):
        p = pod(i + 1, "bench-pods", f"pod-{i + 1}")
        add_container(cri, p)
        cg = systemd_cgroup(p)
        cg.mkdir(parents=True, exist_ok=True)
        cgroups.append(cg)
    return cgroups


def tour(card: str, cgroups: list[Path], calls: int) -> int:
    """One drmcall visits every cgroup and makes `calls` counted calls in each (a process per
    pod would cost ~0.1 s of exec each under TCG). Returns the calls issued."""
    call = Call.drm(card, CREATE_DUMB, calls)
    argv = [DRMCALL]
    for cgroup in cgroups:
        argv += ["--cgroup", str(cgroup), *call.args()]
    out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    return sum(step["calls"] for step in reports(out, [call] * len(cgroups)))


def drm_iowr(nr: int, size: int) -> int:
    """The ioctl request DRM_IOWR(nr, size), as the kernel sees it."""
    return (3 << 30) | (size << 16) | (ord("d") << 8) | nr


def job_one_liner() -> str:
    """The jobs' floor: a bpftrace one-liner on the scheduler's tracepoints (the kernel's set,
    as the agent picks it: kubenpu.kernel.abi.JOB_TRACEPOINTS) that keeps what the agent's jobs
    probe keeps, in the kernel: the queue time and cgroup of each job keyed by its fence, the
    run time, then per cgroup the wait and run histograms and the jobs done. 6.17 on names a
    fence by context and seqno, older kernels by its address."""
    names = next(
        (
            [tp for tp, _ in steps]
            for steps in JOB_TRACEPOINTS
            if all((GPU_SCHEDULER_EVENTS / tp).is_dir() for tp, _ in steps)
        ),
        None,
    )
    if names is None:
        raise SystemExit(f"no set of {JOB_TRACEPOINTS} in {GPU_SCHEDULER_EVENTS}")
    formats = [(GPU_SCHEDULER_EVENTS / tp / "format").read_text() for tp in names]
    by_seqno = all(" fence_seqno;" in f for f in formats)
    if not by_seqno and not all(" fence;" in f for f in formats):
        raise SystemExit(f"no fence field common to {names}")
    k = "args.fence_context, args.fence_seqno" if by_seqno else "args.fence"
    queued, run, done = (f"tracepoint:gpu_scheduler:{tp}" for tp in names)
    return (
        f"{queued} {{ @q[{k}] = nsecs; @cg[{k}] = cgroup; }} "
        f"{run} /@q[{k}]/ {{ @wait[@cg[{k}]] = hist(nsecs - @q[{k}]); delete(@q[{k}]);"
        f" @r[{k}] = nsecs; }} "
        f"{done} /@r[{k}]/ {{ @run[@cg[{k}]] = hist(nsecs - @r[{k}]);"
        f" @done[@cg[{k}]] = count(); delete(@r[{k}]); delete(@cg[{k}]); }}"
    )


def jobs_done(log: str, cgroup: Path) -> int:
    """The jobs the jobs one-liner saw done for `cgroup`, from the maps it printed on exit."""
    found = re.search(rf"^@done\[{cgroup_id(cgroup)}\]: (\d+)$", log, re.M)
    return int(found[1]) if found else 0


def agent_jobs() -> int:
    """GPU jobs done on the test driver's ring, from the agent's /metrics."""
    samples = scrape(timeout=30).get("kubenpu_jobs_total", [])
    return int(sum(s["value"] for s in samples if s["labels"].get("device") == TESTDRM))


def open_close(card: str, cgroup: Path, count: int) -> float:
    """One tight loop of `count` opens and closes of `card` from `cgroup`: ns per open + close.
    Every open must succeed (the guard's arms allow it)."""
    argv = [OPENCLOSE, "--cgroup", str(cgroup), card, str(count)]
    report = json.loads(subprocess.run(argv, check=True, capture_output=True, text=True).stdout)
    if report["calls"] != count or report["errnos"]:
        raise SystemExit(f"openclose did not do what was asked: {report}")
    return round(report["seconds"] / count * 1e9, 1)


def allowed_tallies(tallies: list, cgroup: int) -> dict[str, int]:
    """The guard's `allowed` counts of `cgroup`, by operation, from its agent's tallies (rows of
    cgroup id, dev_t, operation, verdict, count)."""
    found = dict.fromkeys(g.OPERATIONS, 0)
    for c, _, op, verdict, n in tallies:
        if c == cgroup and verdict == "allowed":
            found[op] += n
    return found


def cgroup_id(cgroup: Path) -> int:
    """bpf_get_current_cgroup_id() of a process in `cgroup`: the directory's inode number."""
    return cgroup.stat().st_ino


def bpftool_path() -> str | None:
    return next((t for t in BPFTOOL if shutil.which(t)), None)


def bpftool(*args: str) -> list[dict]:
    """`bpftool -j ARGS`, parsed; [] where no bpftool is found."""
    tool = bpftool_path()
    if tool is None:
        return []
    out = subprocess.run([tool, "-j", *args], check=True, capture_output=True, text=True).stdout
    return json.loads(out or "[]")


def tracing() -> dict[int, dict]:
    """The tracing programs loaded (fentry, fexit, tp_btf: every one sits on a trampoline or a
    tracepoint of the ioctl path or cgroup_mkdir), by id: name, instructions translated and,
    with kernel.bpf_stats_enabled, run count and run time."""
    return {
        p["id"]: {
            "name": p.get("name", ""),
            "xlated_bytes": p.get("bytes_xlated", 0),
            "insns": p.get("bytes_xlated", 0) // 8,
            "run_cnt": p.get("run_cnt", 0),
            "run_time_ns": p.get("run_time_ns", 0),
        }
        for p in bpftool("prog", "show")
        if p.get("type") == "tracing"
    }


def attached() -> list[dict]:
    """The tracing links (every fentry/fexit/tp_btf attachment): program id and attach type."""
    return [
        {"prog_id": link.get("prog_id"), "attach_type": link.get("attach_type", "")}
        for link in bpftool("link", "show")
        if link.get("type") == "tracing"
    ]


def switches(pid: int) -> dict[str, int]:
    """Context switches (voluntary + involuntary) of each of the process's threads, by name."""
    found: Counter[str] = Counter()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            status = (task / "status").read_text()
        except OSError:
            continue  # the thread ended meanwhile
        found[name] += sum(
            int(line.split()[1]) for line in status.splitlines() if "ctxt_switches" in line
        )
    return dict(found)


# --- the agent ---------------------------------------------------------------------------------


class Usage:
    """CPU and memory of the process `pid`, from /proc."""

    pid: int

    def cpu_seconds(self) -> float:
        """utime + stime of all the process's threads."""
        stat = Path(f"/proc/{self.pid}/stat").read_text()
        fields = stat.rsplit(")", 1)[1].split()  # the name may hold spaces
        return (int(fields[11]) + int(fields[12])) / TICK

    def settle(self, timeout: float = 60) -> None:
        """Wait until the process is idle (its start's work done): both vCPUs share one host
        thread under TCG, so CPU it burns during a loop is taken from the loop."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            before = self.cpu_seconds()
            time.sleep(SETTLE_WINDOW)
            if self.cpu_seconds() - before <= SETTLED_CPU * SETTLE_WINDOW:
                return
        print(f"  {self.pid} still busy after {timeout} s; measuring anyway", flush=True)

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise SystemExit(f"no VmRSS for {self.pid}")


class Measured(Agent, Usage):
    """One agent process with Prometheus export only (no OTLP push in the measured CPU), and
    its CPU and memory."""

    def __init__(
        self,
        out: Path,
        mode: str,
        hook: str | None = None,
        pin_dir: str = "",
        loader: str = "auto",
        durations: bool = True,
        durations_exit: str = "",
        extra: dict | None = None,
        name: str = "",
        launcher: Sequence[str] = (),
    ) -> None:
        self.mode = mode
        probe = {"mode": mode, "pin_dir": pin_dir, "loader": loader, "durations": durations}
        probe |= {"durations_exit": durations_exit} if durations_exit else {}
        config = {
            "probe": {**probe, **({"hook": hook} if hook else {})},
            # The CRI test server shares the guest's emulated CPUs with the agent and the load:
            # give it longer than a real runtime needs.
            "attribution": {"cri": {"endpoint": f"unix://{CRI_SOCKET}", "timeout_seconds": 15}},
            "export": {"prometheus": PROMETHEUS, "otlp": {"enabled": False}},
        }
        for key, value in (extra or {}).items():
            config[key] = {**config.get(key, {}), **value}
        self.jobs = config["probe"].get("jobs", True)
        parts = ("agent", mode, *([hook] if hook else []), *(["pinned"] if pin_dir else []))
        parts += (loader,) if loader != "auto" else ()
        parts += () if durations else ("untimed",)
        parts += (durations_exit,) if durations_exit else ()
        parts += (name,) if name else ()
        super().__init__(out, config, name="-".join(parts), launcher=launcher)
        self.attach()

    def settle(self, timeout: float = 60) -> None:
        """Settled after the jobs source's first look for the GPU scheduler too (its "GPU jobs"
        line): a pass over kallsyms FIRST_CHECK_SECONDS after its thread starts, behind the
        imports, which an idle window must not hold."""
        deadline = time.monotonic() + timeout + FIRST_CHECK_SECONDS
        while self.jobs and "GPU jobs" not in self.log_file.read_text():
            if time.monotonic() > deadline:
                print(f"  {self.log_file.name}: no GPU jobs line; settling anyway", flush=True)
                break
            time.sleep(0.5)
        super().settle(timeout)

    def jobs_probe(self) -> str:
        """The jobs source's line saying how its probe attached, or why not ("" before it
        looked): the flavour the agent picked, whatever bpf/jobs.bpf.c offers."""
        found = re.findall(r"GPU jobs[^\n]*", self.log_file.read_text())
        return found[-1] if found else ""


class Bpftrace(Usage):
    """The floor: bpftrace running ONE_LINERS[hook], started and attached. Its map is read once,
    when it stops: bpftrace prints it on SIGINT."""

    def __init__(
        self, out: Path, hook: str, programs: dict[str, str] = ONE_LINERS, name: str = ""
    ) -> None:
        timed = "-timed" if programs is not ONE_LINERS else ""
        self.log_file = out / f"bpftrace{timed}-{hook}{name}.log"
        program = f'BEGIN {{ printf("{BPFTRACE_ATTACHED}\\n"); }} {programs[hook]}'
        self.started = time.monotonic()
        with open(self.log_file, "w") as log:
            self.proc = subprocess.Popen(
                [BPFTRACE, "-e", program], stdout=log, stderr=subprocess.STDOUT
            )
        self.pid = self.proc.pid
        self.attach_seconds = self.attach()

    def attach(self) -> float:
        """Seconds from start until every probe is attached (BEGIN has run)."""
        while BPFTRACE_ATTACHED not in self.log_file.read_text():
            if self.proc.poll() is not None or time.monotonic() - self.started > ATTACH_TIMEOUT:
                self.proc.kill()
                raise SystemExit(f"bpftrace did not attach; see {self.log_file}")
            time.sleep(0.1)
        return time.monotonic() - self.started

    def stop(self) -> Counter[tuple[int, int]]:
        """Stop bpftrace; its counts per (cgroup id, ioctl request)."""
        self.proc.send_signal(signal.SIGINT)
        if self.proc.wait(timeout=120) != 0:
            raise SystemExit(f"bpftrace failed ({self.proc.returncode}); see {self.log_file}")
        found = re.findall(r"^@\[(\d+), (\d+)\]: (\d+)$", self.log_file.read_text(), re.M)
        return Counter({(int(cg), int(cmd)): int(n) for cg, cmd, n in found})


class Scrape:
    """What /metrics says: calls counted per namespace, drops per reason, ioctl series."""

    def __init__(self) -> None:
        samples = scrape(timeout=30)
        ioctls = samples.get("kubenpu_ioctl_total", [])
        self.counted: Counter[str] = Counter()
        for s in ioctls:
            self.counted[s["labels"].get("namespace", "")] += int(s["value"])
        self.dropped = Counter(
            {r: int(n) for r, n in by_reason(samples, "kubenpu_events_dropped_total").items()}
        )
        self.series = len(ioctls)

    def seen(self) -> int:
        """Every call accounted for: counted or reported dropped."""
        return sum(self.counted.values()) + sum(self.dropped.values())


class Ledger:
    """Issued calls against what the agent accounts for, burst by burst."""

    def __init__(self) -> None:
        self.last = Scrape()

    def settle(self, issued: int) -> dict:
        """Wait until the agent accounts for `issued` more calls (or stays quiet), then return
        the burst's record: issued, counted, dropped by reason, and the seconds it took."""
        start = time.monotonic()
        want = self.last.seen() + issued
        seen, changed = -1, start
        while True:
            now = Scrape()
            if now.seen() != seen:
                seen, changed = now.seen(), time.monotonic()
            t = time.monotonic()
            if seen >= want or t - changed > QUIET_SECONDS or t - start > SETTLE_TIMEOUT:
                break
            time.sleep(1)
        before, self.last = self.last, now
        dropped = {r: now.dropped[r] - before.dropped[r] for r in now.dropped}
        return {
            "issued": issued,
            "counted": sum(now.counted.values()) - sum(before.counted.values()),
            "dropped": {r: n for r, n in dropped.items() if n},
            "settle_seconds": round(time.monotonic() - start, 2),
        }


def counted(counts: Counter[tuple[int, int]], cgroups: list[Path]) -> int:
    """What a bpftrace map holds for the benchmark's call from `cgroups`."""
    request = drm_iowr(*CREATE_DUMB)
    return sum(counts[cgroup_id(cg), request] for cg in cgroups)


def exact(record: dict) -> bool:
    return record["counted"] + sum(record["dropped"].values()) == record["issued"]


# --- the measurements --------------------------------------------------------------------------


class Bench:
    def __init__(self, out: Path, rounds: int = HOOK_ROUNDS, start_idle: bool = False) -> None:
        self.out = out
        self.rounds = rounds  # of the per-call table
        # --start-idle: the rounds run the default agent and the one-liner without the per-call
        # loops, and the per-source rows are left out (start, idle and idle with PODS pods only)
        self.start_idle = start_idle
        self.card = vgem_card()
        self.loader = systemd_cgroup(LOADER)
        self.loader.mkdir(parents=True, exist_ok=True)
        self.cri = CriTestServer()
        self.cri.start(CRI_SOCKET)
        add_container(self.cri, LOADER)

    def loops(self, count: int) -> list[float]:
        """REPEATS tight loops; ns per call of each."""
        return [round(s / n * 1e9, 1) for n, s in (self.burst(count) for _ in range(REPEATS))]

    def burst(self, count: int, procs: int = 1, rate: float = 0) -> tuple[int, float]:
        return drmcall(self.card, self.loader, count, procs, rate)

    def tight(self, call: Call) -> float:
        """One tight loop of `call` in the loader's cgroup: ns per call."""
        out = subprocess.run(
            drmcall_argv([call], self.loader), check=True, capture_output=True, text=True
        ).stdout
        (step,) = reports(out, [call])
        return round(step["seconds"] / step["calls"] * 1e9, 1)

    def hooks(self, count: int) -> dict:
        """ns per call of TCGETS on a pty and of a counted DRM call under each arm (hook_arms()),
        HOOK_ROUNDS rounds, each starting every arm afresh, in an order reversed every other
        round: each arm's figure of round r is the median of LOOPS_PER_ROUND loops of each
        call, so a difference between two arms is taken round by round and drift of the host
        cancels. Before each arm starts, the bench checks with bpftool that no tracing program
        of an earlier arm is still loaded; each arm's idle CPU and context switches are read
        over IDLE_SECONDS after it settles, and the default agent's start → first metric and
        each one-liner's start → attached in every round."""
        calls = {
            "tcgets": Call(PTY, TCGETS, 64, count, raw=True),
            "drm": Call.drm(self.card, CREATE_DUMB, count),
        }
        arms = self.hook_arms()
        if only := os.environ.get("KUBENPU_BENCH_ARMS"):  # e.g. "none,agent untimed,bpftrace"
            arms = {a: arms[a] for a in only.split(",")}
        baseline = set(tracing())
        found: dict[str, dict[str, list]] = {
            a: {**{c: [] for c in calls}, "idle": [], "switches": [], "start": []} for a in arms
        }
        leftovers = []
        for r in range(self.rounds):
            for arm in list(arms)[:: 1 if r % 2 == 0 else -1]:
                if left := sorted(set(tracing()) - baseline):
                    leftovers.append({"round": r, "arm": arm, "programs": left})
                running, started = arms[arm]()
                try:
                    rec = found[arm]
                    rec["start"].append(started)
                    s0 = switches(running.pid) if running else {}
                    rec["idle"].append(self.idle_cpu(running) if running else 0.0)
                    s1 = switches(running.pid) if running else {}
                    rec["switches"].append(sum(s1.values()) - sum(s0.values()))
                    for name, call in calls.items() if not self.start_idle else ():
                        loops = [self.tight(call) for _ in range(LOOPS_PER_ROUND)]
                        rec[name].append(statistics.median(loops))
                finally:
                    if isinstance(running, Measured):
                        running.stop(timeout=60)
                    elif running:
                        running.stop()
            print(f"  round {r + 1}/{self.rounds}: {json.dumps(found)}", flush=True)
        clean = {"bpftool": bpftool_path() is not None, "leftovers": leftovers}
        print(f"  arms started clean: {json.dumps(clean)}", flush=True)
        return {"arms": found, "clean": clean}

    def hook_arms(self) -> dict[str, Callable[[], tuple[Usage | None, float]]]:
        """Each arm of hooks() by name: starts it (settled) and returns it with its start's
        figure (the default agent's start → first metric, a one-liner's start → attached)."""
        hook = HOOKS[0]

        def agent(first: bool = False, **settings) -> tuple[Usage, float]:
            running = Measured(self.out, "aggregate", **settings)
            started = self.first_metric(running) if first else running.attach_seconds
            running.settle()
            return running, round(started, 2)

        def tracer(programs: dict[str, str], name: str = "") -> tuple[Usage, float]:
            running = Bpftrace(self.out, hook, programs, name)
            running.settle()
            return running, round(running.attach_seconds, 2)

        calls_only = {k: v for off in SOURCES_OFF.values() for k, v in off.items()}
        calls_only["probe"] = SOURCES_OFF["jobs"]["probe"]
        if self.start_idle:
            return {"agent": lambda: agent(first=True), "bpftrace": lambda: tracer(ONE_LINERS)}
        return {
            "none": lambda: (None, 0.0),
            "agent": lambda: agent(first=True),
            "agent untimed": lambda: agent(durations=False),
            "agent syscall exit": lambda: agent(durations_exit="syscall"),
            "agent calls only": lambda: agent(extra=calls_only, name="calls-only"),
            "bpftrace": lambda: tracer(ONE_LINERS),
            "bpftrace-timed drm_ioctl exit": lambda: tracer({hook: TIMED_AT_DRM_IOCTL}, "-drm"),
            "bpftrace-timed syscall exit": lambda: tracer(TIMED_ONE_LINERS),
        }

    def jobs(self) -> dict:
        """The GPU jobs row, with the test driver loaded for it alone (the other rows' agents
        find no driver on the scheduler, as before it existed); where it cannot load (6.1, or
        lockdown), why."""
        if why := load_testdrm():
            print(f"== jobs: skipped ({why})", flush=True)
            return {"skipped": why}
        try:
            return self.job_rounds()
        finally:
            subprocess.run(["modprobe", "-r", "kubenpu_testdrm"], check=False)

    def job_burst(self, node: str, steps: int) -> tuple[int, float]:
        """`steps` x JOBS_PER_STEP jobs of no length from the loader's cgroup, each step's
        submitted in a tight loop on a fd of its own: (jobs, seconds from the start of drmcall
        until it exits). drmcall closes a step's fd after its loop, and a close waits until
        the scheduler has taken every queued job of the file (drm_sched_entity_flush), so the
        time covers the jobs run, not just queued, and at most a step's jobs are in flight."""
        calls = [Call.drm(node, TESTDRM_JOB_0, JOBS_PER_STEP)] * steps
        start = time.monotonic()
        out = subprocess.run(
            drmcall_argv(calls, self.loader), check=True, capture_output=True, text=True
        ).stdout
        seconds = time.monotonic() - start
        if refused := [step for step in reports(out, calls) if step.get("errnos")]:
            raise SystemExit(f"the test driver refused jobs: {refused}")
        return steps * JOBS_PER_STEP, seconds

    def job_rounds(self) -> dict:
        """JOB_ROUNDS rounds, each starting every arm (job_arms()) afresh, in an order reversed
        every other round; in each, JOB_BURSTS bursts of about JOB_SECONDS: jobs/s (their
        median) and the arm's CPU per second over them; then what the arm counted (the agent's
        /metrics, the one-liner's map) against the jobs issued."""
        node = device_node(next(d for d in discover("/") if d.id == TESTDRM), "renderD")
        jobs, seconds = self.job_burst(node, 1)  # a warm-up, and the rate that sizes a burst
        steps = max(1, round(jobs / seconds * JOB_SECONDS / JOBS_PER_STEP))
        count = steps * JOBS_PER_STEP
        program = job_one_liner()
        arms = self.job_arms(program)
        if only := os.environ.get("KUBENPU_BENCH_JOB_ARMS"):  # e.g. "none,agent"
            arms = {a: arms[a] for a in only.split(",")}
        found: dict[str, dict[str, list]] = {
            a: {"jobs_per_second": [], "cpu": [], "issued": [], "counted": [], "probe": []}
            for a in arms
        }
        print(f"== jobs: bursts of {count} jobs; one-liner: {program}", flush=True)
        for r in range(JOB_ROUNDS):
            for arm in list(arms)[:: 1 if r % 2 == 0 else -1]:
                running = arms[arm]()
                rec = found[arm]
                try:
                    cpu0 = running.cpu_seconds() if running else 0.0
                    bursts = [self.job_burst(node, steps) for _ in range(JOB_BURSTS)]
                    took = sum(s for _, s in bursts)
                    cpu = (running.cpu_seconds() - cpu0) / took if running else 0.0
                    rec["jobs_per_second"].append(
                        round(statistics.median(n / s for n, s in bursts), 1)
                    )
                    rec["cpu"].append(round(cpu, 4))
                    rec["issued"].append(count * JOB_BURSTS)
                    if isinstance(running, Measured):
                        rec["probe"].append(running.jobs_probe())
                        if running.jobs:
                            rec["counted"].append(self.agent_counted(count * JOB_BURSTS))
                finally:
                    if isinstance(running, Measured):
                        running.stop(timeout=60)
                    elif running:
                        running.stop()
                if isinstance(running, Bpftrace):
                    rec["counted"].append(jobs_done(running.log_file.read_text(), self.loader))
            print(f"  jobs round {r + 1}/{JOB_ROUNDS}: {json.dumps(found)}", flush=True)
        return {
            "program": program,
            "burst_jobs": count,
            "step_jobs": JOBS_PER_STEP,
            "bursts": JOB_BURSTS,
            "rounds": JOB_ROUNDS,
            "arms": found,
        }

    def job_arms(self, program: str) -> dict[str, Callable[[], Usage | None]]:
        """Each arm of the jobs row by name: starts it, settled."""

        def agent(**settings) -> Usage:
            running = Measured(self.out, "aggregate", launcher=self.chart_launcher(), **settings)
            running.settle()
            return running

        def tracer() -> Usage:
            running = Bpftrace(self.out, "jobs", {"jobs": program})
            running.settle()
            return running

        return {
            "none": lambda: None,
            "agent": lambda: agent(name="jobs"),
            "agent jobs off": lambda: agent(extra=SOURCES_OFF["jobs"], name="jobs-off"),
            "bpftrace": tracer,
        }

    def chart_launcher(self) -> tuple[str, ...]:
        """The jobs row's agents run with the chart's capabilities where bench/run.sh wrote
        them (OUT/caps.json: then the raw_tp flavour, as installed by default), else as root
        (tp_btf; docs/jobs.md)."""
        caps = self.out / "caps.json"
        return launcher(json.loads(caps.read_text())) if caps.exists() else ()

    def guard(self, loop: int) -> dict:
        """The access guard's row: ns per call of an open + close of vgem's card, of
        DRM_IOCTL_MODE_CREATE_DUMB on it, of TCGETS on a pty and of FIONREAD on a FIFO, from the
        loader's cgroup, under each of GUARD_ARMS, in self.rounds rounds in an order reversed
        every other round (each arm's figure in a round: the median of LOOPS_PER_ROUND loops).
        In the guard's arms the loader's cgroup is a pod allocated the card, so every open (and,
        with the ioctl hooks, every DRM ioctl) takes the guard's allowed path, and its tallies
        must count each one. Without the ioctl hooks no ioctl enters the guard; with them the
        pty is a char device the guard does not guard, which it leaves at the first map lookup,
        and FIONREAD on a FIFO is an ioctl on no device, which it leaves at the inode's type.
        KUBENPU_BENCH_GUARD_CALLS (comma-separated) picks the calls."""
        rdev = os.stat(self.card).st_rdev
        dev = g.mkdev(os.major(rdev), os.minor(rdev))
        loader = cgroup_id(self.loader)
        kubepods = systemd_cgroup(LOADER).parents[2]  # kubepods.slice, level 1
        opens = int(loop * OPENS_PER_IOCTL_LOOP)
        if not FIFO.exists():
            os.mkfifo(FIFO)  # drmcall opens it O_RDWR, which never blocks on a FIFO
        calls = {
            "open_close": lambda: open_close(self.card, self.loader, opens),
            "drm": lambda: self.tight(Call.drm(self.card, CREATE_DUMB, loop)),
            "tcgets": lambda: self.tight(Call(PTY, TCGETS, 64, loop, raw=True)),
            "fifo": lambda: self.tight(Call(str(FIFO), FIONREAD, 64, loop, raw=True)),
        }
        if only := os.environ.get("KUBENPU_BENCH_GUARD_CALLS"):  # e.g. "tcgets,fifo"
            calls = {c: calls[c] for c in only.split(",")}

        # the card's opens and DRM ioctls per arm and round: drmcall opens the card once a loop
        def issued(ioctl: bool) -> dict[str, int]:
            return {
                "open": LOOPS_PER_ROUND * (opens * ("open_close" in calls) + ("drm" in calls)),
                "ioctl": LOOPS_PER_ROUND * loop * ("drm" in calls) * ioctl,
                "receive": 0,
            }

        found = {a: {**{c: [] for c in calls}, "counted": [], "issued": []} for a in GUARD_ARMS}
        leftovers = []
        for r in range(self.rounds):
            for arm in list(GUARD_ARMS)[:: 1 if r % 2 == 0 else -1]:
                if left := guard_programs():
                    leftovers.append({"round": r, "arm": arm, "programs": left})
                running, how = None, GUARD_ARMS[arm]
                if how is not None:
                    policy = {
                        "guarded": [dev],
                        "pods": {loader: [1, g.MODES.index(how[0])]},
                        "allowed": [[1, dev]],
                    }
                    start = {
                        "policy": policy,
                        "fail_open_seconds": GUARD_FAIL_OPEN_SECONDS,
                        "kubepods": [cgroup_id(kubepods), 1],
                        "ioctl": how[1],
                    }
                    running = GuardAgent(None, start)
                    if "started" not in running.first:
                        raise SystemExit(f"the guard did not start: {running.first}")
                try:
                    rec = found[arm]
                    for name, call in calls.items():
                        rec[name].append(statistics.median(call() for _ in range(LOOPS_PER_ROUND)))
                    if running:
                        rec["issued"].append(issued(how[1]))
                        rec["counted"].append(allowed_tallies(running.tallies(), loader))
                finally:
                    if running:
                        running.ask({"close": 1})
                        running.proc.stdin.close()
                        running.proc.wait()
            print(f"  guard round {r + 1}/{self.rounds}: {json.dumps(found)}", flush=True)
        return {
            "loop_calls": loop,
            "open_loop_calls": opens,
            "rounds": self.rounds,
            "loops_per_round": LOOPS_PER_ROUND,
            "arms": found,
            "leftovers": leftovers,
        }

    def agent_counted(self, issued: int) -> int:
        """The jobs the agent's /metrics shows once it shows `issued` (it reads the kernel's
        table every fdinfo.interval_seconds), or at JOBS_COUNTED_TIMEOUT."""
        deadline = time.monotonic() + JOBS_COUNTED_TIMEOUT
        while (done := agent_jobs()) < issued and time.monotonic() < deadline:
            time.sleep(1)
        return done

    def idle_pods(self, pods: list[Path]) -> dict:
        """Idle CPU with PODS pods: the default agent, then the one-liner, each through the pod
        tour (PODS cgroups' first calls), then IDLE_AFTER_TOUR windows."""
        found = {}
        for arm in ("agent", "bpftrace"):
            running = (
                Measured(self.out, "aggregate")
                if arm == "agent"
                else Bpftrace(self.out, HOOKS[0], ONE_LINERS, "-pods")
            )
            try:
                tour(self.card, pods, TOUR_CALLS)
                found[arm] = self.idle_after_tour(running)
                found[arm]["rss_mib"] = round(running.rss_mib(), 1)
            finally:
                running.stop(timeout=60) if isinstance(running, Measured) else running.stop()
            print(f"  idle with {PODS} pods, {arm}: {found[arm]}", flush=True)
        return found

    def sources(self) -> dict:
        """A row per default source: the agent counting calls only, then with each of its
        other default sources on alone; idle CPU and context switches over IDLE_SECONDS x 2."""
        found = {}
        rows = {"calls only": None, **{f"calls + {s}": s for s in SOURCES_OFF}}
        for row, on in rows.items():
            extra: dict = {}
            for name, off in SOURCES_OFF.items():
                if name != on:
                    for key, value in off.items():
                        extra[key] = {**extra.get(key, {}), **value}
            running = Measured(self.out, "aggregate", extra=extra, name=row.replace(" ", ""))
            try:
                running.settle()
                s0 = switches(running.pid)
                idle = [self.idle_cpu(running) for _ in range(2)]
                s1 = switches(running.pid)
                found[row] = {
                    "idle_cpu": statistics.fmean(idle),
                    "switches_per_second": round(
                        (sum(s1.values()) - sum(s0.values())) / (2 * IDLE_SECONDS), 1
                    ),
                    "threads": {t: s1[t] - s0.get(t, 0) for t in s1},
                }
            finally:
                running.stop(timeout=60)
            print(f"  source row {row}: {found[row]}", flush=True)
        return found

    def where(self, count: int) -> dict:
        """Where an arm's per-call time goes, arm by arm (the agent as by default, untimed,
        the counting one-liner and the timed pair at the syscall exit): the tracing programs
        and links it adds and whether any is left after it stops; with
        kernel.bpf_stats_enabled on (here only: it adds two clock reads to every program run),
        each program's runs and ns per run over a
        TCGETS loop and a DRM loop; and the process's context switches per thread over
        WAKEUP_SECONDS of idle (both vCPUs share one host thread under TCG: every wakeup of
        the agent is time taken from the loop)."""
        calls = {
            "tcgets": Call(PTY, TCGETS, 64, count, raw=True),
            "drm": Call.drm(self.card, CREATE_DUMB, count),
        }
        hook = HOOKS[0]
        starts = {
            "agent default": lambda: Measured(self.out, "aggregate"),
            "agent untimed": lambda: Measured(self.out, "aggregate", durations=False),
            "bpftrace": lambda: Bpftrace(self.out, hook),
            "bpftrace-timed": lambda: Bpftrace(self.out, hook, TIMED_ONE_LINERS),
        }
        res: dict = {"bpf_stats_enabled_at_boot": BPF_STATS.read_text().strip()}
        before = set(tracing())
        res["tracing_before"] = sorted(before)
        for arm, start in starts.items():
            running = start()
            try:
                running.settle()
                rec: dict = {"links": attached()}
                progs = {i: p for i, p in tracing().items() if i not in before}
                rec["programs"] = {p["name"]: p["insns"] for p in progs.values()}
                pid = running.pid
                s0 = switches(pid)
                time.sleep(WAKEUP_SECONDS)
                s1 = switches(pid)
                rec["switches_per_10s"] = {t: s1.get(t, 0) - s0.get(t, 0) for t in s1}
                BPF_STATS.write_text("1")
                try:
                    for name, call in calls.items():
                        p0 = tracing()
                        ns = self.tight(call)
                        p1 = tracing()
                        rec[name] = {"ns_per_call_with_stats": ns}
                        for i, p in p1.items():
                            runs = p["run_cnt"] - p0.get(i, p)["run_cnt"]
                            if runs:
                                took = p["run_time_ns"] - p0[i]["run_time_ns"]
                                rec[name][p["name"]] = {
                                    "runs_per_call": round(runs / count, 3),
                                    "ns_per_run": round(took / runs, 1),
                                }
                finally:
                    BPF_STATS.write_text("0")
            finally:
                running.stop(timeout=60) if isinstance(running, Measured) else running.stop()
            rec["left_after_stop"] = sorted(set(tracing()) - before)
            res[arm] = rec
            print(f"  where {arm}: {json.dumps(rec)}", flush=True)
        return res

    def calibrate(self) -> tuple[int, float]:
        """Calls per tight loop (about LOOP_SECONDS long) and the VM's maximum call rate."""
        n, s = self.burst(20_000)
        rate = n / s
        return max(20_000, int(rate * LOOP_SECONDS)), rate

    def windows(
        self, agent: Usage, settle: Callable[[int], dict], rates: list[float], top: int
    ) -> list[dict]:
        """Paced windows at each rate, then an unpaced one on every CPU (`top` calls per CPU):
        the agent's CPU over each window, including the time `settle` waits for it to catch up."""
        records = []
        ncpu = os.cpu_count() or 1
        for rate in [*rates, 0]:
            cpu0, t0 = agent.cpu_seconds(), time.monotonic()
            if rate:
                issued, run = self.burst(int(rate * WINDOW_SECONDS), rate=rate)
            else:
                issued, run = self.burst(top, procs=ncpu)
            cpu_run, wall_run = agent.cpu_seconds() - cpu0, time.monotonic() - t0
            rec = settle(issued)
            cpu = agent.cpu_seconds() - cpu0
            rec.update(
                target_rate=rate,
                rate=round(issued / run),
                cpu_per_second=round(cpu_run / wall_run, 4),  # while the calls are made
                cpu_seconds=round(cpu, 2),  # including the catch-up after the last call
                cpu_seconds_per_million=round(cpu / issued * 1e6, 2),
            )
            records.append(rec)
            print(f"  window {rec}", flush=True)
        return records

    def idle_cpu(self, agent: Usage) -> float:
        """The agent's CPU per second with no calls at all (its timers and map reads)."""
        cpu0, t0 = agent.cpu_seconds(), time.monotonic()
        time.sleep(IDLE_SECONDS)
        return round((agent.cpu_seconds() - cpu0) / (time.monotonic() - t0), 4)

    def idle_after_tour(self, agent: Usage) -> dict:
        """Idle CPU with the tour's pods, window by window from the tour's end: the first
        windows still hold the tour's work (new cgroups resolved, first sightings), so the
        figure is the median of the last 3 of IDLE_AFTER_TOUR, with every window beside it."""
        windows = [self.idle_cpu(agent) for _ in range(IDLE_AFTER_TOUR)]
        return {
            "idle_cpu_per_second_pods": statistics.median(windows[-3:]),
            "idle_cpu_windows_pods": windows,
        }

    def first_metric(self, agent: Measured) -> float:
        """Seconds from the agent's start until /metrics shows a call made right after attach."""
        self.burst(10)
        while not Scrape().counted:
            if time.monotonic() - agent.started > ATTACH_TIMEOUT:
                raise SystemExit("no metric after attach")
            time.sleep(0.5)  # each scrape costs the agent CPU: don't slow what is measured
        return time.monotonic() - agent.started

    def floor(self, loop: int, rates: list[float], top: int, pods: list[Path]) -> dict:
        """The aggregate mode's phases under the bpftrace one-liner on the default hook. Its map
        is read once, at the end: counted is what it holds for the calls issued here."""
        hook = HOOKS[0]
        print(f"== floor: bpftrace on {hook}", flush=True)
        tracer = Bpftrace(self.out, hook)
        try:
            issued = self.burst(10)[0]  # calls right after attach: counted from then on
            res: dict = {
                "hook": hook,
                "program": ONE_LINERS[hook],
                "attach_seconds": round(tracer.attach_seconds, 1),
                "rss_mib_start": round(tracer.rss_mib(), 1),
                "idle_cpu_per_second": self.idle_cpu(tracer),
            }
            res["loops_ns"] = self.loops(loop)
            res["windows"] = self.windows(tracer, lambda n: {"issued": n}, rates, top)
            res["tour"] = {"issued": tour(self.card, pods, TOUR_CALLS)}
            res |= self.idle_after_tour(tracer)
            res["rss_mib_steady"] = round(tracer.rss_mib(), 1)
        finally:
            counts = tracer.stop()
        issued += loop * REPEATS + sum(w["issued"] for w in res["windows"]) + res["tour"]["issued"]
        res["total"] = {"issued": issued, "counted": counted(counts, [self.loader, *pods])}
        print(f"  floor done: {json.dumps(res)}", flush=True)
        return res

    def mode(self, mode: str, loop: int, rates: list[float], top: int, pods: list[Path]) -> dict:
        print(f"== {mode}: starting the agent", flush=True)
        agent = Measured(self.out, mode)
        try:
            first = self.first_metric(agent)
            ledger = Ledger()
            res: dict = {
                "attach_seconds": round(agent.attach_seconds, 1),
                "first_metric_seconds": round(first, 1),
                "rss_mib_start": round(agent.rss_mib(), 1),
                "idle_cpu_per_second": self.idle_cpu(agent),
            }
            print(f"  {res}", flush=True)
            res["loops_ns"] = self.loops(loop)
            res["loops"] = ledger.settle(loop * REPEATS)
            res["windows"] = self.windows(agent, ledger.settle, rates, top)
            res["tour"] = ledger.settle(tour(self.card, pods, TOUR_CALLS))
            res["tour"]["attributed"] = ledger.last.counted["bench-pods"]
            res["tour"]["series"] = ledger.last.series
            res |= self.idle_after_tour(agent)
            res["rss_mib_steady"] = round(agent.rss_mib(), 1)
        finally:
            agent.stop(timeout=60)
        print(f"  {mode} done: {json.dumps(res)}", flush=True)
        return res

    def run(self) -> dict:
        pods = make_pods(self.cri, PODS)
        loop, max_rate = self.calibrate()
        low = float(f"{max_rate / 30:.1g}")  # a round rate, then 10x it, then flat out
        rates = [low, low * 10]
        top = int(max_rate * WINDOW_SECONDS)
        print(f"loop of {loop} calls; max rate ~{max_rate:.0f}/s; windows at {rates}", flush=True)
        baseline = self.loops(loop)
        modes = {}
        for mode in MODES:
            modes[mode] = self.mode(mode, loop, rates, top, pods)
            baseline += self.loops(loop)  # no agent again: interleaved with the agent's phases
        floor = self.floor(loop, rates, top, pods)
        baseline += self.loops(loop)
        hooks = self.hooks_only(loop, pods)
        restart = self.restart(pods)
        return {
            **hooks,
            "restart": restart,
            "jobs": self.jobs(),
            "guard": self.guard(loop),
            "kernel": os.uname().release,
            "cpus": os.cpu_count(),
            "loop_calls": loop,
            "max_rate": round(max_rate),
            "pods": PODS,
            "baseline_ns": baseline,
            "baseline_ns_median": statistics.median(baseline),
            "modes": modes,
            "bpftrace": floor,
        }

    def restart_only(self) -> dict:
        pods = make_pods(self.cri, PODS)
        return {
            "kernel": os.uname().release,
            "cpus": os.cpu_count(),
            "pods": PODS,
            "restart": self.restart(pods),
        }

    def hooks_only(self, loop: int | None = None, pods: list[Path] | None = None) -> dict:
        """The per-call rounds, the per-source rows and idle with PODS pods."""
        loop = loop or self.calibrate()[0]
        res = {
            "kernel": os.uname().release,
            "cpus": os.cpu_count(),
            "hooks_loop_calls": loop,
            "hooks_rounds": self.rounds,
            "loops_per_round": LOOPS_PER_ROUND,
        }
        # KUBENPU_BENCH_ROUNDS_ONLY=1: the per-call rounds alone (a change to the programs)
        rounds_only = os.environ.get("KUBENPU_BENCH_ROUNDS_ONLY") == "1"
        res["sources"] = {} if rounds_only or self.start_idle else self.sources()
        res["rounds"] = self.hooks(loop)
        if not rounds_only:
            res["idle_pods"] = self.idle_pods(pods or make_pods(self.cri, PODS))
        return res

    def jobs_only(self) -> dict:
        return {"kernel": os.uname().release, "cpus": os.cpu_count(), "jobs": self.jobs()}

    def guard_only(self) -> dict:
        return {
            "kernel": os.uname().release,
            "cpus": os.cpu_count(),
            "guard": self.guard(self.calibrate()[0]),
        }

    def restart(self, pods: list[Path]) -> dict:
        """Restarts with the probe pinned (docs/pinning.md), in aggregate mode with 1,000 pods:
        a cold start (the loader child compiles, attaches and pins; the agent adopts), then a
        paced load across a SIGKILL of the agent and a restart that adopts the pins. The calls
        lost across it (issued, not counted and not reported dropped) must be 0. First, for the
        comparison, a cold start of the BCC fallback (it compiles on the node)."""
        print("== restart: a cold start of the BCC fallback (no pinning)", flush=True)
        bcc = Measured(self.out, "aggregate", loader="bcc")
        try:
            res = {
                "bcc_attached_seconds": round(bcc.attach_seconds, 1),
                "bcc_first_metric_seconds": round(self.first_metric(bcc), 1),
                "bcc_rss_mib_start": round(bcc.rss_mib(), 1),
            }
        finally:
            bcc.stop(timeout=60)
        print("== restart: a cold start with pinning", flush=True)
        cold = Measured(self.out, "aggregate", pin_dir=PIN_DIR)
        try:
            res["cold_attached_seconds"] = round(cold.attach_seconds, 1)
            res["cold_first_metric_seconds"] = round(self.first_metric(cold), 1)
            res["cold_rss_mib_start"] = round(cold.rss_mib(), 1)
            ledger = Ledger()
            res["tour"] = ledger.settle(tour(self.card, pods, TOUR_CALLS))
            res["cold_rss_mib_steady"] = round(cold.rss_mib(), 1)
            calls = RESTART_RATE * RESTART_LOAD_SECONDS
            load = subprocess.Popen(
                drmcall_argv([Call.drm(self.card, CREATE_DUMB, calls)], self.loader, RESTART_RATE),
                stdout=subprocess.DEVNULL,
            )
            time.sleep(RESTART_KILL_AFTER)
        finally:
            cold.proc.kill()
            cold.proc.wait()
        print("== restart: SIGKILL, then a restart that adopts", flush=True)
        adopt = Measured(self.out, "aggregate", pin_dir=PIN_DIR)
        try:
            res["adopt_attached_seconds"] = round(adopt.attach_seconds, 1)
            res["adopt_first_metric_seconds"] = round(self.first_metric(adopt), 1)
            res["adopt_rss_mib_start"] = round(adopt.rss_mib(), 1)
            if load.wait() != 0:
                raise SystemExit("the restart load failed")
            res["across"] = ledger.settle(calls + 10)  # + first_metric's burst
            res["across"]["lost"] = res["across"]["issued"] - res["across"]["counted"]
            res["adopt_rss_mib_steady"] = round(adopt.rss_mib(), 1)
        finally:
            adopt.stop(timeout=60)
            uninstall = [
                PY,
                "-m",
                "kubenpu.agent",
                "--config",
                str(adopt.config_file),
                "--uninstall",
            ]
            subprocess.run(uninstall, check=False, stdout=subprocess.DEVNULL)
        print(f"  restart: {json.dumps(res)}", flush=True)
        return res

    def check(self) -> dict:
        """Per mode: one flat-out burst on every CPU; counted + dropped must equal issued."""
        found = {}
        ncpu = os.cpu_count() or 1
        for mode in MODES:
            agent = Measured(self.out, mode)
            try:
                self.first_metric(agent)
                ledger = Ledger()
                issued, _ = self.burst(CHECK_CALLS, procs=ncpu)
                found[mode] = ledger.settle(issued)
            finally:
                agent.stop(timeout=60)
            print(f"check {mode}: {found[mode]} exact={exact(found[mode])}", flush=True)
        return {"kernel": os.uname().release, "modes": found, "bpftrace": self.check_floor()}

    def check_floor(self) -> dict:
        """Per bpftrace one-liner: one flat-out burst on every CPU; its map must hold every call."""
        found = {}
        for hook in ONE_LINERS:
            tracer = Bpftrace(self.out, hook)
            try:
                issued, _ = self.burst(CHECK_CALLS, procs=os.cpu_count() or 1)
            finally:
                counts = tracer.stop()
            found[hook] = {"issued": issued, "counted": counted(counts, [self.loader])}
            print(f"check bpftrace {hook}: {found[hook]}", flush=True)
        return found


def compiled_agent(copy: Path = Path("/tmp/kubenpu-compiled")) -> None:
    """Agents started from now on run a byte-compiled copy of kubenpu, as the image ships it
    (pip compiles it on install): /src is read-only, so each start would compile every module
    of kubenpu again, a cost under TCG that no deployed agent pays."""
    src = Path(__file__).resolve().parents[1]
    shutil.rmtree(copy, ignore_errors=True)
    for part in ("kubenpu", "bpf"):  # probe.py finds bpf/ beside the package
        shutil.copytree(src / part, copy / part)
    subprocess.run([PY, "-m", "compileall", "-q", str(copy / "kubenpu")], check=True)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(copy), os.environ.get("PYTHONPATH")])
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", default="/out")
    parser.add_argument("--check", action="store_true", help="only the exactness bursts")
    parser.add_argument("--hooks", action="store_true", help="only the per-hook ioctl cost")
    parser.add_argument("--restart", action="store_true", help="only the restart rows")
    parser.add_argument("--where", action="store_true", help="where the per-call time goes")
    parser.add_argument("--jobs", action="store_true", help="only the GPU jobs row")
    parser.add_argument("--guard", action="store_true", help="only the access guard's row")
    parser.add_argument("--rounds", type=int, default=HOOK_ROUNDS, help="rounds of --hooks")
    parser.add_argument(
        "--start-idle",
        action="store_true",
        help="with --hooks: only the default agent's and the one-liner's start and idle",
    )
    args = parser.parse_args()
    out = Path(args.out)
    compiled_agent()
    bench = Bench(out, args.rounds, args.start_idle)
    try:
        if args.check:
            (out / "check.json").write_text(json.dumps(bench.check(), indent=1))
        elif args.hooks:
            (out / "bench.json").write_text(json.dumps(bench.hooks_only(), indent=1))
        elif args.where:
            (out / "where.json").write_text(json.dumps(bench.where(bench.calibrate()[0]), indent=1))
        elif args.restart:
            (out / "bench.json").write_text(json.dumps(bench.restart_only(), indent=1))
        elif args.jobs:
            (out / "bench.json").write_text(json.dumps(bench.jobs_only(), indent=1))
        elif args.guard:
            (out / "bench.json").write_text(json.dumps(bench.guard_only(), indent=1))
        else:
            (out / "bench.json").write_text(json.dumps(bench.run(), indent=1))
    finally:
        bench.cri.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
