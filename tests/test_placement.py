"""The placement scheduler's loader checks, map writer and feeder (kubenpu.kernel.placement,
kubenpu.sources.placement) against a fake kernel as strict as the real one: a `prefer` map that
takes only 8-byte keys and 4-byte values and refuses a new key when full, and a sched_ext sysfs
directory. tests/test_scheduler_vm.py runs the real scheduler on 7.3."""

from __future__ import annotations

import errno
import logging
from pathlib import Path

import pytest
from fakes import FakeResolver, fake_node
from helpers import helm_values, make_config, render_helm

from kubenpu.discovery import Device
from kubenpu.kernel import placement as pl
from kubenpu.kernel.errors import Cause, ProbeError
from kubenpu.resolve.result import Attribution
from kubenpu.sources import registry
from kubenpu.sources.base import Node, Report
from kubenpu.sources.placement import Placement, build, preferred

MAX_ENTRIES = 65536  # bpf/placement.bpf.c's prefer
POD = Attribution("team-a", "trainer-0", "main", pod_uid="u1")
HOST = Attribution(reason="not_pod")
GPU0 = Device("0000:01:00.0", "amdgpu", "1002:744c", 0, (), "amdgpu")
GPU1 = Device("0000:81:00.0", "amdgpu", "1002:744c", 1, (), "amdgpu")
IGPU = Device("0000:00:02.0", "i915", "8086:5917", None, (), "i915")  # no NUMA node


class FakePrefer:
    """The `prefer` hash map: raw keys and values of exact sizes, like the bpf syscall."""

    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}

    def update(self, key: bytes, value: bytes) -> None:
        if len(key) != 8 or len(value) != 4:
            raise OSError(errno.EINVAL, "wrong key or value size")
        if key not in self.data and len(self.data) >= MAX_ENTRIES:
            raise OSError(errno.E2BIG, "prefer is full")
        self.data[key] = value

    def delete(self, key: bytes) -> bool:
        if len(key) != 8:
            raise OSError(errno.EINVAL, "wrong key size")
        return self.data.pop(key, None) is not None  # bpfsys.delete: False when absent

    def held(self) -> dict[int, int]:
        return {pl.U64.unpack(k)[0]: pl.U32.unpack(v)[0] for k, v in self.data.items()}


class FakeKernel:
    def __init__(self) -> None:
        self.prefer = FakePrefer()
        self.writer: pl.Writer | None = None
        self.closed = False

    def start(self, prefer) -> None:
        self.writer = pl.Writer(self.prefer)
        self.writer.apply(prefer)

    def close(self) -> None:
        self.writer, self.closed = None, True


def _status(tmp_path: Path, caps: int) -> Path:
    status = tmp_path / "status"
    status.write_text(f"Name:\tkubenpu\nCapEff:\t{caps:016x}\n")
    return status


def _sched_ext(tmp_path: Path, state: str = "disabled") -> Path:
    root = tmp_path / "sched_ext"
    root.mkdir()
    (root / "state").write_text(state + "\n")
    return root


ADMIN_NICE = 1 << 21 | 1 << 23


def test_check_passes_with_sched_ext_disabled_and_both_capabilities(tmp_path: Path) -> None:
    pl.check(_sched_ext(tmp_path), _status(tmp_path, ADMIN_NICE))


def test_a_kernel_without_sched_ext_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ProbeError, match="the kernel has no sched_ext") as err:
        pl.check(tmp_path / "absent", _status(tmp_path, ADMIN_NICE))
    assert "measurement goes on" in str(err.value) and "\n" not in str(err.value)


def test_another_scheduler_loaded_is_not_replaced(tmp_path: Path) -> None:
    with pytest.raises(ProbeError, match="another sched_ext scheduler is enabled"):
        pl.check(_sched_ext(tmp_path, "enabled"), _status(tmp_path, ADMIN_NICE))


@pytest.mark.parametrize(
    ("caps", "missing"),
    [(1 << 21, "CAP_SYS_NICE"), (1 << 23, "CAP_BPF"), (1 << 38 | 1 << 39, "CAP_SYS_NICE")],
)
def test_missing_capabilities_are_named(tmp_path: Path, caps: int, missing: str) -> None:
    with pytest.raises(ProbeError, match=missing) as err:
        pl.check(_sched_ext(tmp_path), _status(tmp_path, caps))
    assert err.value.cause == Cause.CAPABILITIES


def test_the_writer_changes_only_what_differs() -> None:
    prefer = FakePrefer()
    writer = pl.Writer(prefer)
    writer.apply({10: 1, 11: 0})
    assert prefer.held() == {10: 1, 11: 0}
    writer.apply({10: 0, 12: 1})
    assert prefer.held() == {10: 0, 12: 1}
    writer.apply({})
    assert prefer.held() == {}


def test_pods_cgroups_prefer_their_devices_node() -> None:
    resolver = FakeResolver()
    resolver.answers = {1: POD, 2: POD, 3: HOST, 4: POD}
    nodes = {GPU0.id: 0, GPU1.id: 1}
    used = {1: {GPU1.id}, 2: {GPU1.id, GPU0.id}, 3: {GPU1.id}, 4: {IGPU.id}, 5: {GPU0.id}}
    # 3: a host process; 4: a device without a node; 5: not named yet (pending)
    assert preferred(used, nodes, resolver) == {1: 1, 2: 0}


def _feeder(
    tmp_path: Path, used: dict[int, set[str]], states: list[str] | None = None
) -> tuple[Placement, FakeKernel, list]:
    states = states or ["enabled"]
    resolver = FakeResolver()
    resolver.answers = {7: POD}
    cgroup = tmp_path / "kubepods.slice" / "cri-containerd-7.scope"
    cgroup.mkdir(parents=True)
    (cgroup / "cgroup.threads").write_text("100\n101\n")
    resolver.paths = {7: str(cgroup)}
    kernel = FakeKernel()
    kernel.start({})
    switched: list[list[int]] = []
    table = registry.table(300, 100)
    feeder = Placement(
        kernel,
        [GPU0, GPU1],
        lambda: used,
        resolver,
        Report("placement", table),
        to_sched_ext=lambda tids: switched.append(tids) or len(tids),
        state=lambda: states[0],
    )
    return feeder, kernel, switched


def test_the_feeder_maps_a_pod_to_its_node_and_switches_its_threads(tmp_path: Path) -> None:
    used = {7: {GPU1.id}}
    feeder, kernel, switched = _feeder(tmp_path, used)
    assert feeder.read()
    assert kernel.prefer.held() == {7: 1} and switched == [[100, 101]]
    used.clear()  # the pod is gone
    assert feeder.read()
    assert kernel.prefer.held() == {} and switched == [[100, 101]]
    feeder.close()
    assert kernel.closed


def test_a_gone_cgroup_switches_nothing(tmp_path: Path) -> None:
    feeder, kernel, switched = _feeder(tmp_path, {7: {GPU1.id}})
    (tmp_path / "kubepods.slice" / "cri-containerd-7.scope" / "cgroup.threads").unlink()
    assert feeder.read()
    assert kernel.prefer.held() == {7: 1} and switched == [[]]


def test_a_scheduler_the_kernel_disabled_is_unloaded_with_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    states = ["enabled"]
    feeder, kernel, switched = _feeder(tmp_path, {7: {GPU1.id}}, states)
    assert feeder.read()
    states[0] = "disabled"  # the watchdog found a stall
    with caplog.at_level(logging.WARNING, "kubenpu"):
        assert feeder.read()
        assert feeder.read()
    assert kernel.closed and len(caplog.records) == 1
    assert "the kernel disabled it (sched_ext disabled" in caplog.records[0].getMessage()
    assert switched == [[100, 101]]


@pytest.fixture
def node(tmp_path: Path) -> Node:
    cfg = make_config(tmp_path, "placement:\n  scheduler: true\n")
    return fake_node(cfg, [GPU0, GPU1])


def test_off_by_default(node: Node) -> None:
    node.cfg.placement.scheduler = False
    assert build(node, FakeKernel, lambda: None) is None


def test_a_node_that_cannot_run_it_logs_one_line_and_keeps_measuring(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    def refuse() -> None:
        raise ProbeError("the kernel has no sched_ext (/sys/kernel/sched_ext): ...")

    with caplog.at_level(logging.WARNING, "kubenpu"):
        assert build(node, FakeKernel, refuse) is None
    assert [r.getMessage() for r in caplog.records] == [
        "placement scheduler: the kernel has no sched_ext (/sys/kernel/sched_ext): ..."
    ]


def test_devices_without_a_numa_node_leave_it_off(node: Node) -> None:
    node.watched = [IGPU]
    assert build(node, FakeKernel, lambda: None) is None


def test_built_with_the_scheduler_loaded(node: Node) -> None:
    feeder = build(node, FakeKernel, lambda: None)
    assert isinstance(feeder, Placement)
    kernel = feeder._kernel
    assert kernel.writer is not None and kernel.prefer.held() == {}
    feeder.close()
    assert kernel.closed


@pytest.mark.parametrize(("hook", "added"), [("security_file_ioctl", 1), ("drm_ioctl", 1)])
def test_the_chart_adds_the_schedulers_needs_only_when_it_is_on(hook: str, added: int) -> None:
    def agent(scheduler: bool | None) -> dict:
        values = helm_values()
        values["config"]["probe"]["hook"] = hook
        if scheduler is not None:
            values["config"]["placement"] = {"scheduler": scheduler}
        (ds,) = (d for d in render_helm(values) if d["kind"] == "DaemonSet")
        return ds["spec"]["template"]["spec"]

    default, off, on = agent(None), agent(False), agent(True)
    caps = [s["containers"][0]["securityContext"]["capabilities"]["add"] for s in (off, on)]
    assert default["hostPID"] is False and off["hostPID"] is False and on["hostPID"] is True
    assert "SYS_NICE" in caps[1] and "SYS_NICE" not in caps[0]
    assert len(caps[1]) == len(caps[0]) + added  # the probe's set already loads the scheduler
