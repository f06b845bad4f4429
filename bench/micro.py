"""Host-only micro-benchmark of the agent's user-space path, on synthetic events (no VM, no BPF).

    python bench/micro.py [--json FILE]

Measures, in ns, what the agent spends per call in per-event mode (decode, fold into the Tally,
attribute and count) and per key per collection in aggregate mode (cumulative kernel counts into
deltas, attribute and count), with the real Resolver over a kubelet-style cgroup tree in a
temporary directory, a real CRI gRPC server (tests/cri_server.py) and the real series table.
The fdinfo figures read a synthetic /proc tree of 1,000 DRM clients (one per pod, in a process
of FDS_PER_PROCESS fds) among 50,000 fds in all: the full scan the agent makes at start, and one
steady-state read of kubenpu.sources.usage.Usage (the holders only, attributed and counted). The
telemetry figure is one kubenpu.sources.telemetry read of every device of the sysfs fixture machines
shaped like i915, xe, amdgpu, ivpu and habanalabs (tests/testdata): all their hwmon and driver
files, on tmpfs-like disk pages rather than sysfs, so a floor of the real cost.
Prints one line per figure: the best of REPEATS runs (as timeit does: slower runs measure
the noise of other processes, not this code).
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from cri_server import CriTestServer
from helpers import resolved

from kubenpu.discovery import Device, Node, discover
from kubenpu.resolve.resolver import Resolver
from kubenpu.sources.calls.attribution import Attributor
from kubenpu.sources.calls.events import SIZE, Deltas, Event, Key, Tally, decode
from kubenpu.sources.fdinfo import FdinfoReader
from kubenpu.sources.registry import table
from kubenpu.sources.telemetry import Telemetry
from kubenpu.sources.usage import Usage

REPEATS = 5
FDS = 50_000
FDS_PER_PROCESS = 10
EVENTS = 200_000
PODS = 1000
KINDS = (1, 2, 3)  # submit, alloc, wait
MAJOR, MINOR = 226, 0
TESTDATA = Path(__file__).resolve().parents[1] / "tests" / "testdata"
TELEMETRY_MACHINES = ("intel-i915", "intel-arc-xe", "amd-server", "intel-npu", "gaudi")
# Synthetic records are packed here and checked against events.decode(), so a change to the
# C struct's layout fails this benchmark instead of measuring the wrong thing.
_RECORD = struct.Struct("<QQIIIIII")


def record(cgroup_id: int, kind: int) -> bytes:
    data = _RECORD.pack(1, cgroup_id, 42, 0xC02064B2, MAJOR, MINOR, kind, 0)
    want = Event(1, cgroup_id, 42, 0xC02064B2, MAJOR, MINOR, kind)
    if len(data) != SIZE or decode(data) != want:
        raise SystemExit(
            "micro.py: the event layout no longer matches kubenpu.sources.calls.events"
        )
    return data


class Setup:
    """A cgroup tree of PODS containers, a CRI server that knows them, and the agent's parts."""

    def __init__(self, root: Path) -> None:
        self.cri = CriTestServer()
        self.cri.start(str(root / "cri.sock"))
        self.cgroup_ids = []
        for i in range(PODS):
            cid, uid = f"{i:064x}", f"00000000-0000-4000-8000-{i:012x}"
            self.cri.add_container(cid, "bench", f"pod-{i}", "main", pod_uid=uid)
            path = root / "cgroup/kubepods/besteffort" / f"pod{uid}" / cid
            path.mkdir(parents=True)
            self.cgroup_ids.append(os.stat(path).st_ino)
        self.root = root
        self.device = Device(
            id="platform:vgem",
            driver="vgem",
            vendor="vgem",
            pci_id=None,
            numa_node=None,
            nodes=(Node("/dev/dri/card0", "card0", MAJOR, MINOR),),
        )

    def attributor(self) -> Attributor:
        """A fresh agent path whose resolver has already seen every pod (steady state)."""
        resolver = Resolver(str(self.root / "cgroup"), f"unix://{self.root / 'cri.sock'}")
        for cgroup_id in self.cgroup_ids:
            resolved(resolver, cgroup_id)
        return Attributor([self.device], resolver, table(300, 100_000))

    def resolver(self) -> Resolver:
        return Resolver(str(self.root / "cgroup"), f"unix://{self.root / 'cri.sock'}")

    def proc_tree(self) -> Path:
        """root/proc: PODS DRM clients, one per pod, among FDS fds; returns root."""
        cgroups = sorted(str(p.relative_to(self.root / "cgroup")) for p in self._leaves())
        fdinfo = "drm-driver:\tvgem\ndrm-client-id:\t{}\ndrm-engine-render:\t{} ns\n"
        fdinfo += "drm-resident-system:\t4096\n"
        for pid in range(1, FDS // FDS_PER_PROCESS + 1):
            proc = self.root / "proc" / str(pid)
            (proc / "fd").mkdir(parents=True)
            (proc / "fdinfo").mkdir()
            holder = pid <= PODS
            (proc / "cgroup").write_text(f"0::/{cgroups[(pid - 1) % PODS]}\n")
            for fd in range(FDS_PER_PROCESS):
                drm = holder and fd == 3
                (proc / "fd" / str(fd)).symlink_to("/dev/dri/card0" if drm else "/dev/null")
                if drm:
                    (proc / "fdinfo" / str(fd)).write_text(fdinfo.format(pid, pid * 1000))
        return self.root

    def _leaves(self) -> list[Path]:
        return [p for p in (self.root / "cgroup").glob("kubepods/besteffort/*/*")]

    def keys(self, pods: int) -> list[Key]:
        return [Key(c, MAJOR, MINOR, k) for c in self.cgroup_ids[:pods] for k in KINDS]


def best_ns(run: Callable[[], tuple[int, int]]) -> float:
    """Best over REPEATS of ns per unit; `run` returns (ns spent, units done), so that its
    own setup stays out of the figure."""
    samples = []
    for _ in range(REPEATS):
        ns, units = run()
        samples.append(ns / units)
    return round(min(samples), 1)


def measure(setup: Setup) -> dict[str, float]:
    few = [record(k.cgroup_id, k.kind) for k in setup.keys(10)]
    events = [few[i % len(few)] for i in range(EVENTS)]

    def decode_all() -> tuple[int, int]:
        t0 = time.perf_counter_ns()
        for data in events:
            decode(data)
        return time.perf_counter_ns() - t0, len(events)

    def tally_all() -> tuple[int, int]:
        tally = Tally(65536)
        t0 = time.perf_counter_ns()
        for data in events:
            tally.add_event(data)
        return time.perf_counter_ns() - t0, len(events)

    def event_path() -> tuple[int, int]:
        """Per-event mode: every call is decoded and folded; each flush attributes the keys."""
        tally, attributor = Tally(65536), setup.attributor()
        t0 = time.perf_counter_ns()
        for data in events:
            tally.add_event(data)
        attributor.flush(tally.drain())
        return time.perf_counter_ns() - t0, len(events)

    return {
        "decode_ns_per_event": best_ns(decode_all),
        "tally_ns_per_event": best_ns(tally_all),
        "events_path_ns_per_event": best_ns(event_path),
        "aggregate_ns_per_key": aggregate_per_key(setup),
        **fdinfo_read(setup),
        "telemetry_read_ms": telemetry_read(),
    }


def telemetry_read() -> float:
    """ms of one telemetry read of every fixture machine's devices (energy split included)."""
    metrics = table(300, 100_000)
    readers = [Telemetry(discover(TESTDATA / m), metrics, TESTDATA / m) for m in TELEMETRY_MACHINES]

    def once() -> tuple[int, int]:
        t0 = time.perf_counter_ns()
        for reader in readers:
            reader.sample({})
        return time.perf_counter_ns() - t0, 1_000_000

    once()  # the first read is the energy baseline
    return best_ns(once)


def fdinfo_read(setup: Setup) -> dict[str, float]:
    """ms of the full scan and of one steady-state Usage read (1,000 clients, 50,000 fds)."""
    root = setup.proc_tree()
    reader = FdinfoReader([setup.device], root)
    resolver = setup.resolver()
    for cgroup_id in setup.cgroup_ids:
        resolved(resolver, cgroup_id)
    usage = Usage(
        reader,
        resolver,
        table(300, 100_000),
        [setup.device],
        str(root / "cgroup"),
        pending_seconds=120,
        clock=time.monotonic,
    )
    usage.read()  # the first read is the full scan; later ones read the holders

    def full() -> tuple[int, int]:
        t0 = time.perf_counter_ns()
        clients = len(reader.scan().clients)
        assert clients == PODS, clients
        return time.perf_counter_ns() - t0, 1_000_000

    def steady() -> tuple[int, int]:
        t0 = time.perf_counter_ns()
        usage.read()
        return time.perf_counter_ns() - t0, 1_000_000

    return {"fdinfo_full_scan_ms": best_ns(full), "fdinfo_read_ms": best_ns(steady)}


def aggregate_per_key(setup: Setup) -> float:
    """Aggregate mode: one collection in which every pod's keys changed, in ns per key. It is
    paid every collection whatever the call rate, so it scales with keys, not calls."""
    keys = setup.keys(PODS)
    attributor, deltas, tally = setup.attributor(), Deltas(), Tally(65536)
    total = 0

    def collect() -> tuple[int, int]:
        nonlocal total
        total += 1
        cumulative = dict.fromkeys(keys, total)  # what Probe.read_counts() would return
        t0 = time.perf_counter_ns()
        tally.add_counts(deltas.step(cumulative))
        attributor.flush(tally.drain())
        return time.perf_counter_ns() - t0, len(keys)

    collect()  # the first collection also creates the series
    return best_ns(collect)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        setup = Setup(Path(tmp))
        try:
            found = measure(setup)
        finally:
            setup.cri.stop()
    found["python"] = sys.version.split()[0]
    for name, value in found.items():
        print(f"{name}: {value}")
    if args.json:
        Path(args.json).write_text(json.dumps(found, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
