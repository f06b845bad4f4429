"""The access guard's policy and map writes (kubenpu.sources.guard, kubenpu.kernel.guard) against
a fake kernel as strict as the real one: maps that take only keys and values of their declared
sizes and refuse a new key when full, and `decide`, bpf/guard.bpf.c's decision read from the
raw map bytes. tests/test_guard_vm.py runs the real programs."""

from __future__ import annotations

import errno
import logging
import re
import struct
from pathlib import Path

import pytest
from test_core_loader import Kernel
from test_core_loader import kernel as libbpf  # noqa: F401 (fixture)

from kubenpu.config import GuardConfig
from kubenpu.discovery import Device, Node
from kubenpu.kernel import guard as g
from kubenpu.kernel import hooks
from kubenpu.kernel.errors import ProbeError
from kubenpu.sources.guard import Denial, DenialLog, Planner, Pod, Rule, Settings, denials

MAX_ENTRIES = {g.CONFIG: 1, g.GUARDED: 1024, g.PODS: 65536, g.ALLOWED: 65536, g.TALLY: 65536}
S_IFCHR, S_IFBLK = 0o020000, 0o060000
OPEN, IOCTL, RECEIVE = 0, 1, 2
KERNEL_SYMBOLS = hooks.kernel_symbols  # the real one: the libbpf fixture stands in its own
SOURCE = Path(__file__).parent.parent / "bpf" / "guard.bpf.c"


class FakeMaps:
    """The guard object's maps: raw keys and values of exact sizes, like the bpf syscall."""

    def __init__(self) -> None:
        self.data: dict[str, dict[bytes, bytes]] = {n: {} for n in g.MAP_NAMES}
        self.writes: list[tuple[str, str, bytes]] = []
        self.after_write = lambda: None

    def _check(self, name: str, key: bytes, value: bytes | None = None) -> None:
        if len(key) != g.KEY_SIZES[name] or (
            value is not None and len(value) != g.VALUE_SIZES[name]
        ):
            raise OSError(errno.EINVAL, f"{name}: wrong key or value size")

    def update(self, name: str, key: bytes, value: bytes) -> None:
        self._check(name, key, value)
        if name == g.CONFIG and struct.unpack("=I", key)[0] >= MAX_ENTRIES[name]:
            raise OSError(errno.E2BIG, "array index out of range")
        table = self.data[name]
        if key not in table and len(table) >= MAX_ENTRIES[name]:
            raise OSError(errno.E2BIG, f"{name} is full")
        table[key] = value
        self.writes.append(("update", name, key))
        self.after_write()

    def delete(self, name: str, key: bytes) -> bool:
        self._check(name, key)
        if name == g.CONFIG:
            raise OSError(errno.EINVAL, "array elements cannot be deleted")
        found = self.data[name].pop(key, None) is not None
        self.writes.append(("delete", name, key))
        self.after_write()
        return found

    def keys(self, name: str) -> list[bytes]:
        return list(self.data[name])

    def lookup(self, name: str, key: bytes) -> bytes | None:
        self._check(name, key)
        return self.data[name].get(key)


class FakeKernel:
    """bpf/guard.bpf.c's decide() over FakeMaps, at a settable CLOCK_MONOTONIC."""

    def __init__(self, maps: FakeMaps) -> None:
        self.maps = maps
        self.now_ns = 0

    def _count(self, cgroup_id: int, dev: int, op: int, verdict: int) -> None:
        key = g.TALLY_KEY.pack(cgroup_id, dev, op, verdict, 0)
        table = self.maps.data[g.TALLY]
        table[key] = g.U64.pack(g.U64.unpack(table.get(key, bytes(8)))[0] + 1)

    def decide(self, cgroup_id: int, dev: int, op: int, i_mode: int = S_IFCHR, ancestor=0) -> int:
        data = self.maps.data
        if i_mode != S_IFCHR or g.U32.pack(dev) not in data[g.GUARDED]:
            return 0
        raw = data[g.CONFIG].get(g.U32.pack(0), bytes(g.CONFIG_VALUE.size))  # an array: zeroes
        beat, fail_open, kubepods, _, _ = g.CONFIG_VALUE.unpack(raw)
        pod = data[g.PODS].get(g.U64.pack(cgroup_id))
        if pod is None:
            if kubepods and ancestor == kubepods:
                self._count(cgroup_id, dev, op, g.VERDICTS.index("unseen"))
            return 0
        number, mode = g.POD.unpack(pod)
        if mode == 0:
            return 0
        if g.ACCESS.pack(number, dev) in data[g.ALLOWED]:
            self._count(cgroup_id, dev, op, g.VERDICTS.index("allowed"))
            return 0
        if not beat or (self.now_ns - beat) % 2**64 > fail_open:
            self._count(cgroup_id, dev, op, g.VERDICTS.index("failed_open"))
            return 0
        verdict = "audited" if mode == 1 else "denied"
        self._count(cgroup_id, dev, op, g.VERDICTS.index(verdict))
        return 0 if mode == 1 else -errno.EPERM


GPU0 = Device("0000:03:00.0", "amdgpu", "1002:740f", 0, (
    Node("/dev/dri/card0", "card0", 226, 0), Node("/dev/dri/renderD128", "renderD128", 226, 128)
), "amd")  # fmt: skip
GPU1 = Device("0000:04:00.0", "amdgpu", "1002:740f", 0, (
    Node("/dev/dri/card1", "card1", 226, 1), Node("/dev/dri/renderD129", "renderD129", 226, 129)
), "amd")  # fmt: skip
NPU = Device("0000:05:00.0", "amdxdna", "1022:17f0", 0, (
    Node("/dev/accel/accel0", "accel0", 261, 0),
), "amd")  # fmt: skip
DEVICES = [GPU0, GPU1, NPU]
RENDER0, RENDER1 = g.mkdev(226, 128), g.mkdev(226, 129)
CARD0, CARD1 = g.mkdev(226, 0), g.mkdev(226, 1)
ACCEL0 = g.mkdev(261, 0)
A = Pod("uid-a", "team", "a", frozenset({101, 102}), frozenset({GPU0.id}))
B = Pod("uid-b", "team", "b", frozenset({201}), frozenset())
KUBEPODS = 50
SECOND = 10**9
CLOCK = g.Clock(30 * SECOND, (KUBEPODS, 1))


def _guard(settings: Settings, pods=(A, B), managed=(GPU0.id, GPU1.id)):
    maps = FakeMaps()
    kernel, writer, planner = FakeKernel(maps), g.Writer(maps), Planner(settings)
    kernel.now_ns = 1000 * SECOND
    writer.beat(kernel.now_ns, CLOCK)
    writer.apply(planner.plan(pods, DEVICES, set(managed)))
    return kernel, writer, planner


def _verdicts(writer: g.Writer) -> dict[tuple[int, int, str, str], int]:
    return writer.tallies()


def test_enforce_allows_the_allocated_device_and_denies_the_rest():
    kernel, writer, _ = _guard(Settings(mode="enforce"))
    assert kernel.decide(101, RENDER0, OPEN) == 0  # A's own, from each of its containers
    assert kernel.decide(102, CARD0, IOCTL) == 0
    assert kernel.decide(101, RENDER1, OPEN) == -errno.EPERM  # not A's
    assert kernel.decide(201, RENDER0, OPEN) == -errno.EPERM  # B has nothing
    assert kernel.decide(201, RENDER0, IOCTL) == -errno.EPERM  # an fd A passed to B
    assert _verdicts(writer) == {
        (101, RENDER0, "open", "allowed"): 1,
        (102, CARD0, "ioctl", "allowed"): 1,
        (101, RENDER1, "open", "denied"): 1,
        (201, RENDER0, "open", "denied"): 1,
        (201, RENDER0, "ioctl", "denied"): 1,
    }


def test_unmanaged_devices_other_files_and_host_processes_are_never_touched():
    kernel, writer, _ = _guard(Settings(mode="enforce"))
    assert kernel.decide(201, ACCEL0, OPEN) == 0  # no plugin manages the NPU
    assert kernel.decide(201, RENDER0, OPEN, i_mode=S_IFBLK) == 0  # same numbers, not a char dev
    assert kernel.decide(1, RENDER0, OPEN) == 0  # the host: not under kubepods
    assert _verdicts(writer) == {}


def test_a_pod_cgroup_the_agent_has_not_seen_is_allowed_and_counted():
    kernel, writer, _ = _guard(Settings(mode="enforce"))
    assert kernel.decide(301, RENDER0, OPEN, ancestor=KUBEPODS) == 0
    assert _verdicts(writer) == {(301, RENDER0, "open", "unseen"): 1}


def test_audit_counts_and_allows_and_namespaces_override():
    settings = Settings(mode="audit", namespaces={"prod": "enforce", "lab": "off"})
    prod = Pod("uid-p", "prod", "p", frozenset({401}), frozenset())
    lab = Pod("uid-l", "lab", "l", frozenset({501}), frozenset())
    kernel, writer, _ = _guard(settings, pods=(A, B, prod, lab))
    assert kernel.decide(201, RENDER0, OPEN) == 0
    assert kernel.decide(401, RENDER0, OPEN) == -errno.EPERM
    assert kernel.decide(501, RENDER0, OPEN) == 0
    assert _verdicts(writer) == {
        (201, RENDER0, "open", "audited"): 1,
        (401, RENDER0, "open", "denied"): 1,
    }


def test_allow_rules_by_namespace_and_device():
    settings = Settings(mode="enforce", allow=(Rule("team", GPU1.id), Rule(device=GPU0.id)))
    kernel, _, _ = _guard(settings)
    assert kernel.decide(201, RENDER1, OPEN) == 0
    assert kernel.decide(201, RENDER0, OPEN) == 0
    other = Pod("uid-o", "other", "o", frozenset({601}), frozenset())
    kernel, _, _ = _guard(settings, pods=(other,))
    assert kernel.decide(601, RENDER1, OPEN) == -errno.EPERM
    assert kernel.decide(601, CARD0, OPEN) == 0


def test_a_stale_heartbeat_fails_open_and_counts():
    kernel, writer, _ = _guard(Settings(mode="enforce"))
    kernel.now_ns += CLOCK.fail_open_ns  # exactly the bound: still guarded
    assert kernel.decide(201, RENDER0, OPEN) == -errno.EPERM
    kernel.now_ns += 1
    assert kernel.decide(201, RENDER0, OPEN) == 0
    assert kernel.decide(101, RENDER0, OPEN) == 0  # A's own: allowed, not failed open
    writer.beat(kernel.now_ns, CLOCK)
    assert kernel.decide(201, RENDER0, OPEN) == -errno.EPERM
    assert _verdicts(writer)[201, RENDER0, "open", "failed_open"] == 1


def test_no_beat_yet_fails_open():
    maps = FakeMaps()
    kernel, writer = FakeKernel(maps), g.Writer(maps)
    writer.apply(Planner(Settings(mode="enforce")).plan([B], DEVICES, {GPU0.id}))
    assert kernel.decide(201, RENDER0, OPEN) == 0
    assert writer.tallies() == {(201, RENDER0, "open", "failed_open"): 1}


def _allowed_everywhere(maps: FakeMaps, kernel: FakeKernel, access: list[tuple[int, int]]):
    """Checks after every single map write that none of `access` is denied."""

    def check() -> None:
        for cgroup_id, dev in access:
            assert kernel.decide(cgroup_id, dev, OPEN) == 0, (cgroup_id, dev, maps.writes[-1])

    return check


def test_no_write_order_denies_what_both_policies_allow_or_a_new_cgroup_its_own():
    """A refresh that adds pod C with its device, a container and GPU1 to B, and keeps A: at no
    single map write between the two policies is an access denied that both allow, or one of a
    cgroup new in the refresh (C's, B's new container) that the new policy allows."""
    kernel, writer, planner = _guard(Settings(mode="enforce"))
    b_grown = Pod("uid-b", "team", "b", frozenset({201, 202}), frozenset({GPU1.id}))
    c = Pod("uid-c", "team", "c", frozenset({301}), frozenset({GPU0.id}))
    kernel.maps.writes.clear()
    kernel.maps.after_write = _allowed_everywhere(
        kernel.maps, kernel, [(101, RENDER0), (301, RENDER0), (202, RENDER1)]
    )
    writer.apply(planner.plan([A, b_grown, c], DEVICES, {GPU0.id, GPU1.id}))
    assert len(kernel.maps.writes) == 6  # C's and B's 2 nodes each, then cgroups 202 and 301
    assert kernel.decide(201, RENDER1, OPEN) == 0
    assert kernel.decide(201, RENDER0, OPEN) == -errno.EPERM
    assert planner.number("uid-b") == 2  # kept across refreshes


def test_a_removed_pod_leaves_no_key_behind():
    kernel, writer, planner = _guard(Settings(mode="enforce"))
    writer.apply(planner.plan([B], DEVICES, {GPU0.id, GPU1.id}))
    assert kernel.decide(101, RENDER0, OPEN) == 0  # A's cgroups: no longer pods
    assert kernel.maps.data[g.ALLOWED] == {}
    assert set(kernel.maps.data[g.PODS]) == {g.U64.pack(201)}


def test_apply_writes_only_what_changed():
    kernel, writer, planner = _guard(Settings(mode="enforce"))
    kernel.maps.writes.clear()
    writer.apply(planner.plan([A, B], DEVICES, {GPU0.id, GPU1.id}))
    assert kernel.maps.writes == []


def test_forget_deletes_gone_cgroups_tallies_only():
    kernel, writer, _ = _guard(Settings(mode="enforce"))
    kernel.decide(201, RENDER0, OPEN)
    kernel.decide(101, RENDER0, OPEN)
    writer.forget([201])
    assert list(writer.tallies()) == [(101, RENDER0, "open", "allowed")]


def test_denials_sum_a_pods_cgroups_by_device_and_mode():
    tallies = {
        (101, RENDER1, "open", "denied"): 2,
        (102, CARD1, "open", "denied"): 3,
        (101, RENDER1, "open", "allowed"): 9,
        (201, RENDER0, "ioctl", "audited"): 4,
        (999, RENDER0, "open", "denied"): 5,  # a cgroup the agent no longer knows
    }
    found = sorted(denials(tallies, [A, B], DEVICES), key=lambda d: d.pod.uid)
    assert found == [
        Denial(A, GPU1.id, "open", "enforce", 5),
        Denial(B, GPU0.id, "ioctl", "audit", 4),
    ]


def test_denial_log_is_one_line_per_pod_and_device_per_interval(caplog):
    now = [0.0]
    notes = DenialLog(clock=lambda: now[0])
    caplog.set_level(logging.WARNING)
    notes.note([Denial(B, GPU0.id, "open", "enforce", 1)])
    notes.note([Denial(B, GPU0.id, "open", "enforce", 2)])  # within the interval
    now[0] = 61.0
    notes.note([Denial(B, GPU0.id, "open", "enforce", 2)])  # no rise
    notes.note([Denial(B, GPU0.id, "ioctl", "enforce", 1)])
    assert [r.getMessage() for r in caplog.records] == [
        "guard denied open 1 time(s) to pod team/b on device 0000:03:00.0",
        "guard denied ioctl 1 time(s) to pod team/b on device 0000:03:00.0",
    ]


def test_the_fake_refuses_what_the_kernel_refuses():
    maps = FakeMaps()
    with pytest.raises(OSError):
        maps.update(g.PODS, g.U32.pack(1), g.POD.pack(1, 2))  # a 4-byte key for a u64 map
    for i in range(MAX_ENTRIES[g.GUARDED]):
        maps.update(g.GUARDED, g.U32.pack(i), g.U8.pack(1))
    with pytest.raises(OSError):
        maps.update(g.GUARDED, g.U32.pack(1 << 30), g.U8.pack(1))


def test_lsm_active(tmp_path):
    lsm = tmp_path / "lsm"
    lsm.write_text("lockdown,capability,landlock,yama,apparmor,tomoyo,bpf,ipe,ima,evm\n")
    assert g.lsm_active(lsm)
    lsm.write_text("lockdown,capability,landlock,yama,apparmor\n")
    assert not g.lsm_active(lsm)
    assert not g.lsm_active(tmp_path / "absent")


@pytest.mark.parametrize(
    ("lsm", "cap_eff", "said"),
    [
        ("capability,apparmor", 1 << 39 | 1 << 38, "does not run the BPF LSM"),
        ("capability,bpf", 1 << 39, "needs CAP_PERFMON"),
        ("capability,bpf", 0, "needs CAP_BPF, CAP_PERFMON"),
        ("capability,bpf", 1 << 39 | 1 << 38, ""),
        ("capability,bpf", 1 << 21, ""),  # CAP_SYS_ADMIN
    ],
)
def test_check_says_in_one_line_why_the_guard_is_off(tmp_path, lsm, cap_eff, said):
    (tmp_path / "lsm").write_text(lsm)
    (tmp_path / "status").write_text(f"Name:\tkubenpu\nCapEff:\t{cap_eff:016x}\n")
    if not said:
        g.check(tmp_path / "lsm", tmp_path / "status")
        return
    with pytest.raises(ProbeError, match=said) as err:
        g.check(tmp_path / "lsm", tmp_path / "status")
    assert "\n" not in str(err.value)


def _defines(prefix: str) -> list[str]:
    """bpf/guard.bpf.c's `#define <prefix>NAME n`, by n (which must run 0, 1, ... with no gap)."""
    found = dict(
        (int(n), name.lower())
        for name, n in re.findall(rf"#define {prefix}(\w+) (\d+)", SOURCE.read_text())
    )
    assert sorted(found) == list(range(len(found))), found
    return [found[n] for n in sorted(found)]


def test_names_mirror_the_programs():
    assert tuple(_defines("OP_")) == g.OPERATIONS == ("open", "ioctl", "receive")
    assert tuple(_defines("VERDICT_")) == g.VERDICTS
    assert tuple(_defines("MODE_")) == g.MODES


def test_a_receive_tally_is_read_as_receive():
    """The bug: a receive (op 2) tally read with the old ("open", "ioctl") raised IndexError,
    and every tally read (the series, the denial log) with it."""
    kernel, writer, _ = _guard(Settings("enforce"))
    assert kernel.decide(201, RENDER0, RECEIVE) == -errno.EPERM
    assert kernel.decide(101, RENDER0, RECEIVE) == 0
    assert writer.tallies() == {
        (201, RENDER0, "receive", "denied"): 1,
        (101, RENDER0, "receive", "allowed"): 1,
    }
    found = denials(writer.tallies(), [A, B], DEVICES)
    assert found == [Denial(B, GPU0.id, "receive", "enforce", 1)]
    writer.maps.data[g.TALLY][g.TALLY_KEY.pack(201, RENDER0, RECEIVE + 1, 1, 0)] = g.U64.pack(1)
    with pytest.raises(IndexError):  # one past the last operation: not a name the agent makes up
        writer.tallies()


def test_the_ioctl_knob_defaults_off():
    assert GuardConfig().ioctl is False
    assert GuardConfig(ioctl=True).ioctl is True
    with pytest.raises(ValueError):
        GuardConfig(ioctl="sometimes")


COMPAT_LINE = "ffffffff81000000 T bpf_lsm_file_ioctl_compat\n"


@pytest.mark.parametrize(
    ("ioctl", "kallsyms", "programs"),
    [
        (False, COMPAT_LINE, ["guard_file_open", "guard_file_receive"]),  # no ioctl hook at all
        (True, "", ["guard_file_ioctl", "guard_file_open", "guard_file_receive"]),  # before 6.8
        (True, COMPAT_LINE, [
            "guard_file_ioctl", "guard_file_ioctl_compat", "guard_file_open", "guard_file_receive"
        ]),
    ],
)  # fmt: skip
def test_only_the_chosen_hooks_are_loaded_and_attached(
    libbpf: Kernel,  # noqa: F811
    monkeypatch,
    tmp_path,
    ioctl,
    kallsyms,
    programs,
):
    """The rest of the object's programs are not loaded (autoload off): with guard.ioctl off no
    program of the guard is on file_ioctl, and every ioctl on the node pays nothing for it."""
    monkeypatch.setattr(hooks, "kernel_symbols", KERNEL_SYMBOLS)
    (tmp_path / "kallsyms").write_text("ffffffff81000001 T bpf_lsm_file_open\n" + kallsyms)
    guard = g.GuardKernel(kallsyms=tmp_path / "kallsyms", ioctl=ioctl)
    said = guard.start(g.Policy(), CLOCK, SECOND)
    assert said == "lsm " + "+".join(p.removeprefix("guard_") for p in programs)
    assert sorted(libbpf.autoloaded) == programs
    assert libbpf.attached == programs
    guard.close()
    assert libbpf.destroyed == programs
