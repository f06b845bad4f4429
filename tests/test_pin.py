"""kubenpu/kernel/pinned.py, maps.py and bpfsys.py against the real bpf(2) syscall and a real bpffs.

Each check runs in a forked child with its own mount namespace and bpffs (helpers.in_private_bpffs).
What cannot run here is a program load and an attach: `MapLoader` stands in for a loader
(kernel.bcc.BccKernel, kernel.core.CoreKernel) with real maps of the same layout, and pins an
array map where a bpf_link would be. The real programs, links and kernel are tested in
tests/test_restart_vm.py.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import in_private_bpffs

from kubenpu.agent import main
from kubenpu.discovery import Device, Node
from kubenpu.kernel import abi, bpfsys
from kubenpu.kernel.abi import GATE_CLOSED, GATE_HANDOVER, GATE_OPEN, LINK, dev_t
from kubenpu.kernel.child import load_in_child
from kubenpu.kernel.maps import CountsReader, empty_devices, tables, vendor_ids
from kubenpu.kernel.pinned import PinnedProbe
from kubenpu.kernel.pins import BIRTHS_LINK, META, pin_objects, uninstall
from kubenpu.sources.calls.events import Key

VGEM = Device(
    "platform:vgem", "vgem", None, None, (Node("/dev/dri/card0", "card0", 226, 0),), "vgem"
)
KEY = Key(4242, 226, 0, 2)
LINK_DRM = f"{LINK}drm_ioctl"


def attached(pinned: list[str]) -> bool:
    return any(name.startswith(LINK) for name in pinned)


class MapLoader:
    """The loaders' part PinnedProbe uses, with real maps and no program. Pickled into a
    loader child it makes maps of its own there, as BccKernel loads its own."""

    def __init__(
        self,
        digest: str = "a",
        aggregate: bool = True,
        births: bool = True,
        counts_entries: int = 1024,
    ) -> None:
        self.aggregate = aggregate
        self._counts_entries = counts_entries
        self.hook = "drm_ioctl"
        self.loader = "maps"
        self.gate_open = True
        self.before_attach: Callable[[], None] | None = None
        self._digest = digest
        self._births = births
        self.started = False
        self.ncpus = bpfsys.possible_cpus()
        self.remote: dict[Key, int] = {}  # as of the last read_counts
        self._make_maps()

    def _make_maps(self) -> None:
        self.fds = {
            "minors": bpfsys.map_create(abi.MAP_TYPE_ARRAY, 4, 4, abi.MINORS_ENTRIES, "minors"),
            "devices": bpfsys.map_create(abi.MAP_TYPE_HASH, 4, 4, 256, "devices"),
            "ioctls": bpfsys.map_create(abi.MAP_TYPE_ARRAY, 4, 4, abi.IOCTL_SLOTS, "ioctls"),
            "lost": bpfsys.map_create(abi.MAP_TYPE_PERCPU_ARRAY, 4, 8, 4, "lost"),
            "events": bpfsys.map_create(abi.MAP_TYPE_RINGBUF, 0, 0, 4096, "events"),
            "gate": bpfsys.map_create(abi.MAP_TYPE_ARRAY, 4, 4, 1, "gate"),
            f"{LINK}drm_ioctl": bpfsys.map_create(abi.MAP_TYPE_ARRAY, 4, 4, 1, "link"),
        }
        if self._births:
            self.fds[BIRTHS_LINK] = bpfsys.map_create(abi.MAP_TYPE_ARRAY, 4, 4, 1, "births")
        if self.aggregate:
            self.fds["counts"] = bpfsys.map_create(
                abi.MAP_TYPE_PERCPU_HASH, 16, 16, self._counts_entries, "counts"
            )

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "fds"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._make_maps()

    def digest(self) -> str:
        return self._digest

    def start(self, on_record) -> str:
        set_gate(self.fds["gate"], GATE_OPEN if self.gate_open else GATE_CLOSED)
        if self.before_attach:
            self.before_attach()
        self.started = True
        return "fentry-module"

    def objects(self) -> dict[str, int]:
        return dict(self.fds)

    def shapes(self) -> dict[str, abi.MapShape]:
        """What the kernel says of the maps it made (links aside)."""
        return {n: bpfsys.map_shape(fd) for n, fd in self.fds.items() if not n.startswith(LINK)}

    def count(self, key: Key, n: int) -> None:
        """What the program does for `n` calls (made on every CPU)."""
        add_count(self.fds["counts"], key, n, self.ncpus)

    def lose(self, slot: int, n: int) -> None:
        value = struct.pack(f"={self.ncpus}Q", *spread(n, self.ncpus))
        bpfsys.update(self.fds["lost"], struct.pack("=I", slot), value)

    def read_counts(self) -> dict[Key, int]:
        reader = CountsReader(self.fds["counts"])
        counts, self.remote = reader.read(), reader.remote()
        return counts

    def read_remote(self) -> dict[Key, int]:
        return self.remote

    def read_lost(self) -> dict[str, int]:
        return {}

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)


def set_gate(fd: int, value: int) -> None:
    bpfsys.update(fd, struct.pack("=I", 0), struct.pack("=I", value))


def gate(probe_dir: Path) -> int:
    return struct.unpack("=I", bpfsys.lookup(bpfsys.obj_get(probe_dir / "gate"), b"\0" * 4, 4))[0]


def device_table(probe_dir: Path) -> dict[int, int]:
    """The nonzero slots of a probe's `minors` array: slot -> vendor id + 1."""
    fd = bpfsys.obj_get(probe_dir / "minors")
    slots = {i: bpfsys.lookup(fd, struct.pack("=I", i), 4) for i in range(abi.MINORS_ENTRIES)}
    os.close(fd)
    return {i: v for i, raw in slots.items() if (v := struct.unpack("=I", raw)[0])}


def pins(root: Path) -> dict[str, list[str]]:
    return {p.name: sorted(q.name for q in p.iterdir()) for p in root.iterdir()}


def spread(n: int, ncpus: int) -> list[int]:
    """n calls as programs on every CPU count them: each CPU's slot its share (a reader of one
    slot reads less; tests/fakes.py's PerCpuBpf does it on more CPUs than this host has)."""
    return [n // ncpus + (cpu < n % ncpus) for cpu in range(ncpus)]


def add_count(fd: int, key: Key, n: int, ncpus: int, remote: int = 0) -> None:
    """n calls of key, `remote` of them from another NUMA node, spread over every CPU: each
    CPU's {calls, remote} value (abi.COUNT_VALUE)."""
    packed = struct.pack("=QII", key.cgroup_id, dev_t(key.major, key.minor), key.kind)
    old = bpfsys.lookup(fd, packed, 16 * ncpus)
    slots = struct.unpack(f"={2 * ncpus}Q", old) if old else (0,) * (2 * ncpus)
    new = [x for pair in zip(spread(n, ncpus), spread(remote, ncpus), strict=True) for x in pair]
    added = [a + b for a, b in zip(slots, new, strict=True)]
    bpfsys.update(fd, packed, struct.pack(f"={2 * ncpus}Q", *added))


def _cold_then_adopt(bpffs: Path) -> dict:
    root = bpffs / "kubenpu"
    loader = MapLoader()
    cold = PinnedProbe(root, loader, [VGEM])
    attach = cold.start(lambda _: None)
    loader.count(KEY, 5)
    pins = sorted(p.name for p in cold.dir.iterdir())
    cold.close()  # the agent is gone; the pins hold the maps

    fd = bpfsys.obj_get(cold.dir / "counts")  # the kernel counts on meanwhile
    add_count(fd, KEY, 3, bpfsys.possible_cpus())
    fd = bpfsys.obj_get(cold.dir / "devices")
    bpfsys.update(fd, struct.pack("=I", dev_t(1, 1)), struct.pack("=I", 9))  # unplugged since

    second = MapLoader()
    adopting = PinnedProbe(root, second, [VGEM])
    adopted = adopting.start(lambda _: None)
    devices = {struct.unpack("=I", k)[0] for k in bpfsys.keys(fd, 4)}
    minors = device_table(cold.dir)
    counts = adopting.read_counts()
    adopting.forget_counts([KEY])
    return {
        "attach": attach,
        "pins": pins,
        "adopted": adopted,
        "loader_started": second.started,
        "counts": counts,
        "after_forget": adopting.read_counts(),
        "devices": devices,
        "minors": minors,
        "lost": adopting.read_lost(),
        "gate": gate(adopting.dir),
    }


def test_a_restart_adopts_the_pins_and_reads_on_from_the_kernel_totals():
    found = in_private_bpffs(_cold_then_adopt)
    assert found["attach"].startswith("fentry-module (pinned in ")  # loaded in this process
    assert found["pins"] == sorted(
        [
            *["counts", "devices", "events", "gate", "ioctls", "minors"],
            *[LINK_DRM, BIRTHS_LINK, "lost", META],
        ]
    )
    assert found["adopted"].startswith("fentry-module (adopted from ")
    assert not found["loader_started"], "adopting must not load or attach a program"
    assert found["counts"] == {KEY: 8}  # 5 before the restart, 3 while no agent ran
    assert found["after_forget"] == {}
    assert found["devices"] == set()  # the stale device is gone; the hash holds no DRM node
    # vgem's card0 (226:0) is slot 0 of the array, as vendor id + 1
    assert found["minors"] == {0: vendor_ids()["vgem"] + 1}
    assert set(tables([VGEM])[0]) == {dev_t(226, 0)}
    assert found["lost"] == dict.fromkeys(abi.LOST_SLOTS, 0)
    assert found["gate"] == GATE_OPEN


def _hand_over(bpffs: Path) -> dict:
    root = bpffs / "kubenpu"
    old_loader = MapLoader("old")
    old = PinnedProbe(root, old_loader, [VGEM])
    old.start(lambda _: None)
    old_loader.count(KEY, 7)
    old_loader.lose(1, 2)  # map_full
    bpfsys.update(old_loader.fds["devices"], struct.pack("=I", dev_t(226, 0)), b"\1\0\0\0")
    old.close()

    loader = MapLoader("new")
    new = PinnedProbe(root, loader, [VGEM])
    new.start(lambda _: None)
    found = {
        "pins": pins(root),
        "gate_at_load": loader.gate_open,
        "old_devices": bpfsys.keys(bpfsys.obj_get(old.dir / "devices"), 4),
        "old_minors": device_table(old.dir),
        "gate": gate(new.dir),
        "old": old.dir.name,
        "new": new.dir.name,
        "lost": new.read_lost(),
    }
    loader.count(KEY, 1)
    found["counts"] = new.read_counts()
    new.close()  # then a restart: it adopts and must keep the retired totals
    again = PinnedProbe(root, MapLoader("new"), [VGEM])
    again.start(lambda _: None)
    found["counts_after_restart"] = again.read_counts()
    again.forget_counts([KEY])  # the cgroup is gone: the retired probe is empty
    found["counts_after_forget"] = again.read_counts()  # the inherited 7 with it
    again.close()
    PinnedProbe(root, MapLoader("new"), [VGEM]).start(lambda _: None)
    found["dirs_at_last"] = sorted(p.name for p in root.iterdir())
    return found


def test_a_changed_program_takes_over_the_retired_probe_totals():
    found = in_private_bpffs(_hand_over)
    assert not attached(found["pins"][found["old"]]), "the old probe is still attached"
    assert attached(found["pins"][found["new"]])
    assert found["gate_at_load"] is False, "the new probe counted while the old one did"
    assert found["old_devices"] == [] and found["old_minors"] == {}, "the old probe still counts"
    assert found["gate"] == GATE_OPEN
    assert found["counts"] == found["counts_after_restart"] == {KEY: 8}
    assert found["counts_after_forget"] == {}
    assert found["lost"]["map_full"] == 2
    assert found["dirs_at_last"] == [found["new"]]


def _events_agent(bpffs: Path) -> dict:
    root = bpffs / "kubenpu"
    old = PinnedProbe(root, MapLoader("agg"), [VGEM])
    old.start(lambda _: None)
    add_count(bpfsys.obj_get(old.dir / "counts"), KEY, 7, bpfsys.possible_cpus())
    old.close()
    events = MapLoader("ev", aggregate=False)
    PinnedProbe(root, events, [VGEM]).start(lambda _: None)
    found = {"pins": pins(root)}
    later = PinnedProbe(root, MapLoader("agg2"), [VGEM])
    later.start(lambda _: None)
    found["later_counts"] = later.read_counts()
    found["old"] = old.dir.name
    return found


def _left_pinned(root: Path, loader: MapLoader, calls: int) -> PinnedProbe:
    """A probe that pinned itself under `root`, counted `calls` calls of KEY and closed (the
    agent gone, its pins holding the maps)."""
    probe = PinnedProbe(root, loader, [VGEM])
    probe.start(lambda _: None)
    loader.count(KEY, calls)
    probe.close()
    return probe


def _reshaped(bpffs: Path) -> dict:
    root = bpffs / "kubenpu"
    _left_pinned(root, MapLoader("a"), 5)
    # The same identity (digest "a") with its counts map sized otherwise: not to be adopted.
    loader = MapLoader("a", counts_entries=2048)
    again = PinnedProbe(root, loader, [VGEM])
    found = {
        "attach": again.start(lambda _: None),
        "loader_started": loader.started,
        "gate_at_load": loader.gate_open,
        "own": again.dir.name,
        "pins": pins(root),
        "gate": gate(again.dir),
        "counts": again.read_counts(),
    }
    again.close()
    return found


def test_a_pinned_map_of_another_shape_is_handed_over_not_adopted():
    found = in_private_bpffs(_reshaped)
    assert found["loader_started"], "a pinned map that does not match must not be adopted"
    assert found["attach"].startswith("fentry-module (pinned in ")
    # Loaded with the gate closed: the mismatched probe still counted until the hand-over.
    assert found["gate_at_load"] is False
    assert found["gate"] == GATE_OPEN
    (retired,) = [d for d in found["pins"] if d != found["own"]]
    assert "-retired-" in retired and not attached(found["pins"][retired])
    assert found["counts"] == {KEY: 5}  # its totals go on: same layout, other entries


def _relaid(bpffs: Path) -> dict:
    root = bpffs / "kubenpu"
    old = _left_pinned(root, MapLoader("old"), 7)
    # Its counts map replaced by one of another value size (the layout before the remote calls:
    # one u64 a CPU): its totals cannot be read as ours.
    (old.dir / "counts").unlink()
    other = bpfsys.map_create(abi.MAP_TYPE_PERCPU_HASH, 16, 8, 1024, "counts")
    ncpus = bpfsys.possible_cpus()
    packed = struct.pack("=QII", KEY.cgroup_id, dev_t(KEY.major, KEY.minor), KEY.kind)
    bpfsys.update(other, packed, struct.pack(f"={ncpus}Q", *spread(7, ncpus)))
    bpfsys.obj_pin(other, old.dir / "counts")
    new = PinnedProbe(root, MapLoader("new"), [VGEM])
    new.start(lambda _: None)
    found = {"counts": new.read_counts(), "dirs": sorted(p.name for p in root.iterdir())}
    found["new"] = new.dir.name
    new.close()
    return found


def test_a_retired_probe_of_another_layout_is_not_read():
    found = in_private_bpffs(_relaid)
    assert found["counts"] == {}, "a counts map of another value size was read as ours"
    assert found["dirs"] == [found["new"]]  # removed, with a warning that its totals are lost


def test_an_events_mode_agent_detaches_pins_and_leaves_their_totals_to_aggregate_mode():
    found = in_private_bpffs(_events_agent)
    assert list(found["pins"]) == [found["old"]], "events mode pins nothing"
    assert not attached(found["pins"][found["old"]])
    assert found["later_counts"] == {KEY: 7}


def _incomplete(bpffs: Path) -> dict:
    root = bpffs / "kubenpu"
    crashed = MapLoader()
    probe = PinnedProbe(root, crashed, [VGEM])
    probe.dir.mkdir(parents=True)
    crashed.count(KEY, 4)  # counted while attached, before the crash
    for name in ("lost", "counts", LINK_DRM):  # a crash before `meta`
        bpfsys.obj_pin(crashed.fds[name], probe.dir / name)
    loader = MapLoader()
    probe = PinnedProbe(root, loader, [VGEM])
    probe.start(lambda _: None)
    return {
        "loaded": loader.started,
        "meta": (probe.dir / META).exists(),
        "dirs": len(list(root.iterdir())),
        "counts": probe.read_counts(),
    }


def test_a_pin_directory_left_by_a_crash_is_set_aside_with_its_totals():
    found = in_private_bpffs(_incomplete)
    assert found == {"loaded": True, "meta": True, "dirs": 2, "counts": {KEY: 4}}


def _stale_pin_raising(bpffs: Path) -> str:
    root = bpffs / "kubenpu"
    loader = MapLoader()
    probe = PinnedProbe(root, loader, [VGEM])
    probe.dir.mkdir(parents=True)
    fd = bpfsys.array_create("kubenpu_meta", b"{}".ljust(512, b"\0"))  # no mode, no attach
    bpfsys.obj_pin(fd, probe.dir / META)
    return probe.start(lambda _: None)


def test_an_unusable_pin_is_loaded_anew():
    assert in_private_bpffs(_stale_pin_raising).startswith("fentry-module (pinned in ")


def _uninstall(bpffs: Path) -> tuple[int, bool]:
    root = bpffs / "kubenpu"
    for digest in ("a", "b"):  # "b" takes over "a": "a" stays pinned, detached
        loader = MapLoader(digest)
        loader.count(KEY, 1)
        probe = PinnedProbe(root, loader, [VGEM])
        probe.start(lambda _: None)
        probe.close()
    return uninstall(root), root.exists()


def test_uninstall_removes_every_pinned_probe():
    assert in_private_bpffs(_uninstall) == (2, False)


def test_uninstall_without_pins_does_nothing(tmp_path):
    assert uninstall(tmp_path / "none") == 0


def test_agent_uninstall_removes_the_pin_dir(tmp_path, capsys):
    root = tmp_path / "kubenpu"
    (root / "0123456789abcdef").mkdir(parents=True)
    (root / "0123456789abcdef" / LINK_DRM).touch()  # bpffs pins are unlinked like files
    config = tmp_path / "config.yaml"
    config.write_text(f"probe:\n  pin_dir: {root}\n")
    assert main(["--config", str(config), "--uninstall"]) == 0
    assert not root.exists()
    assert "removed 1 pinned probe(s)" in capsys.readouterr().out


def _pinned(root: Path, probes: int) -> Path:
    for i in range(probes):
        (root / f"{i:016x}").mkdir(parents=True)
        (root / f"{i:016x}" / LINK_DRM).touch()  # bpffs pins are unlinked like files
    return root


def test_agent_uninstall_needs_no_config_file_with_pin_dir(tmp_path, capsys):
    """As the chart's uninstall hook runs it: --pin-dir, and no config file anywhere."""
    root = _pinned(tmp_path / "kubenpu", 2)
    missing = tmp_path / "no-such-config.yaml"
    assert main(["--config", str(missing), "--uninstall", "--pin-dir", str(root)]) == 0
    assert not root.exists()
    assert capsys.readouterr().out == f"kubenpu-agent: removed 2 pinned probe(s) from {root}\n"
    # the default config path (/etc/kubenpu/config.yaml) need not exist either
    assert main(["--uninstall", "--pin-dir", str(root)]) == 0
    assert capsys.readouterr().out == f"kubenpu-agent: nothing pinned in {root}\n"


def test_agent_uninstall_says_when_there_is_nothing(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["--uninstall", "--pin-dir", str(empty)]) == 0
    assert capsys.readouterr().out == f"kubenpu-agent: nothing pinned in {empty}\n"
    assert not empty.exists()
    # no --pin-dir and a config without probe.pin_dir (its default, off): nothing to name
    config = tmp_path / "config.yaml"
    config.write_text("log_level: info\n")
    assert main(["--config", str(config), "--uninstall"]) == 0
    assert "nothing to remove: no pin directory (pass --pin-dir DIR)" in capsys.readouterr().out
    assert main(["--config", str(tmp_path / "none.yaml"), "--uninstall"]) == 0
    assert "nothing to remove" in capsys.readouterr().out


def test_agent_pin_dir_goes_with_uninstall(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--pin-dir", str(tmp_path)])
    assert exit_.value.code == 2
    assert "--pin-dir goes with --uninstall" in capsys.readouterr().err


def test_agent_uninstall_reports_a_bad_config_and_a_failed_removal(tmp_path, capsys):
    config = tmp_path / "config.yaml"
    config.write_text("probe:\n  pin_dir: 5\n")
    assert main(["--config", str(config), "--uninstall"]) == 2
    assert "pin_dir" in capsys.readouterr().err
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    assert main(["--uninstall", "--pin-dir", str(not_a_dir)]) == 0  # no directory: no pins
    capsys.readouterr()
    root = _pinned(tmp_path / "stray", 1)
    (root / "not-a-probe").write_text("x")  # bpffs holds only what was pinned; rmdir fails here
    assert main(["--uninstall", "--pin-dir", str(root)]) == 1
    assert capsys.readouterr().err.startswith(f"kubenpu-agent: cannot remove {root}: ")


def _loaded_by_a_child(bpffs: Path) -> dict:
    root = bpffs / "kubenpu"
    loader = MapLoader()
    probe = PinnedProbe(root, loader, [VGEM], spawn=load_in_child)
    attach = probe.start(lambda _: None)
    counts = bpfsys.obj_get(probe.dir / "counts")  # the child is gone; its probe counts on
    add_count(counts, KEY, 6, bpfsys.possible_cpus())
    return {
        "attach": attach,
        "started_here": loader.started,
        "pins": pins(root),
        "counts": probe.read_counts(),
    }


def test_a_cold_start_loads_in_a_child_and_adopts_its_pins():
    found = in_private_bpffs(_loaded_by_a_child)
    assert found["attach"].startswith("fentry-module (loaded by a child process, pinned in ")
    assert not found["started_here"], "the agent's own process loaded the program"
    ((_, pinned),) = found["pins"].items()
    assert META in pinned and LINK_DRM in pinned and BIRTHS_LINK in pinned
    assert found["counts"] == {KEY: 6}


def _crash_mid_hand_over(bpffs: Path, gate_value: int, old_counting: bool) -> dict:
    """The state a crash leaves between the new probe's pinning and the end of its hand-over:
    the new probe pinned with its gate at `gate_value`, the old one counting or not."""
    root = bpffs / "kubenpu"
    old = _left_pinned(root, MapLoader("old"), 7)
    new_loader = MapLoader("new")
    new = PinnedProbe(root, new_loader, [VGEM])
    new_loader.gate_open = False
    new_loader.start(lambda _: None)
    assert pin_objects(new_loader.objects(), new.dir, dict(new.meta, attach="fentry-module"))
    set_gate(new_loader.fds["gate"], gate_value)
    if not old_counting:  # its device table emptied: it counts nothing
        empty_devices({n: bpfsys.obj_get(old.dir / n) for n in ("minors", "devices")})
    new_loader.lose(3, 5)  # calls seen in the hand-over window, all of them after the crash
    new_loader.close()  # the crash

    again = PinnedProbe(root, MapLoader("new"), [VGEM])
    attach = again.start(lambda _: None)
    return {
        "attach": attach,
        "pins": pins(root),
        "new": new.dir.name,
        "old": old.dir.name,
        "gate": gate(again.dir),
        "counts": again.read_counts(),
        "handover": again.read_lost()["handover"],
    }


def test_a_crash_before_the_hand_over_is_finished_by_the_next_start():
    found = in_private_bpffs(lambda bpffs: _crash_mid_hand_over(bpffs, GATE_CLOSED, True))
    assert "(adopted from " in found["attach"]
    assert attached(found["pins"][found["new"]])
    assert not attached(found["pins"][found["old"]]), "two programs count"
    assert found["gate"] == GATE_OPEN
    assert found["counts"] == {KEY: 7}


def test_a_crash_inside_the_hand_over_window_counts_its_calls_as_handover_drops():
    found = in_private_bpffs(lambda bpffs: _crash_mid_hand_over(bpffs, GATE_HANDOVER, False))
    assert "(adopted from " in found["attach"]
    assert found["gate"] == GATE_OPEN
    assert found["counts"] == {KEY: 7}
    assert found["handover"] == 5


class InProcessLoader:
    """A loader that only records that it ran in this process (no maps: nothing is pinned)."""

    aggregate = True
    hook = "security_file_ioctl"
    loader = "in-process"
    gate_open = True
    before_attach = None
    started = False

    def digest(self) -> str:
        return "x"

    def start(self, on_record) -> str:
        self.started = True
        return "fentry"


def test_without_a_bpffs_the_probe_loads_in_process_and_says_so(tmp_path, caplog):
    loader = InProcessLoader()

    def spawn(*_) -> bool:
        raise AssertionError("no loader child without a bpffs")

    probe = PinnedProbe(tmp_path / "kubenpu", loader, [VGEM], spawn=spawn)
    assert probe.start(lambda _: None) == "fentry"
    assert loader.started
    (line,) = [r.getMessage() for r in caplog.records if "bpffs" in r.getMessage()]
    assert line.startswith(f"no bpffs at {tmp_path}/kubenpu: loading the probe in this process")


def test_the_identity_is_computed_at_start_not_at_construction(tmp_path):
    # under probe.loader auto the BCC fallback's PinnedProbe is built beside the CO-RE one; its
    # digest (source texts, a kallsyms scan) must cost nothing unless it is started
    digests = []

    class Counting(InProcessLoader):
        def digest(self) -> str:
            digests.append(1)
            return "d"

    probe = PinnedProbe(tmp_path / "pins", Counting(), [VGEM])
    assert digests == []
    assert probe.dir == probe.dir and probe.dir.parent == tmp_path / "pins"
    assert digests == [1]  # once, then kept


_MS_RDONLY, _MS_REMOUNT = 0x1, 0x20


def _read_only_then_writable(bpffs: Path) -> dict:
    """A probe started on a read-only bpffs, then one on the same bpffs made writable."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(None, bytes(bpffs), None, _MS_REMOUNT | _MS_RDONLY, None) != 0:
        return {"skip": os.strerror(ctypes.get_errno())}
    found = {}
    probe = PinnedProbe(bpffs / "kubenpu", MapLoader(), [VGEM])
    found["read_only"] = (probe.start(lambda _: None), probe.pinned)
    probe.close()
    libc.mount(None, bytes(bpffs), None, _MS_REMOUNT, None)
    probe = PinnedProbe(bpffs / "kubenpu", MapLoader(), [VGEM])
    found["writable"] = (probe.start(lambda _: None).split(" (")[1][:9], probe.pinned)
    probe.close()
    again = PinnedProbe(bpffs / "kubenpu", MapLoader(), [VGEM])
    found["adopted"] = (again.start(lambda _: None).split(" (")[1][:12], again.pinned)
    again.close()
    return found


def test_a_read_only_bpffs_leaves_the_probe_unpinned_and_says_so_in_pinned():
    """It degraded with one warning, and no metric said restarts would lose the counts
    (kubenpu_probe_pinned is set from `pinned`)."""
    found = in_private_bpffs(_read_only_then_writable)
    if "skip" in found:
        pytest.skip(f"cannot remount a bpffs read-only here: {found['skip']}")
    assert found["read_only"] == ("fentry-module", False)
    assert found["writable"] == ("pinned in", True)
    assert found["adopted"] == ("adopted from", True)
