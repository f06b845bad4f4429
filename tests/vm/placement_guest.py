"""The placement count on a real kernel (tests/test_placement_vm.py): the CO-RE probe loaded
on the two-node machine (KUBENPU_VM_NUMA=1: CPUs 0-1 on node 0, 2-3 on node 1, the virtio GPU
on node 1), and drmcall in three pods' cgroups: one pinned to node 0's CPUs, one to node 1's,
one unpinned in four processes at once. The kernel's {calls, remote} of each key are written
out with a bpftrace reference of each call's CPU and node (fentry on the same hook, the same
device), for the host to compare."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

from guestlib import ATTACH_TIMEOUT, CREATE_DUMB, DRMCALL, run_scenario

from kubenpu.discovery import discover
from kubenpu.kernel import abi
from kubenpu.kernel.loader import loaders

CALLS = 2000  # per process
UNPINNED_PROCESSES = 4
SLICE = Path("/sys/fs/cgroup/kubepods.slice")
ATTACHED = "bpftrace attached"


def pod_cgroup(qos: str, uid: str, container: str) -> Path:
    """A container's cgroup as the kubelet's systemd driver names it (QoS class in the path)."""
    parent = SLICE if qos == "guaranteed" else SLICE / f"kubepods-{qos}.slice"
    prefix = "kubepods" if qos == "guaranteed" else f"kubepods-{qos}"
    path = parent / f"{prefix}-pod{uid}.slice" / f"cri-containerd-{container * 64}.scope"
    path.mkdir(parents=True, exist_ok=True)
    return path


def node_cpus(node: int) -> set[int]:
    text = Path(f"/sys/devices/system/node/node{node}/cpulist").read_text().strip()
    cpus: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def start_reference(rdev: int, cgroups: list[Path], log: Path) -> subprocess.Popen:
    """bpftrace on the probe's hook: each call on the device from the pods, by cgroup, CPU and
    the NUMA node bpftrace reads for that CPU."""
    ids = " || ".join(f"cgroup == {cg.stat().st_ino}" for cg in cgroups)
    program = (
        f'BEGIN {{ printf("{ATTACHED}\\n"); }} fentry:vmlinux:security_file_ioctl'
        f" /args.file->f_inode->i_rdev == {rdev} && ({ids})/"
        " { @[cgroup, cpu, numaid] = count(); }"
    )
    with open(log, "w") as out:
        proc = subprocess.Popen(["bpftrace", "-e", program], stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + ATTACH_TIMEOUT
    while ATTACHED not in log.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"bpftrace did not attach: {log.read_text()}")
        time.sleep(0.2)
    return proc


def stop_reference(proc: subprocess.Popen, log: Path) -> list[list[int]]:
    proc.send_signal(signal.SIGINT)
    if proc.wait(timeout=120) != 0:
        raise SystemExit(f"bpftrace failed: {log.read_text()}")
    found = re.findall(r"^@\[(\d+), (\d+), (\d+)\]: (\d+)$", log.read_text(), re.M)
    return [[int(x) for x in row] for row in found]


def calls(card: str, cgroup: Path, cpus: str | None, processes: int = 1) -> None:
    """CALLS counted calls (CREATE_DUMB: core, alloc) per process, from `cgroup`, on `cpus`."""
    argv = [DRMCALL, "--cgroup", str(cgroup), card, hex(CREATE_DUMB[0]), str(CREATE_DUMB[1])]
    argv.append(str(CALLS))
    argv = ["taskset", "-c", cpus, *argv] if cpus else argv
    procs = [subprocess.Popen(argv, stdout=subprocess.DEVNULL) for _ in range(processes)]
    if any(p.wait() != 0 for p in procs):
        raise SystemExit(f"drmcall failed: {argv}")


def scenario(out: Path) -> dict:
    devices = discover("/")
    gpu = next(d for d in devices if d.numa_node is not None and d.numa_node >= 0)
    card = next(n for n in gpu.nodes if n.name.startswith("card"))
    sysfs = Path(f"/sys/bus/pci/devices/{gpu.id}")
    pods = {
        "node0": pod_cgroup("besteffort", "aaaa", "a"),
        "node1": pod_cgroup("burstable", "bbbb", "b"),
        "unpinned": pod_cgroup("besteffort", "cccc", "c"),
    }
    pinned = {"node0": "0-1", "node1": "2-3", "unpinned": None}
    (kernel,) = loaders(devices, loader="core", hook="security_file_ioctl", durations=False)
    attached = kernel.start(lambda _: None)
    log = out / "bpftrace.log"
    reference = start_reference(abi.dev_t(card.major, card.minor), list(pods.values()), log)
    for name, cgroup in pods.items():
        n = UNPINNED_PROCESSES if pinned[name] is None else 1
        calls(card.path, cgroup, pinned[name], n)
    rows = stop_reference(reference, log)
    counts, remote = kernel.read_counts(), kernel.read_remote()
    kernel.close()
    rdev = abi.dev_t(card.major, card.minor)
    keys = {
        name: [
            {"kind": k.kind, "calls": n, "remote": remote.get(k, 0)}
            for k, n in counts.items()
            if k.cgroup_id == cg.stat().st_ino and abi.dev_t(k.major, k.minor) == rdev
        ]
        for name, cg in pods.items()
    }
    return {
        "kernel": os.uname().release,
        "attached": attached,
        "device": {"id": gpu.id, "numa_node": gpu.numa_node, "card": card.path},
        "local_cpulist": (sysfs / "local_cpulist").read_text().strip(),
        "node_cpus": {str(n): sorted(node_cpus(n)) for n in (0, 1)},
        "cgroup_ids": {name: cg.stat().st_ino for name, cg in pods.items()},
        "calls_per_process": CALLS,
        "processes": {name: UNPINNED_PROCESSES if c is None else 1 for name, c in pinned.items()},
        "keys": keys,
        "reference": rows,  # [cgroup id, cpu, numa node, calls]
    }


if __name__ == "__main__":
    raise SystemExit(run_scenario("placement", scenario))
