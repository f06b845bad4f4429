"""The access guard (docs/guard.md): which pod may open and use which device node, from what the
agent already knows, turned into the kernel's maps (kubenpu.kernel.guard), and the kernel's
tallies turned back into denials per pod and device; and the `guard` source that does it on a
thread of its own (`Guard`).

A pod may use a device if the kubelet allocated it to the pod (PodResources, mapped to devices
by the allocations source) or an allow rule of the config names the pod's namespace, the device
and labels or annotations the pod has (its sandbox's, from the runtime). Only the devices a
plugin manages (or the config names) are guarded: the rest are never blocked. Processes outside
pod cgroups never are.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from kubenpu.discovery import Device
from kubenpu.kernel import guard as kernel
from kubenpu.kernel.errors import ProbeError
from kubenpu.kernel.guard import MODES, Clock, Policy, Writer, mkdev
from kubenpu.metrics.catalogue import ACCESS_DENIED, ACCESS_POLICY, ACCESS_UNCHECKED
from kubenpu.metrics.points import Point, Snapshot
from kubenpu.metrics.series import NodeFamily, Series, by_labels
from kubenpu.resolve import containers
from kubenpu.resolve.podresources.client import PodResourcesClient
from kubenpu.resolve.podresources.mapping import Mapper
from kubenpu.services import Worker
from kubenpu.sources.allocations import held
from kubenpu.sources.base import Node, Report

if TYPE_CHECKING:
    from kubenpu.config import GuardConfig
    from kubenpu.resolve.cri import Sandbox

log = logging.getLogger(__name__)

ANY = "*"
LOG_EVERY_SECONDS = 60.0  # one denial line per pod and device at most this often


@dataclass(frozen=True)
class Rule:
    """An allow rule: pods of `namespace` that carry every one of `labels` and `annotations`
    with its value may use `device` (a device id); ANY matches all."""

    namespace: str = ANY
    device: str = ANY
    labels: tuple[tuple[str, str], ...] = ()
    annotations: tuple[tuple[str, str], ...] = ()

    def allows(self, pod: Pod, device: str) -> bool:
        return (
            self.namespace in (ANY, pod.namespace)
            and self.device in (ANY, device)
            and all(pod.labels.get(k) == v for k, v in self.labels)
            and all(pod.annotations.get(k) == v for k, v in self.annotations)
        )


@dataclass(frozen=True)
class Settings:
    mode: str = "off"  # MODES
    namespaces: Mapping[str, str] | None = None  # namespace -> mode, overriding `mode`
    allow: tuple[Rule, ...] = ()
    fail_open_seconds: float = 30.0

    def mode_of(self, namespace: str) -> str:
        return (self.namespaces or {}).get(namespace, self.mode)


@dataclass(frozen=True)
class Pod:
    """What the agent knows of one pod: its containers' cgroups, its allocated devices, and
    the labels and annotations the allow rules read (its sandbox's)."""

    uid: str
    namespace: str
    name: str
    cgroup_ids: frozenset[int]
    devices: frozenset[str]  # device ids (Device.id) the kubelet allocated to it
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)


def _nodes(device: Device) -> set[int]:
    return {mkdev(n.major, n.minor) for n in device.nodes}


def device_ids(devices: Iterable[Device]) -> dict[int, str]:
    """Each device node's dev_t, to its device's id."""
    return {dev: d.id for d in devices for dev in _nodes(d)}


class Planner:
    """Policies for successive views of the pods. A pod keeps its number for the agent's life
    (the kernel's allow keys name it), so a refresh rewrites only what changed."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._numbers: dict[str, int] = {}

    def number(self, uid: str) -> int:
        return self._numbers.setdefault(uid, len(self._numbers) + 1)

    def access(self, pod: Pod, device: str) -> str:
        """Why `pod` may use `device` (ACCESSES: allocated, allow_rule), or denied."""
        if device in pod.devices:
            return "allocated"
        if any(r.allows(pod, device) for r in self.settings.allow):
            return "allow_rule"
        return "denied"

    def plan(self, pods: Iterable[Pod], devices: Iterable[Device], managed: set[str]) -> Policy:
        """`managed`: the device ids a plugin manages (allocatable), the ones guarded."""
        guarded_devices = [d for d in devices if d.id in managed]
        cgroups, allowed = {}, set()
        for pod in pods:
            number = self.number(pod.uid)
            mode = MODES.index(self.settings.mode_of(pod.namespace))
            cgroups.update({cgroup_id: (number, mode) for cgroup_id in pod.cgroup_ids})
            for device in guarded_devices:
                if self.access(pod, device.id) != "denied":
                    allowed.update((number, dev) for dev in _nodes(device))
        guarded = frozenset(dev for d in guarded_devices for dev in _nodes(d))
        return Policy(guarded, cgroups, frozenset(allowed))

    def table(self, pods: Iterable[Pod], managed: Iterable[str]) -> dict[tuple[str, ...], int]:
        """The policy as ACCESS_POLICY's rows: every guarded pod and device's access."""
        rows = {}
        for pod in pods:
            mode = self.settings.mode_of(pod.namespace)
            if mode != "off":
                for device in sorted(managed):
                    access = self.access(pod, device)
                    rows[pod.namespace, pod.name, pod.uid, device, mode, access] = 1
        return rows


@dataclass(frozen=True)
class Denial:
    pod: Pod
    device: str  # its id
    operation: str
    mode: str  # enforce: denied; audit: would have been
    count: int


# The verdicts that are denials, and the mode each is one of.
DENIAL_MODES = {"denied": "enforce", "audited": "audit"}


def denials(
    tallies: Mapping[tuple[int, int, str, str], int],
    pods: Iterable[Pod],
    devices: Iterable[Device],
) -> list[Denial]:
    """The kernel's denial tallies by pod, device and operation (cumulative), the cgroups of one
    pod summed; a tally of a cgroup or node the agent no longer knows is left out."""
    by_cgroup = {c: pod for pod in pods for c in pod.cgroup_ids}
    by_dev = device_ids(devices)
    summed: dict[tuple[str, str, str, str], int] = {}
    known: dict[str, Pod] = {}
    for (cgroup_id, dev, operation, verdict), n in tallies.items():
        pod, device, mode = by_cgroup.get(cgroup_id), by_dev.get(dev), DENIAL_MODES.get(verdict)
        if pod is None or device is None or mode is None:
            continue
        known[pod.uid] = pod
        key = (pod.uid, device, operation, mode)
        summed[key] = summed.get(key, 0) + n
    return [Denial(known[uid], d, op, mode, n) for (uid, d, op, mode), n in summed.items()]


class DenialLog:
    """One line per pod and device at most every LOG_EVERY_SECONDS, when its denials rose."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._seen: dict[tuple[str, str, str, str], int] = {}
        self._logged: dict[tuple[str, str], float] = {}

    def note(self, found: Iterable[Denial]) -> None:
        now = self._clock()
        for d in found:
            key = (d.pod.uid, d.device, d.operation, d.mode)
            rose, self._seen[key] = d.count - self._seen.get(key, 0), d.count
            last = self._logged.get((d.pod.uid, d.device))
            if rose <= 0 or (last is not None and now - last < LOG_EVERY_SECONDS):
                continue
            self._logged[d.pod.uid, d.device] = now
            verb = "denied" if d.mode == "enforce" else "would deny (audit)"
            log.warning(
                "guard %s %s %d time(s) to pod %s/%s on device %s",
                verb,
                d.operation,
                rose,
                d.pod.namespace,
                d.pod.name,
                d.device,
            )


# The source: the policy refreshed on its own thread, which also beats.

# After a cgroup birth, the cgroup tree is looked at this often, for this long, until every pod
# cgroup in it is in the policy (the runtime names a container once it runs, a moment after its
# cgroup is made): a new pod is guarded within a look of being nameable, not at the next refresh.
BIRTH_LOOK_SECONDS = 0.25
BIRTH_WINDOW_SECONDS = 10.0
UNCHECKED = {"unseen": "unseen", "failed_open": "failed_open"}  # the kernel's verdict -> reason


def settings(cfg: GuardConfig) -> Settings:
    return Settings(
        cfg.mode,
        dict(cfg.namespaces),
        tuple(
            Rule(r.namespace, r.device, tuple(r.labels.items()), tuple(r.annotations.items()))
            for r in cfg.allow
        ),
        cfg.fail_open_seconds,
    )


@dataclass(frozen=True)
class Tree:
    """The pod cgroups under the kubepods cgroup: their ids by pod uid, and (id, level) of the
    kubepods cgroup itself ((0, 0) when there is none)."""

    kubepods: tuple[int, int] = (0, 0)
    pods: dict[str, frozenset[int]] = field(default_factory=dict)

    def cgroups(self) -> set[int]:
        return {c for ids in self.pods.values() for c in ids}


# kubepods.slice (systemd driver), kubepods (cgroupfs), kind's kubelet.slice/kubelet-kubepods.slice
_KUBEPODS = ("kubepods.slice", "kubepods")


def _kubepods(root: Path) -> Path | None:
    for name in _KUBEPODS:
        if (root / name).is_dir():
            return root / name
    found = sorted(root.glob("*/*-kubepods.slice"))
    return found[0] if found else None


def walk(root: str) -> Tree:
    """One walk of the kubepods cgroup's subtree (the pods' cgroups only, not the whole tree).
    A cgroup's id is its directory's inode number, as bpf_get_current_cgroup_id gives it."""
    base = Path(root)
    top = _kubepods(base)
    if top is None:
        return Tree()
    try:
        kubepods = (top.stat().st_ino, len(top.relative_to(base).parts))
    except OSError:
        return Tree()
    pods: dict[str, set[int]] = {}
    for path, dirs, _ in os.walk(top):  # a directory gone meanwhile is skipped
        for d in dirs:
            rel = os.path.relpath(os.path.join(path, d), base)
            pod = containers.parse(rel)
            if pod is None:
                continue
            try:
                pods.setdefault(pod.pod_uid, set()).add(os.stat(os.path.join(path, d)).st_ino)
            except OSError:
                continue
    return Tree(kubepods, {uid: frozenset(ids) for uid, ids in pods.items()})


def _denied(rows: dict[str, dict[tuple[str, ...], tuple[int, int]]], start: int) -> Snapshot:
    labels = ACCESS_DENIED.labels
    found = rows.get("", {}).items()
    points = [Point(dict(zip(labels, k, strict=True)), n, t) for k, (n, t) in found]
    return [(ACCESS_DENIED, points)]


def _policy(rows: dict[str, dict[tuple[str, ...], int]], start: int) -> Snapshot:
    labels = ACCESS_POLICY.labels
    found = rows.get("", {}).items()
    return [(ACCESS_POLICY, [Point(dict(zip(labels, k, strict=True)), n, start) for k, n in found])]


# set(DENIED, "", rows): every known pod's denials (namespace, pod, pod_uid, device, operation,
# mode) -> (count, first seen ns), replacing the last: a gone pod's series leave with it.
DENIED = NodeFamily(ACCESS_DENIED.name, _denied)
UNCHECKED_FAMILY = by_labels(ACCESS_UNCHECKED)
# set(POLICY, "", Planner.table(...)): the last refresh's policy, replacing the last.
POLICY = NodeFamily(ACCESS_POLICY.name, _policy)
FAMILIES = (DENIED, UNCHECKED_FAMILY, POLICY)


class Kernel(Protocol):
    """What the source needs of kubenpu.kernel.guard.GuardKernel."""

    writer: Writer | None

    def start(self, policy: Policy, clock: Clock, now_ns: int) -> str: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class View:
    """One refresh's knowledge: the cgroup tree and the pods the agent can name in it."""

    tree: Tree
    pods: tuple[Pod, ...]


class Guard:
    """The `guard` source: start() loads the programs with an empty policy (nothing guarded)
    and starts the `guard` thread, which beats every `heartbeat_seconds`, refreshes the policy
    every `refresh_seconds` and after each cgroup birth (born()), and turns the kernel's tallies
    into the series. If the thread dies or stalls, the beats stop, the kernel fails open after
    `fail_open_seconds` and /healthz says which thread."""

    name = "guard"

    def __init__(
        self,
        cfg: GuardConfig,
        kernel_: Kernel,
        client: PodResourcesClient,
        mapper: Mapper,
        devices: list[Device],
        sandboxes: Callable[[], dict[tuple[str, str], Sandbox] | None],
        cgroup_root: str,
        metrics: Series,
        stale_after: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._cfg = cfg
        self._stale_after = stale_after  # its thread's: kubenpu.services.Worker
        self._kernel = kernel_
        self._client = client
        self._mapper = mapper
        self._devices = devices
        self._sandboxes = sandboxes
        self._named: dict[str, Pod] = {}  # pod uid -> its pod as the runtime names it
        self._root = cgroup_root
        self._metrics = metrics
        self._clock = clock
        self._report = Report(self.name, metrics)
        self.planner = Planner(settings(cfg))
        rules = self.planner.settings.allow  # the label and annotation keys they read
        self._keys = (
            {k for r in rules for k, _ in r.labels},
            {k for r in rules for k, _ in r.annotations},
        )
        self._log = DenialLog(clock)
        self._beats = Clock(int(cfg.fail_open_seconds * 1e9))
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._births_until = 0.0
        self._thread: Worker | None = None
        self.view = View(Tree(), ())
        self.policy = Policy()
        self._last: dict[tuple[int, int, str, str], int] = {}  # the tallies at the last read
        self._denied: dict[tuple[str, ...], tuple[int, int]] = {}
        self.denials: list[Denial] = []  # cumulative, per known pod

    def start(self) -> Worker | None:
        """Loads and attaches the programs with nothing guarded yet and starts the thread; None
        (one line said why, the guard is off, counting goes on) if the kernel refuses them."""
        try:
            how = self._kernel.start(Policy(), self._beats, time.monotonic_ns())
        except ProbeError as err:
            log.warning("the access guard is off, counting goes on: %s", err)
            return None
        modes = ", ".join(f"{ns} {m}" for ns, m in sorted(self._cfg.namespaces.items()))
        log.info(
            "access guard attached (%s), mode %s%s", how, self._cfg.mode, modes and f" ({modes})"
        )
        self._thread = Worker(self.name, self._loop, stale_after=self._stale_after)
        self._thread.start()
        return self._thread

    def born(self, births: Iterable[tuple[int, int]]) -> None:
        """New cgroups from the counting probe's cgroup_mkdir (any thread): look for new pods
        now and for BIRTH_WINDOW_SECONDS."""
        self._births_until = self._clock() + BIRTH_WINDOW_SECONDS
        self._wake.set()

    def close(self) -> None:
        """Stops the thread, then detaches the programs: no guard outlives the agent."""
        self._stop.set()
        self._wake.set()
        self._client.close()
        if self._thread is not None:
            self._thread.join(self._cfg.heartbeat_seconds + 1)
        self._kernel.close()

    def _loop(self) -> None:
        assert self._thread is not None
        due = self._clock()
        while not self._stop.is_set():
            self._thread.beat()
            now = self._clock()
            full = now >= due
            if full:
                due = now + self._cfg.refresh_seconds
            if full or self._wake.is_set():
                self._wake.clear()
                self._report.read(partial(self.refresh, full))  # a failure: the next one
            self.beat()  # a failure ends the thread: the beats stop, the kernel fails open
            looking = self._clock() < self._births_until
            self._wake.wait(BIRTH_LOOK_SECONDS if looking else self._cfg.heartbeat_seconds)
            if looking:
                self._wake.set()  # look again: a new pod is nameable once its container runs

    def beat(self) -> None:
        writer = self._writer()
        writer.beat(time.monotonic_ns(), self._beats)

    def _writer(self) -> Writer:
        if self._kernel.writer is None:
            raise ProbeError("the guard's programs are not loaded")
        return self._kernel.writer

    def refresh(self, full: bool = True) -> bool:
        """One refresh: the pods named in the cgroup tree, then their allocations (asked after
        the tree: a pod whose container runs was admitted, so the kubelet's answer holds its
        devices), the policy written, the tallies read. A look after a birth (`full` False)
        stops after the walk when the tree holds no pod cgroup the policy lacks. False when
        nothing was brought up to date."""
        tree = walk(self._root)
        if not full and tree.cgroups() <= self.policy.pods.keys():
            return False
        pods = self._pods(tree)
        allocated, _ = self._client.list()
        shares, _ = held(allocated, self._mapper)
        managed = {h.device for h in shares} | self._allocatable()
        by_pod: dict[tuple[str, str], set[str]] = {}
        for h in shares:
            by_pod.setdefault((h.namespace, h.pod), set()).add(h.device)
        pods = tuple(
            replace(p, devices=frozenset(by_pod.get((p.namespace, p.name), ()))) for p in pods
        )
        writer = self._writer()
        self._beats = Clock(self._beats.fail_open_ns, tree.kubepods)
        policy = self.planner.plan(pods, self._devices, managed)
        writer.apply(policy)
        self._metrics.set(POLICY, "", self.planner.table(pods, managed))
        old, self.view, self.policy = self.view, View(tree, pods), policy
        self._read(writer, (*old.pods, *pods), tree)
        return True

    def _pods(self, tree: Tree) -> list[Pod]:
        """The pods of the tree the runtime names (a pod it does not name yet stays out of the
        policy: the kernel allows it, counted unseen). A uid names one pod for its life, and its
        sandbox keeps the labels and annotations it was created with, so the runtime is asked
        only when the tree holds a uid not named yet: a list at every refresh doubled the
        agent's CRI requests (tests/test_node_vm.py counts them)."""
        if not tree.pods.keys() <= self._named.keys():
            found = self._sandboxes()
            if found is None:
                raise ProbeError("the container runtime did not answer (pod sandboxes)")
            self._named |= {s.uid: self._pod(*pod, s) for pod, s in found.items()}
        self._named = {uid: pod for uid, pod in self._named.items() if uid in tree.pods}
        return [
            replace(self._named[uid], cgroup_ids=ids)
            for uid, ids in tree.pods.items()
            if uid in self._named
        ]

    def _pod(self, namespace: str, name: str, sandbox: Sandbox) -> Pod:
        """The pod of a sandbox, with only the labels and annotations the rules read."""
        labels, annotations = self._keys
        return Pod(
            sandbox.uid,
            namespace,
            name,
            frozenset(),
            frozenset(),
            {k: v for k, v in sandbox.labels.items() if k in labels},
            {k: v for k, v in sandbox.annotations.items() if k in annotations},
        )

    def _allocatable(self) -> set[str]:
        found = self._client.allocatable()
        return {h.device for h in held(found or [], self._mapper)[0]}

    def _read(self, writer: Writer, pods: tuple[Pod, ...], tree: Tree) -> None:
        """The tallies since the last read added to the series (a count the LRU map evicted or
        a gone cgroup's deleted key restarts from its new value), then gone cgroups' deleted."""
        now = writer.tallies()
        deltas = {}
        for key, n in now.items():
            last = self._last.get(key, 0)
            deltas[key] = n - last if n >= last else n
        by_dev = device_ids(self._devices)
        for (_, dev, op, verdict), n in deltas.items():
            if verdict in UNCHECKED and n and dev in by_dev:
                self._metrics.set(UNCHECKED_FAMILY, (by_dev[dev], op, UNCHECKED[verdict]), n)
        self._count_denials(denials(deltas, pods, self._devices))
        alive = tree.cgroups()
        gone = {c for c, *_ in now if c not in alive}
        writer.forget(gone)
        self._last = {k: n for k, n in now.items() if k[0] not in gone}

    def _count_denials(self, found: list[Denial]) -> None:
        """Adds a read's denials to each pod's totals; a pod gone leaves with its series."""
        totals = dict(self._denied)
        for d in found:
            key = (d.pod.namespace, d.pod.name, d.pod.uid, d.device, d.operation, d.mode)
            n, start = totals.get(key, (0, time.time_ns()))
            totals[key] = (n + d.count, start)
        known = {p.uid: p for p in self.view.pods}
        self._denied = {k: v for k, v in totals.items() if k[2] in known}
        self.denials = [
            Denial(known[uid], device, op, mode, n)
            for (_, _, uid, device, op, mode), (n, _) in self._denied.items()
        ]
        self._log.note(self.denials)
        self._metrics.set(DENIED, "", dict(self._denied))


def build(node: Node) -> Guard | None:
    """The guard, if a mode is not off and the kernel runs the BPF LSM with the capabilities
    it needs; else one line saying why it is off (counting goes on)."""
    cfg = node.cfg
    if not cfg.guard.on():
        return None
    try:  # the node's securityfs, under the node's /sys where the chart mounts it
        kernel.check(Path(cfg.discovery.root) / "sys/kernel/security/lsm")
    except ProbeError as err:
        log.warning("%s", err)
        return None
    pr = cfg.attribution.pod_resources
    return Guard(
        cfg.guard,
        kernel.GuardKernel(ioctl=cfg.guard.ioctl),
        PodResourcesClient(pr.socket, pr.timeout_seconds),
        Mapper(node.watched),
        node.watched,
        node.resolver.sandboxes,
        cfg.attribution.cgroup_root,
        node.table,
        # Its refresh asks the kubelet and the runtime: each may take their timeout.
        stale_after=cfg.guard.refresh_seconds
        + 2 * (pr.timeout_seconds + cfg.attribution.cri.timeout_seconds),
    )
