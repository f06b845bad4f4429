"""The `guard` source (kubenpu.sources.guard.Guard): the policy made from a real cgroup tree (a
directory tree under tmp_path, ids its inode numbers as the kernel's are), the runtime's pod
names and the kubelet's allocations, written into tests/test_guard.py's fake kernel (as strict
as bpf/guard.bpf.c), the heartbeat, the look on a cgroup birth, the series and the log line."""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from pathlib import Path

import pytest
from fakes import FakeResolver
from helpers import eventually, make_config
from test_guard import CARD0, DEVICES, GPU0, GPU1, RENDER0, RENDER1, FakeKernel, FakeMaps

from kubenpu.agent.health import Health
from kubenpu.agent.wiring import births
from kubenpu.config import ConfigError, GuardConfig
from kubenpu.kernel import guard as g
from kubenpu.kernel.errors import ProbeError
from kubenpu.metrics.catalogue import (
    ACCESS_DENIED,
    ACCESS_POLICY,
    ACCESS_UNCHECKED,
    SOURCE_ERRORS,
)
from kubenpu.metrics.series import Series
from kubenpu.resolve.cri import CriClient, Sandbox
from kubenpu.resolve.podresources.client import Allocated
from kubenpu.sources import guard, registry
from kubenpu.sources.guard import Guard

UID_A = "0b1c2d3e-0000-4000-8000-00000000000a"
UID_B = "0b1c2d3e-0000-4000-8000-00000000000b"
UID_C = "0b1c2d3e-0000-4000-8000-00000000000c"
OPEN, IOCTL, RECEIVE = 0, 1, 2


class GuardKernel:
    """kubenpu.kernel.guard.GuardKernel over FakeMaps: start() writes as the real one does."""

    def __init__(self, refuse: str = "", ioctl: bool = False) -> None:
        self.ioctl = ioctl
        self.maps = FakeMaps()
        self.lsm = FakeKernel(self.maps)
        self.writer: g.Writer | None = None
        self.refuse = refuse
        self.closed = False

    def start(self, policy: g.Policy, clock: g.Clock, now_ns: int) -> str:
        if self.refuse:
            raise ProbeError(self.refuse)
        self.writer = g.Writer(self.maps)
        self.writer.beat(now_ns, clock)
        self.writer.apply(policy)
        return "lsm " + "file_ioctl+file_ioctl_compat+" * self.ioctl + "file_open+file_receive"

    def close(self) -> None:
        self.writer, self.closed = None, True

    def decide(self, cgroup_id: int, dev: int, op: int, ancestor: int = 0) -> int:
        """The program's answer now (CLOCK_MONOTONIC, as bpf_ktime_get_ns)."""
        self.lsm.now_ns = time.monotonic_ns()
        return self.lsm.decide(cgroup_id, dev, op, ancestor=ancestor)


class Kubelet:
    """PodResources: List and GetAllocatableResources, counted."""

    def __init__(self, allocated: list[Allocated], allocatable: list[Allocated]) -> None:
        self.allocated, self.allocatable_ = allocated, allocatable
        self.lists = 0

    def list(self) -> tuple[list[Allocated], Counter[str]]:
        self.lists += 1
        return list(self.allocated), Counter()

    def allocatable(self) -> list[Allocated] | None:
        return self.allocatable_

    def close(self) -> None:
        pass


class ById:
    """A Mapper whose plugin ids are device ids (kubenpu.resolve.podresources is tested apart)."""

    def device(self, resource: str, ident: str, cdi=(), numa=()) -> str:
        return ident


class Tree:
    """A systemd-driver cgroup tree: kubepods.slice/kubepods-besteffort.slice/<pod>/<container>."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.kubepods = root / "kubepods.slice"
        self.qos = self.kubepods / "kubepods-besteffort.slice"
        self.qos.mkdir(parents=True)
        (root / "system.slice" / "kubelet.service").mkdir(parents=True)

    def container(self, uid: str, n: int) -> int:
        pod = self.qos / f"kubepods-besteffort-pod{uid.replace('-', '_')}.slice"
        path = pod / f"cri-containerd-{n:064x}.scope"
        path.mkdir(parents=True)
        return path.stat().st_ino

    def host(self) -> int:
        return (self.root / "system.slice" / "kubelet.service").stat().st_ino


def _alloc(pod: str, device: str) -> Allocated:
    return Allocated("team", pod, "main", "gpu.example.com/gpu", device)


def _guard(tmp_path: Path, table: Series, names: dict, **cfg) -> tuple[Guard, GuardKernel, Kubelet]:
    """A guard whose runtime names the pods of `names` ((namespace, name) -> uid, read at
    each ask), with no labels."""
    kernel = GuardKernel()
    kubelet = Kubelet([_alloc("a", GPU0.id)], [_alloc("", GPU0.id), _alloc("", GPU1.id)])
    settings = GuardConfig.model_validate({"mode": "enforce", **cfg})

    def sandboxes() -> dict:
        return {pod: Sandbox(uid) for pod, uid in names.items()}

    source = Guard(
        settings, kernel, kubelet, ById(), DEVICES, sandboxes, str(tmp_path), table, 30.0
    )  # type: ignore[arg-type]
    return source, kernel, kubelet


def _points(table: Series, spec) -> dict[tuple, float]:
    [found] = [p for s, p in table.collect() if s is spec]
    return {tuple(p.attrs[k] for k in spec.labels): p.value for p in found}


def test_a_refresh_allows_a_pods_allocated_device_and_denies_an_unallocated_one(tmp_path):
    tree, table = Tree(tmp_path), registry.table(300, 1000)
    a, b = tree.container(UID_A, 1), tree.container(UID_B, 2)
    names = {("team", "a"): UID_A, ("team", "b"): UID_B}
    source, kernel, _ = _guard(tmp_path, table, names)
    kernel.start(g.Policy(), g.Clock(30 * 10**9), time.monotonic_ns())
    try:
        source.refresh()
        source.beat()
        assert kernel.decide(a, RENDER0, OPEN) == 0
        assert kernel.decide(a, CARD0, IOCTL) == 0  # every node of the allocated device
        assert kernel.decide(b, RENDER0, OPEN) == -1  # -EPERM
        assert kernel.decide(b, RENDER0, IOCTL) == -1
        assert kernel.decide(a, RENDER1, OPEN) == -1  # managed, not A's
        assert kernel.decide(tree.host(), RENDER1, OPEN) == 0  # a host process
        source.refresh()
        assert _points(table, ACCESS_DENIED) == {
            ("team", "a", UID_A, GPU1.id, "open", "enforce"): 1,
            ("team", "b", UID_B, GPU0.id, "open", "enforce"): 1,
            ("team", "b", UID_B, GPU0.id, "ioctl", "enforce"): 1,
        }
        assert _points(table, ACCESS_POLICY) == {
            ("team", "a", UID_A, GPU0.id, "enforce", "allocated"): 1,
            ("team", "a", UID_A, GPU1.id, "enforce", "denied"): 1,
            ("team", "b", UID_B, GPU0.id, "enforce", "denied"): 1,
            ("team", "b", UID_B, GPU1.id, "enforce", "denied"): 1,
        }
        kubepods = g.CONFIG_VALUE.unpack(kernel.maps.data[g.CONFIG][g.U32.pack(0)])[2:4]
        assert kubepods == (tree.kubepods.stat().st_ino, 1)
    finally:
        source.close()
    assert kernel.closed


def test_audit_and_a_namespaces_mode_count_would_be_denials_and_allow(tmp_path):
    tree, table = Tree(tmp_path), registry.table(300, 1000)
    b = tree.container(UID_B, 2)
    source, kernel, _ = _guard(
        tmp_path, table, {("team", "b"): UID_B}, namespaces={"team": "audit"}
    )
    kernel.start(g.Policy(), g.Clock(30 * 10**9), time.monotonic_ns())
    source.refresh()
    source.beat()
    assert kernel.decide(b, RENDER0, OPEN) == 0
    source.refresh()
    assert _points(table, ACCESS_DENIED) == {("team", "b", UID_B, GPU0.id, "open", "audit"): 1}


def test_a_pod_the_runtime_does_not_name_yet_is_allowed_and_counted_unseen(tmp_path):
    tree, table = Tree(tmp_path), registry.table(300, 1000)
    c = tree.container(UID_C, 3)
    source, kernel, _ = _guard(tmp_path, table, {})
    kernel.start(g.Policy(), g.Clock(30 * 10**9), time.monotonic_ns())
    source.refresh()
    source.beat()
    assert kernel.decide(c, RENDER0, OPEN, ancestor=tree.kubepods.stat().st_ino) == 0
    source.refresh()
    assert _points(table, ACCESS_UNCHECKED) == {(GPU0.id, "open", "unseen"): 1}
    assert _points(table, ACCESS_DENIED) == {}


def test_the_runtime_is_asked_for_pod_names_only_when_the_tree_holds_a_new_uid(tmp_path):
    """A uid names one pod for its life: a list at every refresh doubled the agent's CRI
    requests on the real node (tests/test_node_vm.py, 48 where 25 are allowed)."""
    tree, table = Tree(tmp_path), registry.table(300, 1000)
    asked: list[int] = []
    names = {("team", "a"): UID_A}

    def listed() -> dict:
        asked.append(1)
        return {pod: Sandbox(uid) for pod, uid in names.items()}

    kernel = GuardKernel()
    kubelet = Kubelet([_alloc("a", GPU0.id)], [_alloc("", GPU0.id)])
    settings = GuardConfig.model_validate({"mode": "enforce"})
    source = Guard(settings, kernel, kubelet, ById(), DEVICES, listed, str(tmp_path), table, 30.0)  # type: ignore[arg-type]
    kernel.start(g.Policy(), g.Clock(30 * 10**9), time.monotonic_ns())
    tree.container(UID_A, 1)
    source.refresh()
    source.refresh()
    assert len(asked) == 1
    names[("team", "b")] = UID_B
    b = tree.container(UID_B, 2)
    source.refresh()  # one new uid: one more list, and pod b is in the policy
    source.refresh()
    assert len(asked) == 2 and b in source.policy.pods


def test_a_birth_brings_a_new_pod_into_the_policy_before_the_next_refresh(tmp_path):
    tree, table = Tree(tmp_path), registry.table(300, 1000)
    tree.container(UID_A, 1)
    names = {("team", "a"): UID_A}
    source, kernel, kubelet = _guard(tmp_path, table, names, refresh_seconds=3600)
    source.start()
    try:
        eventually(lambda: bool(source.policy.pods), "the first refresh")
        lists = kubelet.lists
        source.born([(123, 456)])  # a birth that is no pod's: a look, no kubelet request
        time.sleep(2 * guard.BIRTH_LOOK_SECONDS)
        assert kubelet.lists == lists
        b = tree.container(UID_B, 2)
        source.born([(b, 0)])
        time.sleep(2 * guard.BIRTH_LOOK_SECONDS)  # not nameable yet: allowed meanwhile
        assert b not in source.policy.pods and kernel.decide(b, RENDER0, OPEN) == 0
        names[("team", "b")] = UID_B  # its container runs: the runtime names it
        eventually(lambda: b in source.policy.pods, "B in the policy after its birth")
        assert kernel.decide(b, RENDER0, OPEN) == -1
    finally:
        source.close()


def test_a_dead_thread_stops_the_beats_fails_liveness_and_the_kernel_fails_open(tmp_path):
    tree, table = Tree(tmp_path), registry.table(300, 1000)
    b = tree.container(UID_B, 2)
    source, kernel, _ = _guard(
        tmp_path, table, {("team", "b"): UID_B}, heartbeat_seconds=0.05, fail_open_seconds=0.5
    )
    health = Health(stale_after=15)
    health.watch(source.start())
    try:
        eventually(lambda: bool(source.policy.pods), "the first refresh")
        time.sleep(1.0)  # twice the bound: the beats keep the guard closed
        assert kernel.decide(b, RENDER0, OPEN) == -1
        kernel.maps.after_write = lambda: (_ for _ in ()).throw(OSError(5, "EIO"))
        eventually(lambda: not health.live()[0], "liveness failed")
        assert health.live() == (False, "worker thread stopped: guard (OSError)")
        kernel.maps.after_write = lambda: None
        eventually(lambda: kernel.decide(b, RENDER0, OPEN) == 0, "the guard failed open")
        assert g.VERDICTS.index("failed_open") in {
            k[3] for k in map(g.TALLY_KEY.unpack, kernel.maps.data[g.TALLY])
        }
    finally:
        source.close()


def test_denials_stay_counted_when_a_pods_container_is_replaced(tmp_path, caplog):
    tree, table = Tree(tmp_path), registry.table(300, 1000)
    b1 = tree.container(UID_B, 2)
    source, kernel, _ = _guard(tmp_path, table, {("team", "b"): UID_B})
    kernel.start(g.Policy(), g.Clock(30 * 10**9), time.monotonic_ns())
    source.refresh()
    source.beat()
    for _ in range(3):
        kernel.decide(b1, RENDER0, OPEN)
    with caplog.at_level(logging.WARNING, "kubenpu.sources.guard"):
        source.refresh()
        b1_path = next(tree.qos.glob("*/cri-containerd-*.scope"))
        b2 = tree.container(UID_B, 4)  # the container restarted: a new cgroup (made first: a
        b1_path.rmdir()  # file system here, unlike cgroupfs, may give a gone inode's number again)
        source.refresh()
        assert not [k for k in kernel.maps.data[g.TALLY] if g.TALLY_KEY.unpack(k)[0] == b1]
        kernel.decide(b2, RENDER0, OPEN)
        source.refresh()
    assert _points(table, ACCESS_DENIED) == {("team", "b", UID_B, GPU0.id, "open", "enforce"): 4}
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [f"guard denied open 3 time(s) to pod team/b on device {GPU0.id}"]


def test_a_kernel_that_refuses_the_programs_leaves_the_guard_off_in_one_line(tmp_path, caplog):
    source, kernel, _ = _guard(tmp_path, registry.table(300, 1000), {})
    kernel.refuse = "the guard object is missing"
    with caplog.at_level(logging.WARNING):
        assert source.start() is None
    assert [r.getMessage() for r in caplog.records] == [
        "the access guard is off, counting goes on: the guard object is missing"
    ]


def _node(tmp_path: Path, text: str):
    from kubenpu.sources.activity import Activity
    from kubenpu.sources.base import Node
    from kubenpu.sources.calls.attribution import Attributor

    cfg = make_config(tmp_path, text)
    table, resolver = registry.table(300, 1000), FakeResolver()
    return Node(
        cfg, table, DEVICES, DEVICES, resolver, Attributor([], resolver, table), Activity(300)
    )


GUARDED = """\
attribution:
  pod_resources:
    enabled: true
guard:
  mode: audit
"""


def test_build_is_off_by_default_and_off_in_one_line_without_the_bpf_lsm(tmp_path, caplog):
    assert guard.build(_node(tmp_path, "")) is None
    lsm = tmp_path / "sys/kernel/security/lsm"  # under discovery.root, the node's /sys
    lsm.parent.mkdir(parents=True)
    lsm.write_text("lockdown,capability,landlock,yama,apparmor\n")
    root = f"discovery:\n  root: {tmp_path}\n"
    with caplog.at_level(logging.WARNING):
        assert guard.build(_node(tmp_path, GUARDED + root)) is None
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith("the kernel does not run the BPF LSM") and "counting goes on" in line
    lsm.write_text("lockdown,capability,landlock,yama,apparmor,bpf\n")
    built = guard.build(_node(tmp_path, GUARDED + root))  # the test's own capabilities: any
    assert isinstance(built, Guard) or "needs CAP_" in caplog.records[-1].getMessage()


@pytest.mark.parametrize(("text", "ioctl"), [("", False), ("  ioctl: true\n", True)])
def test_build_asks_for_the_ioctl_hooks_only_with_guard_ioctl(
    tmp_path, monkeypatch, caplog, text, ioctl
):
    asked = []
    monkeypatch.setattr(g, "check", lambda lsm: None)
    monkeypatch.setattr(g, "GuardKernel", lambda **kw: asked.append(kw) or GuardKernel(**kw))
    built = guard.build(_node(tmp_path, GUARDED + text))
    assert isinstance(built, Guard) and asked == [{"ioctl": ioctl}]
    with caplog.at_level(logging.INFO, logger=guard.__name__):
        built.start()
    built.close()
    hooks = (
        "file_ioctl+file_ioctl_compat+file_open+file_receive" if ioctl else "file_open+file_receive"
    )
    assert f"access guard attached (lsm {hooks}), mode audit" in caplog.text


def test_births_go_to_the_resolver_and_to_the_sources_that_act_on_them(tmp_path):
    seen = []

    class Resolver:
        def cgroups_born(self, born):
            seen.append(("resolver", born))

    source, _, _ = _guard(tmp_path, registry.table(300, 1000), {})
    births(Resolver(), [source], [(5, 1)])  # type: ignore[arg-type]
    assert seen == [("resolver", [(5, 1)])] and source._wake.is_set()


@pytest.mark.parametrize(
    "text, said",
    [
        ("guard:\n  mode: enforce\n", "needs attribution.pod_resources.enabled"),
        ("guard:\n  namespaces: {gpu: audit}\n", "needs attribution.pod_resources.enabled"),
        (GUARDED + "  heartbeat_seconds: 20\n", "at least twice guard.heartbeat_seconds"),
        (GUARDED.replace("audit", "block"), "guard.mode"),
    ],
)
def test_config_refuses_a_guard_it_cannot_run(tmp_path, text, said):
    with pytest.raises(ConfigError, match=said.replace(".", r"\.")):
        make_config(tmp_path, text)


def test_kubenpuctl_guard_shows_the_policy_and_denials_an_agent_exports(tmp_path, capsys):
    """The source's series, rendered by the agent's Prometheus exporter and served over HTTP:
    kubenpuctl guard lists each pod and device's access and its denials; its JSON keys are
    docs/cli.md's. An agent without the guard says so in one line."""
    from prometheus_client import CollectorRegistry, generate_latest
    from test_ctl import check_documented
    from test_top import MetricsServer

    from kubenpu.cli.ctl import main as ctl_main
    from kubenpu.export import build_resource
    from kubenpu.export.prometheus import PrometheusCollector

    tree, table = Tree(tmp_path), registry.table(300, 1000)
    a, b = tree.container(UID_A, 1), tree.container(UID_B, 2)
    names = {("team", "a"): UID_A, ("team", "b"): UID_B}
    source, kernel, _ = _guard(
        tmp_path, table, names, allow=[{"namespace": "team", "device": GPU1.id}]
    )
    kernel.start(g.Policy(), g.Clock(30 * 10**9), time.monotonic_ns())
    source.refresh()
    source.beat()
    for _ in range(2):
        kernel.decide(b, RENDER0, OPEN)
    kernel.decide(b, RENDER0, RECEIVE)  # an fd another process passed it
    assert kernel.decide(a, RENDER1, OPEN) == 0  # the allow rule
    source.refresh()
    exporter = CollectorRegistry()
    resource = build_resource(_node(tmp_path, "").cfg)
    exporter.register(PrometheusCollector(table, resource))
    server = MetricsServer(lambda _now: generate_latest(exporter).decode())
    try:
        assert ctl_main(["guard", "--url", server.url]) == 0
        out = [line.split() for line in capsys.readouterr().out.splitlines()]
        assert out == [
            ["POD", "DEVICE", "MODE", "ACCESS", "DENIED"],
            ["team/a", GPU0.id, "enforce", "allocated", "-"],
            ["team/a", GPU1.id, "enforce", "allow_rule", "-"],
            ["team/b", GPU0.id, "enforce", "denied", "open", "2,", "receive", "1"],
            ["team/b", GPU1.id, "enforce", "allow_rule", "-"],
        ]
        assert ctl_main(["guard", "--url", server.url, "-o", "json"]) == 0
        rows = json.loads(capsys.readouterr().out)
        assert rows[2]["denied"] == {"open": 2, "receive": 1}
        check_documented("guard", rows)
    finally:
        server.close()
    off = MetricsServer(lambda _now: "kubenpu_ioctl_total 0\n")
    try:
        assert ctl_main(["guard", "--url", off.url]) == 0
        assert capsys.readouterr().out.startswith("the access guard is off on this agent")
    finally:
        off.close()


# Allow rules by pod label and annotation, the pods named by a real CRI server's ListPodSandbox.

UID_D = "0b1c2d3e-0000-4000-8000-00000000000d"
UID_E = "0b1c2d3e-0000-4000-8000-00000000000e"
DEBUG = "kubenpu.io/gpu-debug"
UNTIL = "kubenpu.io/debug-until"


def _cri_guard(tmp_path: Path, cri_socket: str, table: Series, **cfg) -> tuple[Guard, GuardKernel]:
    """A guard (enforce, no pod allocated anything) whose pods a CriClient names."""
    kernel = GuardKernel()
    kubelet = Kubelet([], [_alloc("", GPU0.id), _alloc("", GPU1.id)])
    settings = GuardConfig.model_validate({"mode": "enforce", **cfg})
    client = CriClient(f"unix://{cri_socket}", timeout=5.0, retry_after=0.0)
    source = Guard(
        settings, kernel, kubelet, ById(), DEVICES, client.sandboxes, str(tmp_path), table, 30.0
    )  # type: ignore[arg-type]
    kernel.start(g.Policy(), g.Clock(30 * 10**9), time.monotonic_ns())
    return source, kernel


def _opens(kernel: GuardKernel, cgroups: dict[str, int], dev: int) -> dict[str, int]:
    return {pod: kernel.decide(c, dev, OPEN) for pod, c in cgroups.items()}


def test_a_label_rule_allows_exactly_the_pods_with_every_label_it_names(tmp_path, cri, cri_socket):
    """`a` has the label (any namespace, every device); `b`'s value differs, `c` lacks the key;
    the rule of two labels allows `e`, which has both, not `a`, which has one; `d`'s sandbox,
    labelled, is not ready: the runtime does not name it, so it is not in the policy (allowed,
    unseen, as any pod the agent has not named)."""
    tree, table = Tree(tmp_path), registry.table(300, 1000)
    pods = {"a": UID_A, "b": UID_B, "c": UID_C, "d": UID_D, "e": UID_E}
    cgroups = {pod: tree.container(uid, n) for n, (pod, uid) in enumerate(pods.items())}
    cri.add_sandbox(UID_A, "team", "a", {DEBUG: "true"})
    cri.add_sandbox(UID_B, "team", "b", {DEBUG: "false"})
    cri.add_sandbox(UID_C, "team", "c", {"app": "x"})
    cri.add_sandbox(UID_D, "team", "d", {DEBUG: "true"}, ready=False)
    cri.add_sandbox(UID_E, "other", "e", {DEBUG: "true", "team": "ml"})
    rules = [
        {"labels": {DEBUG: "true"}, "device": GPU0.id},
        {"labels": {DEBUG: "true", "team": "ml"}, "device": GPU1.id},
    ]
    source, kernel = _cri_guard(tmp_path, cri_socket, table, allow=rules)
    source.refresh()
    source.beat()
    assert _opens(kernel, cgroups, RENDER0) == {"a": 0, "b": -1, "c": -1, "d": 0, "e": 0}
    assert _opens(kernel, cgroups, RENDER1) == {"a": -1, "b": -1, "c": -1, "d": 0, "e": 0}
    assert cgroups["d"] not in source.policy.pods and cgroups["a"] in source.policy.pods
    access = {(k[1], k[3]): k[5] for k in _points(table, ACCESS_POLICY)}
    assert access == {
        ("a", GPU0.id): "allow_rule",
        ("a", GPU1.id): "denied",
        ("b", GPU0.id): "denied",
        ("b", GPU1.id): "denied",
        ("c", GPU0.id): "denied",
        ("c", GPU1.id): "denied",
        ("e", GPU0.id): "allow_rule",
        ("e", GPU1.id): "allow_rule",
    }
    # Only the keys the rules read are kept of a pod's labels.
    assert {p.name: dict(p.labels) for p in source.view.pods}["c"] == {}


def test_an_annotation_rule_allows_exactly_the_pods_annotated_so(tmp_path, cri, cri_socket):
    """An annotation rule scoped to a namespace: `a` has the annotation; `b`'s value differs;
    `c` has it as a label, not an annotation; `e` has it in another namespace."""
    tree, table = Tree(tmp_path), registry.table(300, 1000)
    pods = {"a": UID_A, "b": UID_B, "c": UID_C, "e": UID_E}
    cgroups = {pod: tree.container(uid, n) for n, (pod, uid) in enumerate(pods.items())}
    cri.add_sandbox(UID_A, "team", "a", annotations={UNTIL: "2026-12-31"})
    cri.add_sandbox(UID_B, "team", "b", annotations={UNTIL: "2027-01-01"})
    cri.add_sandbox(UID_C, "team", "c", {UNTIL: "2026-12-31"})
    cri.add_sandbox(UID_E, "other", "e", annotations={UNTIL: "2026-12-31"})
    rule = {"namespace": "team", "annotations": {UNTIL: "2026-12-31"}}
    source, kernel = _cri_guard(tmp_path, cri_socket, table, allow=[rule])
    source.refresh()
    source.beat()
    for dev in (RENDER0, CARD0, RENDER1):
        assert _opens(kernel, cgroups, dev) == {"a": 0, "b": -1, "c": -1, "e": -1}


def test_a_runtime_that_does_not_answer_keeps_the_last_policy(tmp_path, cri, cri_socket):
    """A new pod while the runtime is down: the refresh fails, counted, and the policy written
    before stays (the labelled pod allowed, the other denied); the new pod, unnamed, is allowed
    (unseen). Once the runtime answers, the new pod is in."""
    tree, table = Tree(tmp_path), registry.table(300, 1000)
    a, b = tree.container(UID_A, 1), tree.container(UID_B, 2)
    cri.add_sandbox(UID_A, "team", "a", {DEBUG: "true"})
    cri.add_sandbox(UID_B, "team", "b")
    source, kernel = _cri_guard(
        tmp_path, cri_socket, table, allow=[{"labels": {DEBUG: "true"}}], refresh_seconds=0.2
    )
    source.start()
    try:
        eventually(lambda: bool(source.policy.pods), "the first refresh")
        cri.set_unavailable()
        cri.add_sandbox(UID_C, "team", "c")
        c = tree.container(UID_C, 3)
        eventually(lambda: _points(table, SOURCE_ERRORS).get(("guard",), 0) >= 1, "a failure")
        assert c not in source.policy.pods
        assert [kernel.decide(x, RENDER0, OPEN) for x in (a, b, c)] == [0, -1, 0]
        cri.set_unavailable(False)
        eventually(lambda: c in source.policy.pods, "C in the policy once the runtime answers")
        assert kernel.decide(c, RENDER0, OPEN) == -1
    finally:
        source.close()


def test_bad_label_and_annotation_maps_are_one_clear_line_each(tmp_path):
    allow = (
        "  allow:\n"
        f"  - labels: {{{DEBUG}: true}}\n"  # a YAML boolean, not the string "true"
        "  - annotations: {" + ", ".join(f"k{i}: v" for i in range(65)) + "}\n"
        f"  - labels: {{{DEBUG}: {'v' * 64}}}\n"
    )
    with pytest.raises(ConfigError) as err:
        make_config(tmp_path, GUARDED + allow)
    path = tmp_path / "kubenpu.yaml"
    assert err.value.problems == [
        f"{path}: guard.allow.0.labels.{DEBUG}: Input should be a valid string (got True)",
        f"{path}: guard.allow.1.annotations: Dictionary should have at most 64 items after "
        "validation, not more (got {'k0': 'v', 'k1': 'v', 'k2': 'v', 'k3': 'v', 'k4': 'v', "
        "'k5': 'v', 'k6': 'v',...)",
        f"{path}: guard.allow.2.labels.{DEBUG}: String should have at most 63 characters "
        f"(got '{'v' * 64}')",
    ]
