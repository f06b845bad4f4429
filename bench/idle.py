"""Host-only harness of the agent's idle cost: CPU seconds per attribution period with no call.

    python bench/idle.py [--pods 1 1000] [--periods 200] [--profile]

The real Probe, Resolver, Attributor, Metrics and Agent.cycle() over a FakeKernel (tests/fakes.py)
whose counts and durations maps hold each pod's keys (3 kinds), a kubelet-style cgroup tree on
/dev/shm (tmpfs: ext4 reuses inode numbers) and the real CRI test server (tests/cri_server.py).
A fake clock moves by the loop's flush period (0.5 s) per cycle, so the counts map is read every
tenth cycle as the running agent reads it; nothing changes between periods. Prints CPU seconds
(time.process_time) per period for each pod count, and with --profile the top functions.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from cri_server import CriTestServer
from fakes import Clock, FakeKernel

from kubenpu.attribution import Attributor
from kubenpu.discovery import Device, Node
from kubenpu.events import Key, Tally
from kubenpu.health import Health
from kubenpu.kernel import abi
from kubenpu.kernel.records import Durations
from kubenpu.loop import Agent
from kubenpu.metrics.store import Metrics
from kubenpu.probe import Probe
from kubenpu.resolve.resolver import Resolver

MAJOR, MINOR = 226, 0
KINDS = (1, 2, 3)
PERIOD = 0.5  # the attribution loop's flush period (kubenpu.loop._FLUSH_SECONDS)
DEVICE = Device(
    id="platform:vgem",
    driver="vgem",
    vendor="vgem",
    pci_id=None,
    numa_node=None,
    nodes=(Node("/dev/dri/card0", "card0", MAJOR, MINOR),),
)


def agent(root: Path, pods: int) -> Agent:
    """An agent in steady state over `pods` pods that have all made calls once."""
    cri = CriTestServer()
    cri.start(str(root / "cri.sock"))
    kernel, clock = FakeKernel(aggregate=True), Clock()
    for i in range(pods):
        cid, uid = f"{i:064x}", f"00000000-0000-4000-8000-{i:012x}"
        cri.add_container(cid, "bench", f"pod-{i}", "main", pod_uid=uid)
        path = root / "cgroup/kubepods/besteffort" / f"pod{uid}" / cid
        path.mkdir(parents=True)
        for kind in KINDS:
            key = Key(os.stat(path).st_ino, MAJOR, MINOR, kind)
            kernel.calls(key, 10)
            kernel.durations[key] = Durations(
                1000, (1,) + (0,) * (abi.DURATION_SLOTS - 1), (0,) * len(abi.ERRORS)
            )
    tally = Tally(65536)
    metrics = Metrics("node", 300, 100_000)
    resolver = Resolver(str(root / "cgroup"), f"unix://{root / 'cri.sock'}")
    a = Agent(
        probe=Probe(kernel, tally),
        tally=tally,
        attributor=Attributor([DEVICE], resolver, metrics, clock=clock),
        metrics=metrics,
        resolver=resolver,
        health=Health(stale_after=15, clock=clock),
        devices=1,
        clock=clock,
    )
    a.attach()
    kernel.poll(0)
    for _ in range(40):  # first sightings resolved, the totals counted: steady state
        clock.now += PERIOD
        a.cycle()
        time.sleep(0.01)
    a._bench_clock = clock  # type: ignore[attr-defined]
    a._bench_cri = cri  # type: ignore[attr-defined]
    return a


def per_period(a: Agent, periods: int, profile: cProfile.Profile | None) -> float:
    clock = a._bench_clock  # type: ignore[attr-defined]
    if profile:
        profile.enable()
    t0 = time.process_time()
    for _ in range(periods):
        clock.now += PERIOD
        a.cycle()
    spent = time.process_time() - t0
    if profile:
        profile.disable()
    return spent / periods


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pods", type=int, nargs="+", default=[1, 1000])
    parser.add_argument("--periods", type=int, default=200)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    for pods in args.pods:
        with tempfile.TemporaryDirectory(dir="/dev/shm") as tmp:
            a = agent(Path(tmp), pods)
            profile = cProfile.Profile() if args.profile else None
            best = min(per_period(a, args.periods, None) for _ in range(3))
            if profile:
                per_period(a, args.periods, profile)
            print(f"pods={pods} cpu_s_per_period={best:.6f}")
            if profile:
                stats = pstats.Stats(profile)
                stats.sort_stats("cumulative").print_stats(25)
            a.resolver.close()
            a._bench_cri.stop()  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
