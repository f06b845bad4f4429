"""The placement scheduler (bpf/placement.bpf.c, kubenpu/kernel/placement.py) on a real kernel
with two NUMA nodes (KUBENPU_VM_NUMA=1: CPUs 0-1 node 0, 2-3 node 1, the virtio GPU's card1 on
node 1), inside the QEMU guest. A plain process in a cgroup under kubepods.slice stands for the
pod; it runs as another user (as a pod does), starts on CPU 0 (node 0), then allows itself every
CPU and makes ioctls on card1 for RUN_NS of the guest's clock, recording the CPU of each
(sched_getcpu). A CPU-bound host process pinned to CPU 3 (node 1) counts its loops all along. A
small agent process (`agent` below) loads the scheduler with the pod's cgroup preferring node 1
and gives the pod's tasks the SCHED_EXT policy, as kubenpu.sources.placement does.

tests/vm/scheduler.sh runs `main`; it writes /out/result.json for tests/test_scheduler_vm.py:
- kernel, numa_node (card1's), sched_ext (the sysfs directory exists);
- caps: per capability set, what loading the scheduler did and what setting the pod's policy did;
- without / with: the pod's calls per CPU, and the host task's loops meanwhile;
- with: the scheduler's state and ops name while loaded, and the state after the agent is
  killed (SIGKILL: no close() runs);
- stall: the pod pinned to the host task's CPU, with the scheduler: the fair class runs first, so
  the pod's task waits; what the kernel's watchdog did, and whether the pod finished.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from guestlib import SLOW
from least_privilege_guest import launcher

from kubenpu.kernel import placement as pl

PYTHON = "/opt/kubenpu/venv/bin/python"
HERE = Path(__file__)
CARD = "/dev/dri/card1"
DRM_IOCTL_VERSION = 0xC0406400  # _IOWR('d', 0x00, struct drm_version): 64 bytes on 64-bit
# The pod's CPU-bound phase lasts 50 of the scheduler's 20 ms slices: a task that never sleeps is
# moved only when its first slice ends, so a run of one or two slices (1,500 calls took 30-35 ms
# here) left 30 % to 100 % of its calls on node 0, by where (or whether) its end fell in the run.
RUN_NS = 1_000_000_000
BATCH = 50  # calls between clock reads (about 1 ms under TCG)
POD_UID = 1000
HOST_CPU, START_CPU = 3, 0
DEVICE_NODE = 1
KUBEPODS = Path("/sys/fs/cgroup/kubepods.slice")
CAP_SETS = {
    "BPF+PERFMON": ["BPF", "PERFMON"],
    "SYS_NICE": ["SYS_NICE"],
    "SYS_ADMIN": ["SYS_ADMIN"],
    "SYS_ADMIN+SYS_NICE": ["SYS_ADMIN", "SYS_NICE"],
}
ENV = {**os.environ, "PYTHONPATH": "/src:/src/tests/vm"}
_libc = ctypes.CDLL(None, use_errno=True)


def _wait(what: str, done, seconds: float) -> None:
    deadline = time.monotonic() + seconds * SLOW
    while not done():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.1)


# --- processes ----------------------------------------------------------------------------------


def pod(cgroup: str, pinned: str) -> None:
    """Joins `cgroup`, opens the card, becomes POD_UID, runs on START_CPU until told (a line on
    stdin), then on `pinned` CPUs ("all": every CPU) makes ioctls for RUN_NS; prints its CPU
    counts."""
    (Path(cgroup) / "cgroup.procs").write_text(str(os.getpid()))
    fd = os.open(CARD, os.O_RDWR)
    os.setgid(POD_UID)
    os.setuid(POD_UID)
    os.sched_setaffinity(0, {START_CPU})
    print(json.dumps({"tid": os.getpid()}), flush=True)
    sys.stdin.readline()
    cpus = set(range(os.cpu_count() or 1)) if pinned == "all" else {int(pinned)}
    os.sched_setaffinity(0, cpus)
    counts = [0] * (os.cpu_count() or 1)
    buf = bytearray(64)
    deadline = time.monotonic_ns() + RUN_NS
    while time.monotonic_ns() < deadline:
        for _ in range(BATCH):
            fcntl.ioctl(fd, DRM_IOCTL_VERSION, buf)
            counts[_libc.sched_getcpu()] += 1
    print(json.dumps({"cpus": counts, "policy": os.sched_getscheduler(0)}), flush=True)


def hog(counter: str) -> None:
    """A CPU-bound host task on HOST_CPU: its loop count, in `counter` every 1000 loops."""
    os.sched_setaffinity(0, {HOST_CPU})
    n = 0
    with open(counter, "w") as f:
        while True:
            n += 1
            if n % 1000 == 0:
                f.seek(0)
                f.write(f"{n:20d}")
                f.flush()


def agent(cgroup: str) -> None:
    """Loads the scheduler with `cgroup` preferring DEVICE_NODE, gives the cgroup's tasks the
    SCHED_EXT policy, says so, then waits (to be killed)."""
    kernel = pl.PlacementKernel()
    kernel.start({os.stat(cgroup).st_ino: DEVICE_NODE})
    tids = [int(t) for t in (Path(cgroup) / "cgroup.threads").read_text().split()]
    print(json.dumps({"switched": pl.to_sched_ext(tids)}), flush=True)
    signal.pause()


def try_caps() -> None:
    """What this capability set allows: loading (and registering) the scheduler; setting the
    policy of the pod (pid argv[2], another user's)."""
    found = {}
    kernel = pl.PlacementKernel()
    try:
        kernel.start({})
        found["load"] = "ok"
    except Exception as exc:
        found["load"] = str(exc)
    finally:
        kernel.close()
    try:
        pl.to_sched_ext([int(sys.argv[2])])
        os.sched_setscheduler(int(sys.argv[2]), os.SCHED_OTHER, os.sched_param(0))
        found["policy"] = "ok"
    except OSError as exc:
        found["policy"] = exc.strerror or str(exc)
    print(json.dumps(found), flush=True)


def _spawn(*args: str, caps: list[str] | None = None) -> subprocess.Popen:
    argv = [PYTHON, str(HERE), *args]
    return subprocess.Popen(
        [*launcher(caps), *argv] if caps is not None else argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=ENV,
    )


def _line(proc: subprocess.Popen) -> dict:
    line = proc.stdout.readline()
    if not line:
        raise SystemExit(f"{proc.args} exited {proc.wait()} before answering")
    return json.loads(line)


# --- the runs ------------------------------------------------------------------------------------


def _loops(counter: Path) -> int:
    text = counter.read_text().strip()
    return int(text) if text else 0


def _run(cgroup: Path, counter: Path, pinned: str = "all", scheduler: bool = False) -> dict:
    """One run of the pod, with or without the scheduler; the agent is left running."""
    worker = _spawn("pod", str(cgroup), pinned)
    _line(worker)
    found: dict = {}
    agent_proc = None
    if scheduler:
        agent_proc = _spawn("agent", str(cgroup))
        found["switched"] = _line(agent_proc)["switched"]
        found["state"] = pl.state()
        found["ops"] = (pl.SCHED_EXT_ROOT / "root" / "ops").read_text().strip()
    before = _loops(counter)
    worker.stdin.write("go\n")
    worker.stdin.flush()
    found.update(_line(worker))
    found["host_loops"] = _loops(counter) - before
    worker.wait()
    found["agent"] = agent_proc
    return found


def _unload_by_kill(agent_proc: subprocess.Popen) -> str:
    agent_proc.send_signal(signal.SIGKILL)
    agent_proc.wait()
    _wait("sched_ext disabled", lambda: pl.state() == "disabled", 30)
    return pl.state()


def _caps(cgroup: Path) -> dict:
    """Each capability set's load and policy, against a pod process (another user's)."""
    worker = _spawn("pod", str(cgroup), "all")
    tid = _line(worker)["tid"]
    found = {}
    for name, caps in CAP_SETS.items():
        _wait("sched_ext disabled", lambda: pl.state() == "disabled", 30)
        proc = _spawn("try-caps", str(tid), caps=caps)
        found[name] = _line(proc)
        proc.wait()
    worker.kill()
    worker.wait()
    return found


def _stall(cgroup: Path, counter: Path) -> dict:
    """The pod pinned to the hog's CPU with the scheduler on: the fair hog runs first there."""
    dmesg_before = subprocess.run(["dmesg"], capture_output=True, text=True).stdout
    worker = _spawn("pod", str(cgroup), str(HOST_CPU))
    _line(worker)
    agent_proc = _spawn("agent", str(cgroup))
    found = {"switched": _line(agent_proc)["switched"]}
    worker.stdin.write("go\n")
    worker.stdin.flush()
    deadline = time.monotonic() + 120 * SLOW
    while worker.poll() is None and pl.state() != "disabled" and time.monotonic() < deadline:
        time.sleep(0.5)
    found["state_while"] = pl.state()
    if worker.poll() is None and pl.state() != "disabled":
        worker.kill()  # neither finished nor stopped by the watchdog: the test fails on it
        found["pod"] = None
    else:
        found["pod"] = _line(worker)  # it finishes once it gets the CPU (the fair class again)
    worker.wait()
    dmesg = subprocess.run(["dmesg"], capture_output=True, text=True).stdout
    found["dmesg"] = [
        line for line in dmesg[len(dmesg_before) :].splitlines() if "sched_ext" in line
    ]
    agent_proc.kill()
    agent_proc.wait()
    _wait("sched_ext disabled", lambda: pl.state() == "disabled", 30)
    found["state_after"] = pl.state()
    return found


def _progress(step: str, result: dict, out: Path) -> None:
    """One line per step in guest.log, and the results so far in result.json."""
    print(f"scheduler_guest: {step}: {json.dumps(result[step])}", flush=True)
    (out / "result.json").write_text(json.dumps(result, indent=1))


def main(out: Path) -> None:
    cgroup = KUBEPODS / "kubepods-pod1.slice" / "cri-containerd-1.scope"
    cgroup.mkdir(parents=True, exist_ok=True)
    card = Path("/sys/class/drm/card1/device")
    result: dict = {
        "kernel": os.uname().release,
        "numa_node": int((card / "numa_node").read_text()),
        "local_cpulist": (card / "local_cpulist").read_text().strip(),
        "sched_ext": pl.SCHED_EXT_ROOT.is_dir(),
    }
    if not result["sched_ext"]:
        (out / "result.json").write_text(json.dumps(result, indent=1))
        return
    counter = Path("/tmp/hog")
    counter.write_text("")
    hog_proc = _spawn("hog", str(counter))
    try:
        _wait("the host task", lambda: _loops(counter) > 0, 60)
        result["without"] = _run(cgroup, counter)
        result["without"].pop("agent")
        _progress("without", result, out)
        with_run = _run(cgroup, counter, scheduler=True)
        result["with"] = with_run
        result["with"]["state_after_kill"] = _unload_by_kill(with_run.pop("agent"))
        _progress("with", result, out)
        result["caps"] = _caps(cgroup)
        _progress("caps", result, out)
        result["stall"] = _stall(cgroup, counter)
    finally:
        hog_proc.kill()
        hog_proc.wait()
    _progress("stall", result, out)


if __name__ == "__main__":
    commands = {
        "pod": lambda: pod(sys.argv[2], sys.argv[3]),
        "hog": lambda: hog(sys.argv[2]),
        "agent": lambda: agent(sys.argv[2]),
        "try-caps": try_caps,
    }
    if len(sys.argv) > 1 and sys.argv[1] in commands:
        commands[sys.argv[1]]()
    else:
        main(Path(sys.argv[1] if len(sys.argv) > 1 else "/out"))
