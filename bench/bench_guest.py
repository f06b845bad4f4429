"""The benchmark, run as root inside the QEMU guest (bench/bench.sh; bench/check.sh for --check).

    bench_guest.py OUT_DIR            the full benchmark; writes OUT_DIR/bench.json
    bench_guest.py OUT_DIR --check    only the max-rate exactness bursts; writes OUT_DIR/check.json
    bench_guest.py OUT_DIR --hooks    only the per-hook ioctl cost; writes OUT_DIR/bench.json
    bench_guest.py OUT_DIR --restart  only the restart rows; writes OUT_DIR/bench.json

Every figure comes from one boot, measured side by side: tight loops of counted ioctls with the
static C `drmcall` (no agent, then the agent in each probe mode), the agent's CPU from
/proc/PID/stat at paced rates, counted + dropped against issued after every burst, the time from
start to the first metric and the agent's RSS with 1,000 pods' worth of kubelet-style cgroups,
and what each probe.hook adds to a non-DRM ioctl (TCGETS on a pty, which the security_file_ioctl
hook sees as well) and to a counted DRM one, and restarts with the probe pinned in bpffs
(docs/pinning.md): a cold start whose loader child compiles, then a SIGKILL under a paced load and
a restart that adopts the pins: time to the first metric, RSS, and calls lost across it.
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
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "vm"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from cri_server import CriTestServer
from guestlib import (
    ATTACH_TIMEOUT,
    CREATE_DUMB,
    DRMCALL,
    MODES,
    PROMETHEUS,
    PY,
    TCGETS,
    Agent,
    Call,
    add_container,
    by_reason,
    device_node,
    drmcall_argv,
    reports,
    scrape,
    systemd_cgroup,
)

from kubenpu.discovery import discover

CRI_SOCKET = "/run/kubenpu-bench-cri.sock"
SETTLE_TIMEOUT = 180
# No change in counted + dropped for this long: the agent will not account for more. Long,
# because the agent resolves every new pod (a CRI request each) before it counts their calls.
QUIET_SECONDS = 30
TICK = os.sysconf("SC_CLK_TCK")

PODS = 1000  # pods' worth of cgroups for the start and RSS figures
TOUR_CALLS = 3  # calls made from each of those pods
REPEATS = 5  # tight loops per phase, for the median
HOOK_ROUNDS = 6  # interleaved rounds of the per-hook table: loops per arm, paired by round
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
BPFTRACE_ATTACHED = "bpftrace attached"
PIN_DIR = "/sys/fs/bpf/kubenpu-bench"  # probe.pin_dir of the restart rows
RESTART_RATE = 2000  # calls/s of the paced load across the restart
RESTART_LOAD_SECONDS = 20
RESTART_KILL_AFTER = 5  # seconds into the load


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


def cgroup_id(cgroup: Path) -> int:
    """bpf_get_current_cgroup_id() of a process in `cgroup`: the directory's inode number."""
    return cgroup.stat().st_ino


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
    ) -> None:
        self.mode = mode
        probe = {"mode": mode, "pin_dir": pin_dir, "loader": loader, "durations": durations}
        config = {
            "probe": {**probe, **({"hook": hook} if hook else {})},
            # The CRI test server shares the guest's emulated CPUs with the agent and the load:
            # give it longer than a real runtime needs.
            "attribution": {"cri": {"endpoint": f"unix://{CRI_SOCKET}", "timeout_seconds": 15}},
            "export": {"prometheus": PROMETHEUS, "otlp": {"enabled": False}},
        }
        parts = ("agent", mode, *([hook] if hook else []), *(["pinned"] if pin_dir else []))
        parts += (loader,) if loader != "auto" else ()
        parts += () if durations else ("untimed",)
        super().__init__(out, config, name="-".join(parts))
        self.attach()


class Bpftrace(Usage):
    """The floor: bpftrace running ONE_LINERS[hook], started and attached. Its map is read once,
    when it stops: bpftrace prints it on SIGINT."""

    def __init__(self, out: Path, hook: str, programs: dict[str, str] = ONE_LINERS) -> None:
        timed = "-timed" if programs is TIMED_ONE_LINERS else ""
        self.log_file = out / f"bpftrace{timed}-{hook}.log"
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
    def __init__(self, out: Path) -> None:
        self.out = out
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
        """ns per call of TCGETS on a pty and of a counted DRM call under each arm: no agent, the
        agent on each probe.hook (timed, the default, and with probe.durations off) and each
        hook's one-liners (counting; timed: an entry timestamp and an exit histogram). The arms
        are interleaved: HOOK_ROUNDS rounds, each starting every arm afresh for one loop of each
        call, in an order reversed every other round. Loop r of every arm is from round r, so a
        difference between two arms is taken round by round and drift of the host cancels."""
        calls = {
            "tcgets": Call(PTY, TCGETS, 64, count, raw=True),
            "drm": Call.drm(self.card, CREATE_DUMB, count),
        }
        arms = self.hook_arms()
        found: dict[str, dict[str, list[float]]] = {a: {c: [] for c in calls} for a in arms}
        for r in range(HOOK_ROUNDS):
            for arm in list(arms)[:: 1 if r % 2 == 0 else -1]:
                stop = arms[arm]()
                try:
                    for name, call in calls.items():
                        found[arm][name].append(self.tight(call))
                finally:
                    stop()
            print(f"  round {r + 1}/{HOOK_ROUNDS}: {json.dumps(found)}", flush=True)
        return found

    def hook_arms(self) -> dict[str, Callable[[], Callable[[], object]]]:
        """Each arm of hooks() by name: a function that starts it and returns its stop."""

        def agent(hook: str, timed: bool) -> Callable[[], object]:
            running = Measured(self.out, "aggregate", hook, durations=timed)
            running.settle()
            return lambda: running.stop(timeout=60)

        def tracer(hook: str, programs: dict[str, str]) -> Callable[[], object]:
            running = Bpftrace(self.out, hook, programs)
            running.settle()
            return running.stop

        arms: dict[str, Callable[[], Callable[[], object]]] = {"none": lambda: lambda: None}
        for hook in HOOKS:
            arms[hook] = lambda h=hook: agent(h, True)
            arms[f"{hook} untimed"] = lambda h=hook: agent(h, False)
            arms[f"bpftrace {hook}"] = lambda h=hook: tracer(h, ONE_LINERS)
            arms[f"bpftrace-timed {hook}"] = lambda h=hook: tracer(h, TIMED_ONE_LINERS)
        return arms

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
        return {
            **self.hooks_only(loop),
            "restart": self.restart(pods),
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

    def hooks_only(self, loop: int | None = None) -> dict:
        loop = loop or self.calibrate()[0]
        return {
            "kernel": os.uname().release,
            "cpus": os.cpu_count(),
            "hooks_loop_calls": loop,
            "hooks_rounds": HOOK_ROUNDS,
            "hooks": self.hooks(loop),
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
    args = parser.parse_args()
    out = Path(args.out)
    compiled_agent()
    bench = Bench(out)
    try:
        if args.check:
            (out / "check.json").write_text(json.dumps(bench.check(), indent=1))
        elif args.hooks:
            (out / "bench.json").write_text(json.dumps(bench.hooks_only(), indent=1))
        elif args.restart:
            (out / "bench.json").write_text(json.dumps(bench.restart_only(), indent=1))
        else:
            (out / "bench.json").write_text(json.dumps(bench.run(), indent=1))
    finally:
        bench.cri.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
