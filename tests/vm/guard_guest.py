"""The access guard (bpf/guard.bpf.c, kubenpu/kernel/guard.py) on a real kernel, inside the QEMU
guest: plain processes in cgroups under kubepods.slice stand for pods, vgem's card node for the
device, and a small agent process (`agent` below) loads the guard, writes the policy it is given
on stdin, and beats every BEAT_SECONDS.

tests/vm/guard.sh runs `main`; it writes /out/result.json for tests/test_guard_vm.py:
- lsm: /sys/kernel/security/lsm; kernel: uname -r;
- caps: per capability set, what loading and attaching the guard did (ok, or its error);
- steps: each step's observed results (errno 0 = allowed) and the tallies after it;
- uninstall: `helm uninstall` as a node sees it: the chart's pre-delete hook's command
  (/out/plan.json, from the host test) while the agent runs, then the SIGTERM that deleting the
  agents' DaemonSet sends, and what bpftool (/out/bpftool, the host's) and bpffs show after.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from guestlib import SLOW
from least_privilege_guest import launcher

from kubenpu.discovery import discover
from kubenpu.kernel import bpfsys
from kubenpu.kernel import guard as g

PYTHON = "/opt/kubenpu/venv/bin/python"
HERE = Path(__file__)
BEAT_SECONDS = 0.5
FAIL_OPEN_SECONDS = 3.0
DRM_IOCTL_VERSION = 0xC0406400  # _IOWR('d', 0x00, struct drm_version): 64 bytes on 64-bit
BPFTOOL = "/out/bpftool"  # the host's, copied by the test: the guest root has none
KUBEPODS = Path("/sys/fs/cgroup/kubepods.slice")
CAP_SETS = {
    "none": [],
    "BPF": ["BPF"],
    "PERFMON": ["PERFMON"],
    "BPF+PERFMON": ["BPF", "PERFMON"],
    "BPF+MAC_ADMIN": ["BPF", "MAC_ADMIN"],
    "BPF+PERFMON+MAC_ADMIN": ["BPF", "PERFMON", "MAC_ADMIN"],
    "SYS_ADMIN": ["SYS_ADMIN"],
}


def guard_programs() -> list[str]:
    """The access guard's programs loaded in the kernel (bpf/guard.bpf.c names them guard_*)."""
    return sorted(n for n in bpfsys.program_names() if n.startswith("guard_"))


# --- the agent: a separate process, so that it can be stopped and killed -----------------------


def _policy(spec: dict) -> g.Policy:
    return g.Policy(
        frozenset(spec["guarded"]),
        {int(c): tuple(v) for c, v in spec["pods"].items()},
        frozenset(tuple(a) for a in spec["allowed"]),
    )


def agent() -> None:
    """stdin: one JSON line per command: {"policy": ...} | {"tallies": 1} | {"close": 1};
    stdout: one JSON line per command. The first line is the start's."""
    first = json.loads(sys.stdin.readline())
    clock = g.Clock(int(first["fail_open_seconds"] * 1e9), tuple(first["kubepods"]))
    kernel = g.GuardKernel(ioctl=first.get("ioctl", False))
    try:
        how = kernel.start(_policy(first["policy"]), clock, time.monotonic_ns())
    except Exception as exc:  # the caps runs report it
        print(json.dumps({"error": str(exc)}), flush=True)
        return
    print(json.dumps({"started": how}), flush=True)
    writer = kernel.writer
    lock = threading.Lock()
    closed = threading.Event()  # no beat into closed maps (an exception at the process's exit)

    def beat() -> None:
        while True:
            with lock:
                if closed.is_set():
                    return
                writer.beat(time.monotonic_ns(), clock)
            time.sleep(BEAT_SECONDS)

    threading.Thread(target=beat, daemon=True).start()
    for line in sys.stdin:
        cmd = json.loads(line)
        with lock:
            if "policy" in cmd:
                writer.apply(_policy(cmd["policy"]))
                print(json.dumps({"ok": 1}), flush=True)
            elif "tallies" in cmd:
                found = [[*k, n] for k, n in writer.tallies().items()]
                print(json.dumps({"tallies": found}), flush=True)
            elif "close" in cmd:
                kernel.close()
                closed.set()
                print(json.dumps({"closed": 1}), flush=True)
                return


class Agent:
    def __init__(self, caps: list[str] | None, start: dict) -> None:
        argv = [PYTHON, str(HERE), "agent"]
        self.proc = subprocess.Popen(
            [*launcher(caps), *argv] if caps is not None else argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": "/src:/src/tests/vm"},
        )
        self.first = self.ask(start)

    def ask(self, cmd: dict) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            return {"error": f"the agent exited {self.proc.wait()}"}
        return json.loads(line)

    def tallies(self) -> list:
        return self.ask({"tallies": 1})["tallies"]


# --- pods: processes that join a cgroup, then act ----------------------------------------------


def make_cgroup(path: Path) -> int:
    path.mkdir(parents=True, exist_ok=True)
    return path.stat().st_ino  # the cgroup id (VM-FACTS)


def _join(cgroup: Path | None) -> None:
    if cgroup is not None:
        (cgroup / "cgroup.procs").write_text(str(os.getpid()))


def _use(fd: int) -> int:
    """DRM_IOCTL_VERSION on fd: 0, or the errno."""
    try:
        fcntl.ioctl(fd, DRM_IOCTL_VERSION, bytearray(64))
    except OSError as err:
        return err.errno
    return 0


def _in_child(cgroup: Path | None, work) -> dict:
    """work() run in a forked child that first joins `cgroup` (None: stays a host process)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            _join(cgroup)
            result = work()
        except BaseException as exc:  # reported, never raised past the fork
            result = {"exception": repr(exc)}
        os.write(w, json.dumps(result).encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        out = f.read()
    os.waitpid(pid, 0)
    return json.loads(out)


def open_and_use(cgroup: Path | None, node: str) -> dict:
    def work() -> dict:
        try:
            fd = os.open(node, os.O_RDWR)
        except OSError as err:
            return {"open": err.errno}
        try:
            return {"open": 0, "ioctl": _use(fd)}
        finally:
            os.close(fd)

    return _in_child(cgroup, work)


def passed_fd(owner: Path, taker: Path, node: str) -> dict:
    """`owner` opens the node and passes the fd over a unix socket to `taker`, which uses it if
    it got it: a refused receive leaves the data without the fd, MSG_CTRUNC set."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)

    def give() -> dict:
        b.close()
        fd = os.open(node, os.O_RDWR)
        socket.send_fds(a, [b"fd"], [fd])
        a.recv(1)  # wait until taken
        return {"owner_ioctl": _use(fd)}

    def take() -> dict:
        a.close()
        data, fds, flags, _ = socket.recv_fds(b, 16, 1)
        result = {"taker_data": data.decode(), "taker_fds": len(fds)}
        result["taker_ctrunc"] = bool(flags & socket.MSG_CTRUNC)
        if fds:
            result["taker_ioctl"] = _use(fds[0])
        b.send(b"k")
        return result

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.write(w, json.dumps(_in_child(owner, give)).encode())
        os._exit(0)
    os.close(w)
    taken = _in_child(taker, take)
    with os.fdopen(r) as f:
        given = json.loads(f.read())
    os.waitpid(pid, 0)
    a.close()
    b.close()
    return {**given, **taken}


def held_fd(cgroup: Path, node: str, switch) -> dict:
    """A pod opens the node, then switch() changes the policy (audit to enforce), then the pod
    uses the fd it already holds: only an ioctl check can stop that."""
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()

    def work() -> dict:
        try:
            fd = os.open(node, os.O_RDWR)
        except OSError as err:
            return {"open": err.errno}
        finally:
            os.write(ready_w, b"r")
        os.read(go_r, 1)
        return {"open": 0, "ioctl_after_switch": _use(fd)}

    found: list[dict] = []
    child = threading.Thread(target=lambda: found.append(_in_child(cgroup, work)))
    child.start()
    os.read(ready_r, 1)
    switch()
    os.write(go_w, b"g")
    child.join()
    for fd in (ready_r, ready_w, go_r, go_w):
        os.close(fd)
    return found[0]


def born_and_open(cgroup: Path, node: str) -> dict:
    """A new pod cgroup, joined and the device opened at once (before any policy write)."""
    started = time.monotonic()
    make_cgroup(cgroup)
    found = open_and_use(cgroup, node)
    return {**found, "ms_from_mkdir": round((time.monotonic() - started) * 1000, 1)}


def wait_for(what: str, check, timeout: float) -> float:
    """Seconds until check() is true; raises after `timeout`."""
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > timeout:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.1)
    return round(time.monotonic() - started, 2)


def lsm_programs() -> dict[str, list]:
    """Every BPF LSM program and link the kernel lists, as `bpftool prog show` and `bpftool link
    show` print them (name and id; a link by its program's id)."""

    def bpftool(*args: str) -> list[dict]:
        done = subprocess.run([BPFTOOL, "-j", *args], check=True, capture_output=True, text=True)
        return json.loads(done.stdout or "[]")

    programs = [p for p in bpftool("prog", "show") if p.get("type") == "lsm"]
    ids = {p["id"] for p in programs}
    links = [
        k
        for k in bpftool("link", "show")
        if k.get("attach_type") == "lsm_mac" or k.get("prog_id") in ids
    ]
    return {
        "programs": sorted(f"{p.get('name', '')} {p['id']}" for p in programs),
        "links": sorted(f"{k['id']} prog {k.get('prog_id')}" for k in links),
    }


def uninstall(out: Path, pod_b: Path, node: str, start: dict) -> dict:
    """`helm uninstall` on one node: the pre-delete hook's command runs while the agent holds
    the guard (the hook runs before Helm deletes anything), then Helm deletes the agents'
    DaemonSet and the kubelet sends the agent SIGTERM. Nothing of the guard is pinned, so the
    process's exit must take every LSM program and link with it."""
    hook = json.loads((out / "plan.json").read_text())["uninstall"]
    agent_ = Agent(None, start)
    found = {"attached": lsm_programs()}
    argv = [*launcher(hook["caps"]), PYTHON, "-m", "kubenpu.agent", *hook["command"][1:]]
    done = subprocess.run(argv, capture_output=True, text=True)
    found["hook"] = {"rc": done.returncode, "output": done.stdout + done.stderr}
    found["b_after_hook"] = open_and_use(pod_b, node)  # the guard holds until the agent goes
    agent_.proc.terminate()
    found["agent_rc"] = agent_.proc.wait()
    found["gone_after_s"] = wait_for("no guard program", lambda: not guard_programs(), 60 * SLOW)
    found["after"] = lsm_programs()
    found["b_after"] = open_and_use(pod_b, node)
    found["bpffs"] = sorted(str(p) for p in Path("/sys/fs/bpf").rglob("*"))
    return found


# --- the scenario ------------------------------------------------------------------------------


def caps_runs(start: dict) -> dict:
    found = {}
    for name, caps in CAP_SETS.items():
        agent_ = Agent(caps, start)
        if "started" in agent_.first:
            agent_.ask({"close": 1})
        agent_.proc.stdin.close()
        agent_.proc.wait()
        found[name] = agent_.first
    return found


def ioctl_on(start: dict, pod_a: Path, pod_b: Path, node: str, policy) -> dict:
    """guard.ioctl: the held fd's ioctl is denied once the pod's mode is enforce."""
    agent_ = Agent(None, {**start, "policy": policy("audit"), "ioctl": True})
    found = {"ioctl_start": agent_.first, "programs_ioctl": guard_programs()}
    found["lsm_ioctl"] = lsm_programs()
    found["b_held_ioctl"] = held_fd(pod_b, node, lambda: agent_.ask({"policy": policy("enforce")}))
    found["b_passed_fd_ioctl"] = passed_fd(pod_a, pod_b, node)
    found["tallies_ioctl"] = agent_.tallies()
    agent_.ask({"close": 1})
    agent_.proc.stdin.close()
    agent_.proc.wait()
    return found


def main(out: Path) -> dict:
    subprocess.run(["modprobe", "vgem"], check=False)
    result: dict = {
        "kernel": os.uname().release,
        "lsm": g.LSM_LIST.read_text().strip(),
        "lsm_active": g.lsm_active(),
    }
    g.check()  # the agent's own test passes as root here; the caps runs measure the kernel's
    vgem = next(d for d in discover() if d.vendor == "vgem")
    card = next(n for n in vgem.nodes if n.name.startswith("card"))
    dev = g.mkdev(card.major, card.minor)
    kubepods = (make_cgroup(KUBEPODS), 1)
    pod_a = KUBEPODS / "kubepods-poda.slice" / "cri-containerd-a.scope"
    pod_b = KUBEPODS / "kubepods-podb.slice" / "cri-containerd-b.scope"
    ids = {"a": make_cgroup(pod_a), "b": make_cgroup(pod_b)}

    def policy(mode_b: str) -> dict:
        mode = g.MODES.index
        return {
            "guarded": [dev],
            "pods": {ids["a"]: [1, mode("enforce")], ids["b"]: [2, mode(mode_b)]},
            "allowed": [[1, dev]],
        }

    start = {
        "policy": policy("enforce"),
        "fail_open_seconds": FAIL_OPEN_SECONDS,
        "kubepods": kubepods,
    }
    result["caps"] = caps_runs(start)
    steps: dict = {}
    result["steps"] = steps
    agent_ = Agent(None, start)
    steps["start"] = agent_.first
    steps["a"] = open_and_use(pod_a, card.path)
    steps["b_enforce"] = open_and_use(pod_b, card.path)
    steps["b_passed_fd"] = passed_fd(pod_a, pod_b, card.path)
    steps["host"] = open_and_use(None, card.path)
    steps["born"] = born_and_open(
        KUBEPODS / "kubepods-podc.slice" / "cri-containerd-c.scope", card.path
    )
    steps["tallies_enforce"] = agent_.tallies()
    agent_.ask({"policy": policy("audit")})
    steps["b_audit"] = open_and_use(pod_b, card.path)
    steps["b_passed_fd_audit"] = passed_fd(pod_a, pod_b, card.path)
    steps["tallies_audit"] = agent_.tallies()
    steps["programs_default"] = guard_programs()
    steps["lsm_default"] = lsm_programs()
    steps["b_held_default"] = held_fd(
        pod_b, card.path, lambda: agent_.ask({"policy": policy("enforce")})
    )
    # A stalled agent: no beat; the guard fails open once the last is FAIL_OPEN_SECONDS old.
    os.kill(agent_.proc.pid, signal.SIGSTOP)
    stalled = time.monotonic()
    wait_for(
        "fail open", lambda: open_and_use(pod_b, card.path) == {"open": 0, "ioctl": 0}, 60 * SLOW
    )
    steps["failed_open_after_s"] = round(time.monotonic() - stalled, 2)
    os.kill(agent_.proc.pid, signal.SIGCONT)
    steps["denied_again_after_s"] = wait_for(
        "the beat back",
        lambda: open_and_use(pod_b, card.path).get("open") == errno.EPERM,
        60 * SLOW,
    )
    steps["tallies_stall"] = agent_.tallies()
    steps["programs_attached"] = guard_programs()
    steps["close"] = agent_.ask({"close": 1})
    steps["programs_after_close"] = guard_programs()
    agent_.proc.stdin.close()
    agent_.proc.wait()
    # A killed agent: its links go with its fds.
    agent_ = Agent(None, start)
    steps["b_before_kill"] = open_and_use(pod_b, card.path)
    agent_.proc.kill()
    agent_.proc.wait()
    steps["gone_after_kill_s"] = wait_for(
        "no guard program", lambda: not guard_programs(), 60 * SLOW
    )
    steps["b_after_kill"] = open_and_use(pod_b, card.path)
    steps.update(ioctl_on(start, pod_a, pod_b, card.path, policy))
    steps["bpffs"] = sorted(str(p) for p in Path("/sys/fs/bpf").rglob("*"))
    result["uninstall"] = uninstall(out, pod_b, card.path, start)
    result["ids"] = ids
    result["dev"] = dev
    return result


if __name__ == "__main__":
    if sys.argv[1:] == ["agent"]:
        agent()
    else:
        out = Path(sys.argv[1] if len(sys.argv) > 1 else "/out")
        started = time.monotonic()
        found = main(out)
        found["guest_seconds"] = round(time.monotonic() - started, 1)
        (out / "result.json").write_text(json.dumps(found, indent=1, sort_keys=True))
        print(json.dumps(found, indent=1, sort_keys=True), flush=True)
