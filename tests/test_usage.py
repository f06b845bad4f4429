"""Device time and memory per pod (kubenpu.sources.usage) on a /proc tree written by the test.

The tree is a copy of a machine like tests/testdata/proc's: proc/PID/{fd,fdinfo,cgroup} whose fd
links name /dev/dri nodes, the intel-i915 sysfs fixture, and a cgroup v2 hierarchy of plain
directories whose inodes are the cgroup ids. The resolver is tests/fakes.py's FakeResolver (no
CRI here); the reader, the Usage and the series table are the real ones.
"""

from __future__ import annotations

import logging
import shutil
from functools import partial
from pathlib import Path

import pytest
from fakes import Clock, FakeResolver
from helpers import out_of_descriptors, values

from kubenpu.cli import top
from kubenpu.discovery import discover
from kubenpu.metrics.catalogue import (
    DESCRIPTORS_EXHAUSTED,
    ENGINE_BUSY,
    ENGINE_CAPACITY,
    ENGINE_CYCLES,
    FDINFO_SKIPPED,
    MEMORY,
)
from kubenpu.metrics.inputs import Where
from kubenpu.metrics.own import EXHAUSTED
from kubenpu.resolve import Attribution
from kubenpu.sources.calls.attribution import Attributor
from kubenpu.sources.fdinfo import FdinfoReader, Scan
from kubenpu.sources.registry import table
from kubenpu.sources.usage import ENGINES, Usage

I915 = Path(__file__).parent / "testdata" / "intel-i915"
DEVICE = "0000:00:02.0"
POD_A = Attribution("ns", "a", "main")
POD_B = Attribution("ns", "b", "main")


class Machine:
    """A /proc and cgroup tree the test edits between reads."""

    def __init__(self, root: Path, sysfs: Path = I915, driver: str = "i915") -> None:
        self.root = root
        self.driver, self.node = driver, "renderD128"
        (root / "proc").mkdir()
        shutil.copytree(sysfs / "sys", root / "sys", symlinks=True)
        self.cgroups = root / "cgroup"
        self.resolver = FakeResolver()
        self.clock = Clock()
        self.metrics = table(60, 1000, clock=self.clock)
        self.watched: list[int] = []
        devices = discover(root)
        self.reader = Reader(devices, root)
        self.devices = devices
        self.usage = Usage(
            self.reader,
            self.resolver,
            self.metrics,
            devices,
            str(self.cgroups),
            pending_seconds=120,
            on_cgroup=self.watched.append,
            own_cgroup=str(self.cgroups / "kubepods" / "agent"),
            on_exhausted=partial(self.metrics.set, EXHAUSTED),
            clock=self.clock,
        )

    def cgroup(self, name: str, who: Attribution | None) -> int:
        """A cgroup directory; the resolver answers `who` for it (None: pending)."""
        path = self.cgroups / name
        path.mkdir(parents=True, exist_ok=True)
        cgroup_id = path.stat().st_ino
        if who is not None:
            self.resolver.answers[cgroup_id] = who
        return cgroup_id

    def process(self, pid: int, cgroup: str, clients: dict[int, str]) -> None:
        """pid in cgroup, with one DRM fd per client id, whose fdinfo holds the given lines."""
        proc = self.root / "proc" / str(pid)
        shutil.rmtree(proc, ignore_errors=True)
        (proc / "fd").mkdir(parents=True)
        (proc / "fdinfo").mkdir()
        (proc / "cgroup").write_text(f"0::/{cgroup}\n")
        procs = self.cgroups / cgroup / "cgroup.procs"
        procs.write_text("".join(f"{p}\n" for p in {*self.procs(cgroup), pid}))
        (proc / "fd" / "0").symlink_to("/dev/null")
        for fd, (client_id, lines) in enumerate(clients.items(), start=3):
            (proc / "fd" / str(fd)).symlink_to(f"/dev/dri/{self.node}")
            pdev = self.devices[-1].id
            text = f"pos:\t0\ndrm-driver:\t{self.driver}\ndrm-pdev:\t{pdev}\n"
            text += f"drm-client-id:\t{client_id}\n"
            (proc / "fdinfo" / str(fd)).write_text(text + lines)

    def procs(self, cgroup: str) -> list[int]:
        path = self.cgroups / cgroup / "cgroup.procs"
        return [int(p) for p in path.read_text().split()] if path.exists() else []

    def exit(self, pid: int) -> None:
        shutil.rmtree(self.root / "proc" / str(pid))

    def read(self) -> Scan:
        return self.usage.read()


class Reader(FdinfoReader):
    """The real reader, recording which pids each scan was given (None: every process)."""

    def __init__(self, *args: object) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.asked: list[list[int] | None] = []

    def scan(self, pids=None):  # type: ignore[no-untyped-def]
        self.asked.append(None if pids is None else list(pids))
        return super().scan(pids)


WHERE = ("namespace", "device", "vendor")  # the same for every client here: left out


def busy(ns: float, engine: str = "render") -> str:
    return f"drm-engine-{engine}:\t{int(ns)} ns\n"


@pytest.fixture
def machine(tmp_path: Path) -> Machine:
    return Machine(tmp_path)


def test_busy_time_per_pod_never_goes_down_when_a_process_exits(machine: Machine) -> None:
    machine.cgroup("pod-a", POD_A)
    machine.process(10, "pod-a", {1: busy(3e9)})
    machine.process(11, "pod-a", {2: busy(2e9)})
    machine.read()
    assert values(machine.metrics, ENGINE_BUSY, WHERE) == {("a", "main", "render"): 5.0}
    machine.exit(10)
    machine.process(11, "pod-a", {2: busy(2.5e9)})
    machine.usage.saw([], [])
    machine.read()
    assert values(machine.metrics, ENGINE_BUSY, WHERE) == {("a", "main", "render"): 5.5}


def test_a_forked_holder_continues_the_client_after_its_parent_exits(machine: Machine) -> None:
    """Pid 100 holds client 7 at 10 s, forks 300 and exits; 300 is idle one read, then works
    to 12 s. The pod's counter went 10, 10, 22: the client was counted again from zero."""
    machine.cgroup("pod-a", POD_A)
    machine.process(100, "pod-a", {7: busy(10e9)})
    machine.read()
    machine.process(300, "pod-a", {7: busy(10e9)})  # fork: the same open file, the same client
    machine.exit(100)
    machine.read()  # 300 made no call: not scanned, so client 7 looks closed
    assert values(machine.metrics, ENGINE_BUSY, WHERE) == {("a", "main", "render"): 10.0}
    machine.process(300, "pod-a", {7: busy(12e9)})
    machine.usage.saw([300], [])
    machine.read()
    assert values(machine.metrics, ENGINE_BUSY, WHERE) == {("a", "main", "render"): 12.0}


def test_a_client_passed_to_another_pod_is_counted_once(machine: Machine) -> None:
    """dup across processes (SCM_RIGHTS): the sender exits, the receiver in pod b goes on."""
    machine.cgroup("pod-a", POD_A)
    machine.cgroup("pod-b", POD_B)
    machine.process(100, "pod-a", {7: busy(4e9)})
    machine.read()
    machine.exit(100)
    machine.read()
    machine.process(200, "pod-b", {7: busy(5e9)})
    machine.usage.saw([200], [])
    machine.read()
    assert values(machine.metrics, ENGINE_BUSY, WHERE) == {
        ("a", "main", "render"): 4.0,
        ("b", "main", "render"): 1.0,
    }


def test_a_reused_pid_with_a_new_client_counts_it_from_zero(machine: Machine) -> None:
    machine.cgroup("pod-a", POD_A)
    machine.process(100, "pod-a", {7: busy(4e9)})
    machine.read()
    machine.exit(100)
    machine.read()
    machine.process(100, "pod-a", {8: busy(1e9)})  # a new process with the old pid
    machine.usage.saw([100], [])
    machine.read()
    assert values(machine.metrics, ENGINE_BUSY, WHERE) == {("a", "main", "render"): 5.0}


def test_a_value_going_backwards_is_held_until_overtaken(machine: Machine) -> None:
    machine.cgroup("pod-a", POD_A)
    machine.process(10, "pod-a", {1: busy(4e9)})
    machine.read()
    machine.process(10, "pod-a", {1: busy(3e9)})
    machine.read()
    assert values(machine.metrics, ENGINE_BUSY, WHERE) == {("a", "main", "render"): 4.0}
    machine.process(10, "pod-a", {1: busy(6e9)})
    machine.read()
    assert values(machine.metrics, ENGINE_BUSY, WHERE) == {("a", "main", "render"): 6.0}


def test_one_clients_bad_numbers_stop_no_other_pods_counts(machine: Machine) -> None:
    """A 5,000-digit value raised ValueError (int()'s digit limit) and broke every read."""
    machine.cgroup("pod-a", POD_A)
    machine.cgroup("pod-b", POD_B)
    machine.process(10, "pod-a", {1: busy(1e9)})
    bad = "drm-engine-render:\t" + "9" * 5000 + " ns\ndrm-total-vram:\t18446744073709551615\n"
    machine.process(20, "pod-b", {2: bad + busy(2e9, "copy")})
    machine.read()
    machine.process(10, "pod-a", {1: busy(7e9)})
    machine.read()
    assert values(machine.metrics, ENGINE_BUSY, WHERE) == {
        ("a", "main", "render"): 7.0,
        ("b", "main", "copy"): 2.0,
    }
    skipped = values(machine.metrics, FDINFO_SKIPPED)
    assert (skipped[("malformed",)], skipped[("out_of_range",)]) == (2, 2)  # pid 20, twice


def test_an_increment_past_a_double_is_counted_out_of_range_and_left_out(machine: Machine) -> None:
    """A counter past what a double holds failed every push and scrape while the pod lived:
    the table refuses the increment that would take it there (put is False) and Usage counts
    it in out_of_range, keeping the counter and the pod's other engines. (The counter is
    planted near the top: no real fdinfo climbs that far.)"""
    machine.cgroup("pod-a", POD_A)
    machine.process(10, "pod-a", {1: "drm-cycles-render:\t5\n" + busy(1e9)})
    machine.read()
    [point] = dict(machine.metrics.collect())[ENGINE_CYCLES]
    where = Where(*(point.attrs[k] for k in Where._fields))
    top = 2**1024 - 2**970 - 1  # the largest int that float() still rounds to a double
    assert machine.metrics.put(ENGINES[ENGINE_CYCLES], where, "render", top - 5)
    machine.process(10, "pod-a", {1: "drm-cycles-render:\t10\n" + busy(2e9)})
    machine.read()
    assert values(machine.metrics, ENGINE_CYCLES, WHERE) == {("a", "main", "render"): top}
    assert values(machine.metrics, FDINFO_SKIPPED) == {("out_of_range",): 1}
    assert values(machine.metrics, ENGINE_BUSY, WHERE) == {("a", "main", "render"): 2.0}


def test_memory_and_capacity_are_those_of_the_open_clients(machine: Machine) -> None:
    machine.cgroup("pod-a", POD_A)
    memory = "drm-resident-system:\t4 KiB\ndrm-total-system:\t8 KiB\n"
    machine.process(10, "pod-a", {1: busy(1) + memory + "drm-engine-capacity-render:\t2\n"})
    machine.process(11, "pod-a", {2: busy(1) + memory})
    machine.read()
    assert values(machine.metrics, MEMORY, WHERE) == {
        ("a", "main", "system", "resident"): 8192,
        ("a", "main", "system", "total"): 16384,
    }
    assert values(machine.metrics, ENGINE_CAPACITY, WHERE) == {("a", "main", "render"): 2}
    machine.exit(11)
    machine.read()
    assert values(machine.metrics, MEMORY, WHERE)[("a", "main", "system", "resident")] == 4096


def test_a_shared_client_is_counted_once(machine: Machine) -> None:
    machine.cgroup("pod-a", POD_A)
    machine.process(10, "pod-a", {1: busy(3e9)})
    machine.process(11, "pod-a", {1: busy(3e9)})  # fork or SCM_RIGHTS: the same client
    machine.read()
    assert values(machine.metrics, ENGINE_BUSY, WHERE) == {("a", "main", "render"): 3.0}


def test_pending_clients_wait_then_count_everything(machine: Machine) -> None:
    cgroup_id = machine.cgroup("pod-a", None)
    machine.process(10, "pod-a", {1: busy(3e9) + "drm-resident-system:\t4096\n"})
    machine.read()
    assert values(machine.metrics, ENGINE_BUSY, WHERE) == {}
    assert values(machine.metrics, MEMORY, WHERE) == {}
    machine.process(10, "pod-a", {1: busy(4e9) + "drm-resident-system:\t4096\n"})
    machine.resolver.answers[cgroup_id] = POD_A
    machine.read()
    assert values(machine.metrics, ENGINE_BUSY, WHERE) == {("a", "main", "render"): 4.0}
    assert values(machine.metrics, MEMORY, WHERE) == {("a", "main", "system", "resident"): 4096}


def test_pending_too_long_is_counted_with_the_settled_answer(machine: Machine) -> None:
    machine.cgroup("pod-a", None)
    machine.process(10, "pod-a", {1: busy(3e9)})
    machine.read()
    machine.clock.now += 120
    machine.read()
    assert values(machine.metrics, ENGINE_BUSY, WHERE) == {("", "", "render"): 3.0}


def test_a_pending_client_that_closes_is_counted(machine: Machine) -> None:
    machine.cgroup("pod-a", None)
    machine.process(10, "pod-a", {1: busy(3e9)})
    machine.read()
    machine.exit(10)
    machine.read()
    assert values(machine.metrics, ENGINE_BUSY, WHERE) == {("", "", "render"): 3.0}


def test_an_unreadable_holder_keeps_its_client_and_loses_nothing(machine: Machine) -> None:
    machine.cgroup("pod-a", POD_A)
    machine.process(10, "pod-a", {1: busy(3e9)})
    machine.read()
    fd = machine.root / "proc" / "10" / "fd"
    fd.rename(fd.with_name("fd.saved"))
    fd.write_text("")  # listing it fails as unreadable fdinfo does: not vanished
    machine.read()
    fd.unlink()
    fd.with_name("fd.saved").rename(fd)
    machine.process(10, "pod-a", {1: busy(4e9)})
    machine.read()
    assert values(machine.metrics, ENGINE_BUSY, WHERE) == {("a", "main", "render"): 4.0}
    assert values(machine.metrics, FDINFO_SKIPPED, WHERE)[("unreadable",)] == 1


def test_a_client_seen_again_after_closing_splits_energy_by_its_rise_alone(
    machine: Machine,
) -> None:
    """A client taken as closed (no holder had it) is seen again: the interval's busy time that
    splits the device's energy is what it rose since it was last seen (6 - 4 s), not all of
    its busy time since its open, and its counter goes on from 4 s, not twice over."""
    machine.cgroup("pod-a", POD_A)
    machine.process(10, "pod-a", {1: busy(3e9)})
    machine.read()  # the baseline
    machine.process(10, "pod-a", {1: busy(4e9)})
    machine.read()
    machine.process(10, "pod-a", {})  # pid 10 holds it no more: closed
    machine.read()
    machine.process(11, "pod-a", {1: busy(6e9)})  # another holder of the same client
    machine.usage.saw([11], [])
    machine.read()
    [pods] = machine.usage.interval_busy().values()  # the one device
    assert list(pods.values()) == [[2_000_000_000, 0, 0]]
    assert values(machine.metrics, ENGINE_BUSY, WHERE) == {("a", "main", "render"): 6.0}


def test_reads_after_the_first_scan_only_callers_holders_and_their_cgroups(
    machine: Machine,
) -> None:
    machine.cgroup("pod-a", POD_A)
    cgroup_b = machine.cgroup("pod-b", POD_B)
    machine.process(10, "pod-a", {1: busy(1)})
    machine.process(20, "pod-b", {2: busy(1)})
    machine.read()
    assert machine.reader.asked == [None]  # the full scan at start
    machine.process(21, "pod-b", {3: busy(1)})  # not seen calling, but in a calling cgroup
    machine.process(30, "pod-a", {})  # holds nothing
    machine.usage.saw([40], [cgroup_b])  # pid 40 called and exited
    machine.read()
    assert machine.reader.asked[-1] == [10, 20, 21, 40]
    assert values(machine.metrics, ENGINE_BUSY, WHERE)[("b", "main", "render")] == 2e-9
    machine.read()
    assert machine.reader.asked[-1] == [10, 20, 21]


def test_client_cgroups_are_reaped_like_calling_ones(machine: Machine) -> None:
    cgroup_id = machine.cgroup("pod-a", POD_A)
    machine.process(10, "pod-a", {1: busy(1)})
    machine.read()
    assert machine.watched == [cgroup_id]


def test_a_host_process_outside_any_cgroup_v2_is_unlabelled(machine: Machine) -> None:
    machine.cgroup("host", None)
    machine.process(10, "host", {1: busy(2e9)})
    (machine.root / "proc" / "10" / "cgroup").write_text("1:name=systemd:/\n")
    machine.read()
    assert values(machine.metrics, ENGINE_BUSY, WHERE) == {("", "", "render"): 2.0}


def test_paths_relative_to_the_agents_cgroup_namespace_are_found(machine: Machine) -> None:
    """In a pod, /proc/PID/cgroup shows other containers' cgroups from the agent's namespace."""
    machine.cgroup("kubepods/agent", None)
    machine.cgroup("kubepods/pod-a", POD_A)
    machine.process(10, "kubepods/pod-a", {1: busy(2e9)})
    (machine.root / "proc" / "10" / "cgroup").write_text("0::/../pod-a\n")
    machine.process(11, "kubepods/pod-a", {2: busy(1e9)})
    (machine.root / "proc" / "11" / "cgroup").write_text("0::/../../..\n")  # above the root
    machine.read()
    assert values(machine.metrics, ENGINE_BUSY, WHERE) == {
        ("a", "main", "render"): 2.0,
        ("", "", "render"): 1.0,
    }


def test_kubenpuctl_top_reads_the_names_the_agent_exports() -> None:
    assert (ENGINE_BUSY.prometheus_name, MEMORY.prometheus_name) == (top.BUSY, top.MEMORY)


def test_a_gone_pods_busy_series_retire_after_the_ttl(machine: Machine) -> None:
    """The agent hands client cgroups to Attributor.watch(); its reaper retires them."""
    attributor = Attributor([], machine.resolver, machine.metrics)
    cgroup_id = machine.cgroup("pod-a", POD_A)
    machine.process(10, "pod-a", {1: busy(2e9)})
    machine.read()
    for watched in machine.watched:
        attributor.watch(watched)
    machine.exit(10)
    machine.resolver.dead.add(cgroup_id)
    attributor.forget(attributor.dead_cgroups())
    assert values(machine.metrics, ENGINE_BUSY, WHERE) == {("a", "main", "render"): 2.0}
    machine.clock.now += 60
    assert values(machine.metrics, ENGINE_BUSY, WHERE) == {}


def test_fdinfo_out_of_descriptors_is_counted_logged_and_loses_nothing(
    machine: Machine, caplog: pytest.LogCaptureFixture
) -> None:
    """EMFILE while reading fdinfo was logged as 80 unreadable reads and never counted as what
    it was; a client whose holder could not be read must not be taken as closed."""
    machine.cgroup("pod-a", POD_A)
    machine.process(10, "pod-a", {1: busy(3e9)})
    machine.read()
    machine.process(10, "pod-a", {1: busy(5e9)})
    machine.usage.saw([10], [])
    with caplog.at_level(logging.WARNING), out_of_descriptors():
        machine.read()
        machine.read()
    assert values(machine.metrics, FDINFO_SKIPPED)[("no_descriptors",)] == 2
    assert values(machine.metrics, DESCRIPTORS_EXHAUSTED)[("fdinfo",)] == 2
    assert sum("out of file descriptors" in r.message for r in caplog.records) == 1
    machine.read()  # descriptors back: the client continues, neither lost nor counted again
    assert values(machine.metrics, ENGINE_BUSY, WHERE) == {("a", "main", "render"): 5.0}
