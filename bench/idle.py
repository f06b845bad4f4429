"""Host-only harness of the agent's idle cost: CPU seconds per attribution period with no call.

    python bench/idle.py [--pods 1 1000] [--periods 200] [--profile] [--memory]

The real Probe, Resolver, Attributor, series table and Agent.cycle() over a FakeKernel
(tests/fakes.py) whose counts and durations maps hold each pod's keys (3 kinds), a kubelet-style
cgroup tree on /dev/shm (tmpfs: ext4 reuses inode numbers) and the real CRI test server
(tests/cri_server.py).
A fake clock moves by the loop's flush period (0.5 s) per cycle, so the counts map is read every
tenth cycle as the running agent reads it; nothing changes between periods. Prints CPU seconds
(time.process_time) per period for each pod count, and with --profile the top functions.

--memory traces allocations (tracemalloc) and prints, per pod count, the memory that kubenpu's
own code holds in steady state (the resolver's answers, the attributor's keys, the store's
series and histograms): its growth per pod is the agent's memory per pod. The process's RSS is
printed too, but it also holds the fake kernel and the CRI server's containers.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import micro
from fakes import Clock, FakeKernel

from kubenpu.agent.health import Health
from kubenpu.agent.loop import Agent
from kubenpu.kernel import abi
from kubenpu.kernel.records import Durations
from kubenpu.sources.calls.attribution import Attributor
from kubenpu.sources.calls.events import Key, Tally
from kubenpu.sources.calls.probe import Probe
from kubenpu.sources.registry import table

PERIOD = 0.5  # the attribution loop's flush period (kubenpu.agent.loop._FLUSH_SECONDS)
TIMED = Durations(1000, (1,) + (0,) * (abi.DURATION_SLOTS - 1), (0,) * len(abi.ERRORS))


def agent(setup: micro.Setup) -> Agent:
    """An agent in steady state over micro's pods, which have all made calls once."""
    kernel, clock = FakeKernel(aggregate=True), Clock()
    for cgroup_id in setup.cgroup_ids:
        for kind in micro.KINDS:
            key = Key(cgroup_id, micro.MAJOR, micro.MINOR, kind)
            kernel.calls(key, 10)
            kernel.durations[key] = TIMED
    tally = Tally(65536)
    metrics = table(300, 100_000)
    resolver = setup.resolver()
    a = Agent(
        probe=Probe(kernel, tally),
        tally=tally,
        attributor=Attributor([setup.device], resolver, metrics, clock=clock),
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


def held_by_kubenpu() -> int:
    """Bytes live now that kubenpu's own code allocated (the allocating frame is in kubenpu/)."""
    snapshot = tracemalloc.take_snapshot().filter_traces(
        [tracemalloc.Filter(True, str(Path(micro.__file__).resolve().parents[1] / "kubenpu/*"))]
    )
    return sum(stat.size for stat in snapshot.statistics("filename"))


def rss() -> float:
    """This process's RSS in MiB."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * 4096 / 2**20


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pods", type=int, nargs="+", default=[1, 1000])
    parser.add_argument("--periods", type=int, default=200)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--memory", action="store_true")
    args = parser.parse_args()
    for pods in args.pods:
        micro.PODS = pods
        with tempfile.TemporaryDirectory(dir="/dev/shm") as tmp:
            setup = micro.Setup(Path(tmp))
            if args.memory:
                tracemalloc.start()
            a = agent(setup)
            if args.memory:
                held = held_by_kubenpu() / 2**20
                print(f"pods={pods} kubenpu_mib={held:.2f} rss_mib={rss():.1f}")
                tracemalloc.stop()
            profile = cProfile.Profile() if args.profile else None
            best = min(per_period(a, args.periods, None) for _ in range(3))
            if profile:
                per_period(a, args.periods, profile)
            print(f"pods={pods} cpu_s_per_period={best:.6f}")
            if profile:
                stats = pstats.Stats(profile)
                stats.sort_stats("cumulative").print_stats(25)
            a.resolver.close()
            setup.cri.stop()


if __name__ == "__main__":
    main()
