"""Allocations from the kubelet's PodResources API: id formats, the client against a real gRPC
server (tests/podresources_server.py), and idle / shared / unallocated accounting with the real
series table."""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from functools import partial
from pathlib import Path

import pytest
from cri_server import CriTestServer
from fakes import Clock, FakeResolver, assert_stalls_after, fake_node
from helpers import eventually, make_config
from podresources_server import PodResourcesTestServer, container, pod

from kubenpu.agent.wiring import select_devices
from kubenpu.discovery import Device, discover
from kubenpu.kernel import abi
from kubenpu.kernel.maps import tables, vendor_ids
from kubenpu.kernel.records import Key
from kubenpu.metrics.catalogue import (
    ALLOCATED,
    ALLOCATED_IDLE,
    ALLOCATED_IDLE_FOR,
    ALLOCATIONS_UNMAPPED,
    PODRESOURCES_ERRORS,
    SOURCE_ERRORS,
    UNALLOCATED_CALLS,
)
from kubenpu.metrics.inputs import Held
from kubenpu.metrics.series import Series
from kubenpu.resolve import Attribution
from kubenpu.resolve.cri import CriClient
from kubenpu.resolve.podresources import client as client_module
from kubenpu.resolve.podresources.client import Allocated, PodResourcesClient, PodResourcesError
from kubenpu.resolve.podresources.mapping import PLUGINS, Mapper, Unmapped
from kubenpu.services import Services, Worker
from kubenpu.sources import allocations as allocations_module
from kubenpu.sources.activity import Activity
from kubenpu.sources.allocations import Allocations, build, held
from kubenpu.sources.base import Node
from kubenpu.sources.calls.attribution import Attributor
from kubenpu.sources.calls.events import Batch
from kubenpu.sources.registry import table
from kubenpu.vendors import Kind

TESTDATA = Path(__file__).parent / "testdata"
IGPU, DGPU = "0000:00:02.0", "0000:03:00.0"  # hybrid-two-gpu: i915 card1, amdgpu card0
I915 = "gpu.intel.com/i915"


def mapper(machine: str) -> Mapper:
    return Mapper(discover(TESTDATA / machine))


MI300 = "mi300-partitions"
XCP0 = "platform:amdgpu_xcp_0"
AMD_DRA_CDI = "k8s.gpu.amd.com/gpu=9f2b8c4e-1d3a-4b5c-8e7f-0a1b2c3d4e5f-gpu-2-129"

# For every PLUGINS row, an id of the form its source produces (the row's `source` names the
# file and function), on a fixture machine, and what it maps to.
ROWS = {
    "intel-gpu": ("hybrid-two-gpu", I915, "card1-0", IGPU),
    "intel-gpu-monitoring": (
        "hybrid-two-gpu",
        "gpu.intel.com/i915_monitoring",
        "all",
        "monitoring",
    ),
    "intel-npu": ("intel-npu", "npu.intel.com/accel", "accel0-0", "0000:00:0b.0"),
    "amd-gpu": ("hybrid-two-gpu", "amd.com/gpu", DGPU, DGPU),
    "amd-gpu-partition": (MI300, "amd.com/cpx_nps1", "amdgpu_xcp_0", XCP0),
    "amd-dra": (MI300, "gpu.amd.com", "gpu-3-130", "platform:amdgpu_xcp_1"),
    "amd-dra-cdi": (MI300, "gpu.amd.com", AMD_DRA_CDI, XCP0),
    "habana": ("gaudi", "habana.ai/gaudi2", "AN87654321", "0000:33:00.0"),
}


def test_every_id_format_row_maps_an_id_its_source_produces() -> None:
    assert set(ROWS) == {fmt.plugin for fmt in PLUGINS}
    for fmt in PLUGINS:
        machine, resource, ident, device = ROWS[fmt.plugin]
        assert fmt.resource.fullmatch(resource) and fmt.id.fullmatch(ident), fmt.plugin
        numa = (0,) if fmt.plugin == "habana" else ()
        assert mapper(machine).device(resource, ident, numa=numa) == device, fmt.plugin


@pytest.mark.parametrize(
    ("machine", "resource", "ident", "device"),
    [
        # Intel GPU plugin: cardN-<share>, the card's PCI function (not card numbering order).
        ("hybrid-two-gpu", I915, "card1-0", IGPU),
        ("hybrid-two-gpu", I915, "card1-7", IGPU),
        ("intel-arc-xe", "gpu.intel.com/xe", "card0-0", "0000:03:00.0"),
        # Intel NPU plugin: accelN-<share>.
        ("intel-npu", "npu.intel.com/accel", "accel0-0", "0000:00:0b.0"),
        # AMD: the PCI address.
        ("hybrid-two-gpu", "amd.com/gpu", DGPU, DGPU),
        # AMD in the mixed strategy: the partition type as the resource, and MI300 partitions.
        (MI300, "amd.com/cpx_nps1", "0000:05:00.0", "0000:05:00.0"),
        (MI300, "amd.com/gpu", "amdgpu_xcp_1", "platform:amdgpu_xcp_1"),
        (MI300, "amd.com/gpu", "amdgpu_xcp_7", Unmapped.NO_DEVICE),
        # AMD's DRA names: card and render minors of one device; NVIDIA's DRA gpu-0 is none.
        (MI300, "gpu.amd.com", "gpu-1-128", "0000:05:00.0"),
        (MI300, "gpu.amd.com", "gpu-1-129", Unmapped.NO_DEVICE),  # two devices' nodes
        (MI300, "gpu.nvidia.com", "gpu-0", Unmapped.UNKNOWN_FORMAT),
        # Intel's monitoring resource: every GPU's telemetry, not an allocation.
        ("intel-arc-xe", "gpu.intel.com/xe_monitoring", "all", Unmapped.MONITORING),
        # Fallbacks: a PCI address (also dashed, as DRA drivers name devices) or a node name.
        ("qualcomm-ai100", "qualcomm.com/qaic", "qaic-0000:41:00.0", "0000:41:00.0"),
        ("hybrid-two-gpu", "gpu.intel.com", "0000-00-02-0-0x9a49", IGPU),
        ("hybrid-two-gpu", "example.com/gpu", "renderD128", DGPU),
        ("hybrid-two-gpu", "example.com/gpu", "gpu=card1", IGPU),
        # Unmapped, with the reason.
        ("hybrid-two-gpu", I915, "", Unmapped.EMPTY_ID),
        ("hybrid-two-gpu", I915, "card9-0", Unmapped.NO_DEVICE),
        ("hybrid-two-gpu", "amd.com/gpu", "0000:99:00.0", Unmapped.NO_DEVICE),
        ("hybrid-two-gpu", "example.com/gpu", "gpu-uuid-1234", Unmapped.UNKNOWN_FORMAT),
        ("hybrid-two-gpu", "example.com/gpu", "card10", Unmapped.NO_DEVICE),
        ("hybrid-two-gpu", "habana.ai/gaudi2", "AN87654321", Unmapped.NO_DEVICE),  # no Gaudi
    ],
)
def test_id_formats(machine: str, resource: str, ident: str, device: str) -> None:
    assert mapper(machine).device(resource, ident) == device


@pytest.mark.parametrize(
    ("numa", "device"),
    [
        ((0,), "0000:33:00.0"),  # the only card on NUMA node 0
        ((1,), "0000:b3:00.0"),
        ((), Unmapped.SERIAL_UNRESOLVABLE),  # no topology: either card
        ((0, 1), Unmapped.SERIAL_UNRESOLVABLE),
        ((2,), Unmapped.SERIAL_UNRESOLVABLE),  # discovery found Gaudis: never no_device
    ],
)
def test_gaudi_serial_maps_through_the_plugins_numa_node(numa: tuple, device: str) -> None:
    # No unprivileged file or ioctl names a card's serial; the fixture's cards have none.
    assert mapper("gaudi").device("habana.ai/gaudi2", "AN87654321", numa=numa) == device


def test_a_single_gaudi_is_the_serials_card_without_topology() -> None:
    one = [d for d in discover(TESTDATA / "gaudi") if d.numa_node == 1]
    assert Mapper(one).device("habana.ai/gaudi2", "AN12345678") == "0000:b3:00.0"


def test_dra_device_mapped_by_cdi_name_when_its_name_says_nothing() -> None:
    a = Allocated("ns", "p", "c", "gpu.example.com", "gpu-0", cdi=("example.com/gpu=card1",))
    shares, unmapped = held([a], mapper("hybrid-two-gpu"))
    assert shares == {Held("ns", "p", "c", IGPU, "gpu.example.com"): 1}
    assert unmapped == {}


# --- the client against a real gRPC server ----------------------------------------------------

STATE = {
    "pods": [
        pod("ml", "idle", [container("main", {I915: ["card1-0"]})]),
        pod("ml", "a", [container("main", {I915: ["card1-1", "card1-2"]})]),
        pod("ml", "b", [container("main", {I915: ["card1-3"]})]),
        pod(
            "ml",
            "dra",
            [
                container(
                    "main",
                    dynamic=[
                        {
                            "claim": "gpu",
                            "claim_namespace": "ml",
                            "devices": [
                                {"driver": "gpu.example.com", "pool": "n1", "device": DGPU}
                            ],
                        }
                    ],
                )
            ],
        ),
        pod("ml", "unknown", [container("main", {"example.com/thing": ["x1", ""]})]),
        pod("", "nameless", [container("main", {I915: ["card1-4"]})]),
    ],
}


@pytest.fixture
def sock(tmp_path: Path) -> str:
    return str(tmp_path / "pod-resources" / "kubelet.sock")


@pytest.fixture
def kubelet(sock: str) -> Iterator[PodResourcesTestServer]:
    server = PodResourcesTestServer(json.loads(json.dumps(STATE)))
    server.start(sock)
    yield server
    server.stop()


def test_list_gives_device_plugin_and_dra_ids(kubelet: PodResourcesTestServer, sock: str) -> None:
    found, skipped = PodResourcesClient(sock).list()
    assert Allocated("ml", "a", "main", I915, "card1-2") in found
    assert (
        Allocated("ml", "dra", "main", "gpu.example.com", DGPU, pool="n1", claim="ml/gpu") in found
    )
    assert skipped == {"empty_pod": 1}
    assert len(found) == 7


def test_allocatable_is_asked_once_a_connection_and_again_after_a_redial(
    kubelet: PodResourcesTestServer, sock: str
) -> None:
    client = PodResourcesClient(sock, timeout=2)
    with pytest.raises(PodResourcesError, match="GetAllocatableResources: UNIMPLEMENTED"):
        client.allocatable()
    assert client.allocatable() is None  # not available on this connection: not asked again
    assert kubelet.requests["GetAllocatableResources"] == 1
    kubelet.stop()
    kubelet.set_state({**STATE, "allocatable": [{"resource": I915, "ids": ["card1-0"]}]})
    with pytest.raises(PodResourcesError):
        client.list()  # the kubelet restarts: the channel goes, the next one asks again
    kubelet.start(sock)
    assert client.allocatable() == [Allocated("", "", "", I915, "card1-0")]
    assert client.allocatable() == [Allocated("", "", "", I915, "card1-0")]  # its answer, kept
    assert kubelet.requests["GetAllocatableResources"] == 2


def test_allocatable(kubelet: PodResourcesTestServer, sock: str) -> None:
    allocatable = [{"resource": I915, "ids": ["card1-0", "card1-1"], "numa": [0, 1]}]
    kubelet.set_state({**STATE, "allocatable": allocatable})
    assert PodResourcesClient(sock).allocatable() == [
        Allocated("", "", "", I915, "card1-0", numa=(0, 1)),
        Allocated("", "", "", I915, "card1-1", numa=(0, 1)),
    ]


def test_an_id_repeated_per_numa_node_is_one_share(
    kubelet: PodResourcesTestServer, sock: str
) -> None:
    # The kubelet sends a device once per NUMA node of its topology.
    devices = [{"resource": I915, "ids": ["card1-0"], "numa": [0, 1]}]
    kubelet.set_state({"pods": [pod("ml", "p", [{"name": "c", "devices": devices}])]})
    found, _ = PodResourcesClient(sock).list()
    assert found == [Allocated("ml", "p", "c", I915, "card1-0", numa=(0, 1))]
    shares, _ = held(found, mapper("hybrid-two-gpu"))
    assert shares == {Held("ml", "p", "c", IGPU, I915): 1}


def test_list_unimplemented_is_an_error_not_a_crash(
    kubelet: PodResourcesTestServer, sock: str
) -> None:
    kubelet.set_state({**STATE, "fail": {"List": "UNIMPLEMENTED"}})
    with pytest.raises(PodResourcesError, match="List: UNIMPLEMENTED"):
        PodResourcesClient(sock).list()


def test_kubelet_restart_reconnects(kubelet: PodResourcesTestServer, sock: str) -> None:
    client = PodResourcesClient(sock, timeout=2)
    assert client.list()[0]
    kubelet.stop()
    with pytest.raises(PodResourcesError):
        client.list()
    kubelet.start(sock)  # a new socket file, as a restarted kubelet makes
    assert client.list()[0]


def test_no_socket_is_an_error_not_a_crash(tmp_path: Path) -> None:
    with pytest.raises(PodResourcesError, match="UNAVAILABLE"):
        PodResourcesClient(str(tmp_path / "none.sock"), timeout=1).list()


# --- idle, shared and unallocated accounting --------------------------------------------------


def points(metrics: Series, spec: object) -> dict[tuple, float]:
    found = dict(metrics.collect())[spec]  # type: ignore[index]
    return {tuple(sorted(p.attrs.items())): p.value for p in found}


def value(metrics: Series, spec: object, **attrs: str) -> float | None:
    return points(metrics, spec).get(tuple(sorted(attrs.items())))


def hold(
    ns: str, p: str, device: str = IGPU, resource: str = I915, uid: str = ""
) -> dict[str, str]:
    labels = {"namespace": ns, "pod": p, "pod_uid": uid, "container": "main", "device": device}
    return labels | {"resource": resource}


Tracked = tuple[Allocations, Series, Clock, Activity]


@pytest.fixture
def tracked(kubelet: PodResourcesTestServer, sock: str) -> Tracked:
    clock = Clock()
    metrics = table(300, 1000, clock=clock)
    activity = Activity(300, clock)
    allocations = Allocations(
        PodResourcesClient(sock), mapper("hybrid-two-gpu"), metrics, 10, activity, clock=clock
    )
    return allocations, metrics, clock, activity


def submit(activity: Activity, p: str, device: str = IGPU, n: int = 1) -> None:
    activity.submitted(("ml", p, "main", device), n)


def test_shares_and_unmapped(tracked: Tracked) -> None:
    allocations, metrics, _, _ = tracked
    assert allocations.refresh()
    assert value(metrics, ALLOCATED, **hold("ml", "a")) == 2  # two shares of one card
    assert value(metrics, ALLOCATED, **hold("ml", "b")) == 1  # shares the card with a
    dra = hold("ml", "dra", DGPU, "gpu.example.com")
    assert value(metrics, ALLOCATED, **dra) == 1
    unmapped = points(metrics, ALLOCATIONS_UNMAPPED)
    assert unmapped == {
        (("reason", "unknown_format"), ("resource", "example.com/thing")): 1,
        (("reason", "empty_id"), ("resource", "example.com/thing")): 1,
        (("reason", "empty_pod"), ("resource", "")): 1,
    }


def test_a_first_use_of_exactly_one_busy_second_ends_the_idle_streak(tracked: Tracked) -> None:
    allocations, metrics, clock, activity = tracked
    allocations.refresh()
    clock.now += 10
    activity.busy(("ml", "b", "main", IGPU), 1.0)  # any first use differs from none at all
    allocations.refresh()
    assert value(metrics, ALLOCATED_IDLE_FOR, **hold("ml", "b")) == 0
    assert value(metrics, ALLOCATED_IDLE_FOR, **hold("ml", "idle")) == 10


def test_idle_allocation_accumulates_and_use_stops_it(tracked: Tracked) -> None:
    allocations, metrics, clock, activity = tracked
    allocations.refresh()
    assert value(metrics, ALLOCATED_IDLE, **hold("ml", "idle")) == 0
    clock.now += 10
    submit(activity, "a")  # a submits; b only shares the card: its calls are not b's use
    allocations.refresh()
    assert value(metrics, ALLOCATED_IDLE, **hold("ml", "idle")) == 10
    assert value(metrics, ALLOCATED_IDLE, **hold("ml", "a")) == 0
    assert value(metrics, ALLOCATED_IDLE, **hold("ml", "b")) == 10
    clock.now += 10
    activity.busy(("ml", "b", "main", IGPU), 0.5)  # engine time from usage
    allocations.refresh()
    assert value(metrics, ALLOCATED_IDLE, **hold("ml", "idle")) == 20
    assert value(metrics, ALLOCATED_IDLE, **hold("ml", "b")) == 10  # engine time is use
    assert value(metrics, ALLOCATED_IDLE, **hold("ml", "a")) == 10  # no submit since
    # The current streak: idle all along, broken by engine time, idle since the submit.
    streaks = {p: value(metrics, ALLOCATED_IDLE_FOR, **hold("ml", p)) for p in ("idle", "a", "b")}
    assert streaks == {"idle": 20, "a": 10, "b": 0}


def test_idle_then_used_then_idle_again(tracked: Tracked) -> None:
    """A's allocation: idle 10 s, used, then idle 20 s. Idle time adds up across the use (10,
    then 30); the streak starts again from the use (10 s, then 0, then 20 s)."""
    allocations, metrics, clock, activity = tracked
    seen = []
    for used in (False, False, True, False, False):
        if used:
            submit(activity, "a")
        allocations.refresh()
        a = hold("ml", "a")
        seen.append((value(metrics, ALLOCATED_IDLE, **a), value(metrics, ALLOCATED_IDLE_FOR, **a)))
        clock.now += 10
    assert seen == [(0, 0), (10, 10), (10, 0), (20, 10), (30, 20)]


def test_calls_on_a_device_not_allocated_are_flagged(tracked: Tracked) -> None:
    allocations, metrics, clock, activity = tracked
    allocations.refresh()
    submit(activity, "dra", n=3)  # dra holds the dGPU, calls the iGPU
    submit(activity, "stranger", DGPU)  # holds nothing
    clock.now += 10
    allocations.refresh()

    def user(p: str, d: str) -> tuple:
        return tuple(
            sorted(
                {
                    "namespace": "ml",
                    "pod": p,
                    "pod_uid": "",
                    "container": "main",
                    "device": d,
                }.items()
            )
        )

    want = {user("dra", IGPU): 3, user("stranger", DGPU): 1}
    assert points(metrics, UNALLOCATED_CALLS) == want
    clock.now += 10
    allocations.refresh()  # no calls since: the counter holds
    assert points(metrics, UNALLOCATED_CALLS) == want
    submit(activity, "dra", n=2)
    allocations.refresh()
    assert points(metrics, UNALLOCATED_CALLS) == {**want, user("dra", IGPU): 5}
    activity.gone("ml", "stranger", "main")  # its cgroup is gone: the series retires after ttl
    clock.now += 299
    allocations.refresh()
    assert user("stranger", DGPU) in points(metrics, UNALLOCATED_CALLS)
    clock.now += 1
    allocations.refresh()
    assert points(metrics, UNALLOCATED_CALLS) == {user("dra", IGPU): 5}


def test_released_allocation_retires(kubelet: PodResourcesTestServer, tracked: Tracked) -> None:
    allocations, metrics, clock, _ = tracked
    allocations.refresh()
    kubelet.set_state({"pods": STATE["pods"][1:]})
    clock.now += 10
    allocations.refresh()
    assert value(metrics, ALLOCATED, **hold("ml", "idle")) is None
    assert value(metrics, ALLOCATED_IDLE, **hold("ml", "idle")) is None


def test_dead_kubelet_is_counted_and_last_allocations_kept(
    kubelet: PodResourcesTestServer, tracked: Tracked, caplog
) -> None:
    allocations, metrics, _, _ = tracked
    allocations.refresh()
    assert value(metrics, PODRESOURCES_ERRORS) == 1  # no GetAllocatableResources: counted once
    kubelet.stop()
    with caplog.at_level(logging.WARNING):
        assert not allocations.refresh()
        assert not allocations.refresh()
    assert value(metrics, PODRESOURCES_ERRORS) == 3
    assert len([r for r in caplog.records if "retrying" in r.message]) == 1  # once a streak
    assert value(metrics, ALLOCATED, **hold("ml", "a")) == 2


def test_thousands_of_pods(kubelet: PodResourcesTestServer, sock: str) -> None:
    pods = [pod("ml", f"p{i}", [container("main", {I915: [f"card1-{i}"]})]) for i in range(5000)]
    pods += [pod("ml", f"q{i}", [container("main", {"x.com/y": [f"z{i}"]})]) for i in range(5000)]
    kubelet.set_state({"pods": pods})
    metrics = table(300, 15_001)  # allocation series count against max_series
    client = PodResourcesClient(sock)
    assert Allocations(client, mapper("hybrid-two-gpu"), metrics, 10, Activity(300)).refresh()
    assert len(points(metrics, ALLOCATED)) == 5000
    assert value(metrics, ALLOCATIONS_UNMAPPED, resource="x.com/y", reason="unknown_format") == 5000


def test_server_runs_standalone_and_rereads_its_state(tmp_path: Path, sock: str) -> None:
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"pods": [pod("ml", "x", [container("c", {I915: ["card1-0"]})])]}))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), ""])}
    server = subprocess.Popen(
        [
            sys.executable,
            str(Path(__file__).parent / "podresources_server.py"),
            "--socket",
            sock,
            "--state",
            str(state),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert server.stdout is not None
        assert server.stdout.readline().strip() == f"listening on unix:{sock}"
        client = PodResourcesClient(sock)
        assert client.list()[0] == [Allocated("ml", "x", "c", I915, "card1-0")]
        state.write_text(json.dumps({"pods": []}))
        assert client.list()[0] == []
    finally:
        server.terminate()
        assert server.wait(10) == 0


# The chart's capability set: uid 0 with only BPF and PERFMON (no DAC_OVERRIDE). connect() on a
# unix socket needs write permission on its file: the kubelet's (root-owned, mode 0755 under its
# umask 022, or tighter) grants it to its owner, uid 0, with no capability. The same socket owned
# by another uid is refused, which shows the measurement can fail.
_CHART_CAPS = ["setpriv", "--bounding-set=-all,+bpf,+perfmon", "--inh-caps=-all", "--"]
_ASK = (
    "import sys\n"
    "from kubenpu.resolve.podresources.client import PodResourcesClient, PodResourcesError\n"
    "try:\n    print(len(PodResourcesClient(sys.argv[1], timeout=2).list()[0]))\n"
    "except PodResourcesError as e:\n    print(e)\n"
)


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root, setpriv")
@pytest.mark.parametrize(
    ("mode", "owner", "answer"),
    [(0o755, 0, "7"), (0o600, 0, "7"), (0o755, 65534, "Permission denied")],
)
def test_chart_capabilities_can_use_a_root_owned_socket(
    kubelet: PodResourcesTestServer, sock: str, mode: int, owner: int, answer: str
) -> None:
    os.chmod(sock, mode)
    os.chown(sock, owner, owner)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    out = subprocess.run(
        [*_CHART_CAPS, sys.executable, "-c", _ASK, sock], capture_output=True, text=True, env=env
    )
    assert answer in out.stdout, out.stderr


# --- a kubelet that answers part of the API, or nothing at all --------------------------------


def test_allocatable_disabled_still_exports_every_allocation(
    kubelet: PodResourcesTestServer, tracked: Tracked, caplog
) -> None:
    # KubeletPodResourcesGetAllocatable off: the kubelet answers UNKNOWN ("... disabled").
    kubelet.set_state({**STATE, "fail": {"GetAllocatableResources": "UNKNOWN"}})
    allocations, metrics, clock, _ = tracked
    with caplog.at_level(logging.DEBUG):
        for _ in range(3):
            assert allocations.refresh()
            clock.now += 10
    assert value(metrics, ALLOCATED, **hold("ml", "a")) == 2
    assert kubelet.requests["GetAllocatableResources"] == 1  # once a connection
    assert value(metrics, PODRESOURCES_ERRORS) == 1
    (warned,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warned.endswith(
        "GetAllocatableResources: UNKNOWN: ... failed as asked; using List alone"
    )


def test_calls_on_an_allocatable_device_nobody_holds_are_unallocated(
    kubelet: PodResourcesTestServer, tracked: Tracked
) -> None:
    allocatable = [{"resource": "amd.com/gpu", "ids": [DGPU]}]
    kubelet.set_state({"pods": STATE["pods"][:1], "allocatable": allocatable})
    allocations, metrics, clock, activity = tracked
    allocations.refresh()
    submit(activity, "stranger", DGPU, n=4)  # nobody holds the dGPU; the plugin offers it
    clock.now += 10
    allocations.refresh()
    user = {
        "namespace": "ml",
        "pod": "stranger",
        "pod_uid": "",
        "container": "main",
        "device": DGPU,
    }
    assert value(metrics, UNALLOCATED_CALLS, **user) == 4


def test_calls_on_a_device_no_allocation_names_are_not_unallocated(
    kubelet: PodResourcesTestServer, tracked: Tracked
) -> None:
    """The dGPU is neither held (only the iGPU is) nor allocatable: the kubelet does not manage
    it, so calls on it are no one's unallocated use; the iGPU's stranger is."""
    kubelet.set_state({"pods": STATE["pods"][:1], "allocatable": []})
    allocations, metrics, clock, activity = tracked
    allocations.refresh()
    submit(activity, "stranger", DGPU, n=4)
    submit(activity, "stranger", IGPU, n=2)
    clock.now += 10
    allocations.refresh()
    user = {"namespace": "ml", "pod": "stranger", "container": "main", "pod_uid": ""}
    assert points(metrics, UNALLOCATED_CALLS) == {
        tuple(sorted({**user, "device": IGPU}.items())): 2
    }


def test_list_unimplemented_is_one_counted_line_a_streak(
    kubelet: PodResourcesTestServer, tracked: Tracked, caplog
) -> None:
    kubelet.set_state({**STATE, "fail": {"List": "UNIMPLEMENTED"}})
    allocations, metrics, _, _ = tracked
    with caplog.at_level(logging.INFO):
        assert not allocations.refresh()
        assert not allocations.refresh()
    assert value(metrics, PODRESOURCES_ERRORS) == 2
    (line,) = [r for r in caplog.records if r.name == "kubenpu.sources.allocations"]
    assert "List: UNIMPLEMENTED" in line.getMessage() and line.exc_info is None


def test_a_device_plugged_after_start_maps_once_rediscovered(
    kubelet: PodResourcesTestServer, sock: str
) -> None:
    clock, metrics = Clock(), table(300, 1000)
    found: list[Device] = []  # the first discovery saw no device
    client = PodResourcesClient(sock)
    allocations = Allocations(
        client, Mapper(found), metrics, 10, Activity(300, clock), lambda: found, clock=clock
    )
    allocations.refresh()
    no_device = {"resource": I915, "reason": "no_device"}
    assert value(metrics, ALLOCATIONS_UNMAPPED, **no_device) == 4
    found += discover(TESTDATA / "hybrid-two-gpu")  # plugged in
    clock.now += 60
    allocations.refresh()
    assert value(metrics, ALLOCATIONS_UNMAPPED, **no_device) is None
    assert value(metrics, ALLOCATED, **hold("ml", "a")) == 2


def test_an_mi300_partition_allocated_and_busy_is_not_idle(
    kubelet: PodResourcesTestServer, sock: str
) -> None:
    partition = "amd.com/cpx_nps1"  # the mixed strategy's resource for a CPX/NPS1 partition
    busy = container("main", {partition: ["amdgpu_xcp_0"]})
    idle = container("main", {partition: ["amdgpu_xcp_1"]})
    kubelet.set_state({"pods": [pod("ml", "busy", [busy]), pod("ml", "idle", [idle])]})
    clock, metrics = Clock(), table(300, 1000)
    activity = Activity(300, clock)
    client = PodResourcesClient(sock)
    allocations = Allocations(client, mapper(MI300), metrics, 10, activity, clock=clock)
    allocations.refresh()
    clock.now += 10
    activity.submitted(("ml", "busy", "main", XCP0), 3)  # its calls on the partition's node
    allocations.refresh()
    busy_hold = hold("ml", "busy", XCP0, partition)
    idle_hold = hold("ml", "idle", "platform:amdgpu_xcp_1", partition)
    assert value(metrics, ALLOCATED, **busy_hold) == 1
    assert value(metrics, ALLOCATED_IDLE, **busy_hold) == 0
    assert value(metrics, ALLOCATED_IDLE, **idle_hold) == 10


class WedgedKubelet:
    """A unix socket that accepts connections and never reads or answers."""

    def __init__(self, path: str) -> None:
        self.accepted = threading.Event()
        self._sock = socket.socket(socket.AF_UNIX)
        self._sock.bind(path)
        self._sock.listen()
        self._held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return  # closed
            self._held.append(conn)
            self.accepted.set()

    def close(self) -> None:
        for conn in self._held:
            conn.close()
        self._sock.close()


def test_a_wedged_kubelet_does_not_hold_the_stop(tmp_path: Path, caplog) -> None:
    wedged = WedgedKubelet(str(tmp_path / "kubelet.sock"))
    metrics = table(300, 1000)
    # The longest request timeout the config allows, and an interval beyond the stop deadline.
    client = PodResourcesClient(str(tmp_path / "kubelet.sock"), timeout=60)
    allocations = Allocations(client, Mapper([]), metrics, 3600, Activity(300))
    exported = threading.Event()
    # Shorter than gRPC's 20 s connect handshake timeout, after which the request would fail
    # by itself: the stop must not wait for it at all.
    services = Services(10)
    services.add("exporters", exported.set)  # started first, stopped last: the final push
    services.add("allocations", allocations.close)
    try:
        allocations.start()
        assert wedged.accepted.wait(30)  # List is in flight, never to be answered
        with caplog.at_level(logging.WARNING):
            services.shutdown()
    finally:
        wedged.close()
    assert exported.is_set()
    assert not [r for r in caplog.records if "stop deadline" in r.getMessage()]
    assert value(metrics, PODRESOURCES_ERRORS) == 0  # its own stop, not a kubelet failure


def test_an_mi300_partitions_calls_are_counted_as_its_use(
    kubelet: PodResourcesTestServer, sock: str
) -> None:
    # The probe's device table takes the partitions' nodes as amdgpu's (discovery gives them
    # the vendor), and attribution hands their submit calls to allocations as the partition's.
    devices = select_devices(discover(TESTDATA / MI300), [])
    by_node, _ = tables(devices)
    assert by_node[abi.dev_t(226, 129)] == by_node[abi.dev_t(226, 128)] == vendor_ids()["amdgpu"]
    partition = "amd.com/cpx_nps1"
    kubelet.set_state(
        {"pods": [pod("ml", "p", [container("main", {partition: ["amdgpu_xcp_0"]})])]}
    )
    clock, metrics = Clock(), table(300, 1000)
    activity, resolver = Activity(300, clock), FakeResolver()
    resolver.answers[7] = Attribution("ml", "p", "main")
    attributor = Attributor(devices, resolver, metrics, activity=activity, clock=clock)
    client = PodResourcesClient(sock)
    allocations = Allocations(client, Mapper(devices), metrics, 10, activity, clock=clock)
    allocations.refresh()
    clock.now += 10
    attributor.flush(Batch(counts=Counter({Key(7, 226, 129, int(Kind.SUBMIT)): 2})))
    allocations.refresh()
    assert value(metrics, ALLOCATED_IDLE, **hold("ml", "p", XCP0, partition)) == 0
    clock.now += 10
    allocations.refresh()
    assert value(metrics, ALLOCATED_IDLE, **hold("ml", "p", XCP0, partition)) == 10


def test_the_agent_wires_allocations(
    kubelet: PodResourcesTestServer, sock: str, tmp_path: Path, monkeypatch
) -> None:
    # The real build(); only the BPF side is faked (FakeKernel), since no probe loads here.
    from fakes import FakeKernel

    from kubenpu.agent import wiring

    monkeypatch.setattr(wiring, "open_kernel", lambda *a, **k: FakeKernel())
    cfg = make_config(
        tmp_path,
        f"discovery:\n  root: {TESTDATA / 'hybrid-two-gpu'}\n"
        f"attribution:\n  cgroup_root: {tmp_path}\n"
        f"  pod_resources:\n    enabled: true\n    socket: {sock}\n"
        "export:\n  prometheus:\n    enabled: false\n",
    )
    with Services(10) as services:
        agent = wiring.build(cfg, services)
        eventually(lambda: value(agent.metrics, ALLOCATED, **hold("ml", "a")) == 2, "allocations")


# --- from mutmut's survivors (docs/mutation.md) -------------------------------------------------


def test_held_maps_a_gaudi_serial_through_the_allocations_numa_node() -> None:
    gaudi = [Allocated("ml", "p", "c", "habana.ai/gaudi2", "AN87654321", numa=(1,))]
    shares, unmapped = held(gaudi, mapper("gaudi"))
    assert shares == {Held("ml", "p", "c", "0000:b3:00.0", "habana.ai/gaudi2"): 1}
    assert unmapped == {}


def test_a_kubelet_back_is_said_once_and_a_new_streak_warns_again(
    kubelet: PodResourcesTestServer, sock: str, tracked: Tracked, caplog
) -> None:
    allocations, *_ = tracked
    failing = {**STATE, "fail": {"List": "UNAVAILABLE"}}
    said: list[str] = []
    with caplog.at_level(logging.INFO, logger="kubenpu.sources.allocations"):
        for state in (failing, failing, STATE, STATE, failing):
            kubelet.set_state(state)
            allocations.refresh()
            said += [f"{r.levelname} {r.getMessage()}" for r in caplog.records]
            caplog.clear()
    said = [s for s in said if not s.endswith("using List alone")]
    warning = f"WARNING PodResources: {sock}: List: UNAVAILABLE: ... failed as asked"
    assert [s.split(";")[0] for s in said] == [warning, "INFO PodResources answers again", warning]
    assert said[0].endswith("; keeping the last allocations, retrying")


def test_a_refresh_ended_by_close_is_not_the_kubelets_failure(
    kubelet: PodResourcesTestServer, tracked: Tracked
) -> None:
    allocations, metrics, _, _ = tracked
    allocations.close()
    assert not allocations.refresh()
    assert not value(metrics, PODRESOURCES_ERRORS)


def test_allocatable_unavailable_again_after_a_redial_is_not_warned_again(
    kubelet: PodResourcesTestServer, sock: str, tracked: Tracked, caplog
) -> None:
    kubelet.set_state({**STATE, "fail": {"GetAllocatableResources": "UNKNOWN"}})
    allocations, _, _, _ = tracked
    with caplog.at_level(logging.DEBUG, logger="kubenpu.sources.allocations"):
        assert allocations.refresh()
        kubelet.stop()
        assert not allocations.refresh()  # the channel goes: the next one asks again
        kubelet.start(sock)
        assert allocations.refresh()
    assert kubelet.requests["GetAllocatableResources"] == 2
    using = [r.levelname for r in caplog.records if r.getMessage().endswith("using List alone")]
    assert using == ["WARNING", "DEBUG"]


def test_rediscovery_waits_its_interval_and_only_for_ids_that_name_no_device(
    kubelet: PodResourcesTestServer, sock: str
) -> None:
    clock, metrics = Clock(), table(300, 1000)
    scans: list[float] = []
    found: list[Device] = []

    def rediscover() -> list[Device]:
        scans.append(clock.now)
        return found

    allocations = Allocations(
        PodResourcesClient(sock), Mapper(found), metrics, 10, Activity(300, clock), rediscover,
        clock=clock,
    )  # fmt: skip
    found += discover(TESTDATA / "hybrid-two-gpu")  # plugged in after the first discovery
    clock.now += 30
    allocations.refresh()
    no_device = {"resource": I915, "reason": "no_device"}
    assert scans == [] and value(metrics, ALLOCATIONS_UNMAPPED, **no_device) == 4
    clock.now += 30
    allocations.refresh()
    assert scans == [1060.0] and value(metrics, ALLOCATIONS_UNMAPPED, **no_device) is None
    clock.now += 60  # every id maps now; unknown_format and empty ones are no reason to scan
    allocations.refresh()
    assert scans == [1060.0]
    assert value(metrics, ALLOCATIONS_UNMAPPED, resource="example.com/thing", reason="empty_id")


def test_a_holders_own_calls_and_engine_time_alone_are_not_unallocated(tracked: Tracked) -> None:
    allocations, metrics, clock, activity = tracked
    allocations.refresh()
    submit(activity, "a", n=3)  # a holds the iGPU: its calls are its allocation's use
    activity.busy(("ml", "stranger", "main", DGPU), 0.5)  # engine time, no submit-class call
    clock.now += 10
    allocations.refresh()
    assert points(metrics, UNALLOCATED_CALLS) == {}


def test_calls_without_a_pod_are_not_unallocated(tracked: Tracked) -> None:
    """Only a pod's container can hold an allocation: a host process (no namespace, pod or
    container) and a container no pod owns (ctr's) are not unallocated use of a managed card;
    a pod's container that holds none of it is, one past them."""
    allocations, metrics, clock, activity = tracked
    allocations.refresh()
    activity.submitted(("", "", "", DGPU), 5)  # a host process
    activity.submitted(("default", "", "ctr-bench", DGPU), 3)  # started with ctr
    activity.submitted(("ml", "stranger", "main", DGPU), 1)
    clock.now += 10
    allocations.refresh()
    assert points(metrics, UNALLOCATED_CALLS) == {
        (
            ("container", "main"),
            ("device", DGPU),
            ("namespace", "ml"),
            ("pod", "stranger"),
            ("pod_uid", ""),
        ): 1
    }


def test_allocation_series_carry_the_pod_uid_the_runtime_lists(
    kubelet: PodResourcesTestServer, sock: str, cri: CriTestServer, cri_socket: str
) -> None:
    """The kubelet names pods without their uid: the runtime's ready sandboxes give it, by
    namespace and name (the test server's: one per pod uid its containers name, stopped once
    they have all exited). A predecessor's exited container (same name, old uid) is not taken;
    a pod the runtime does not list gets none; while the runtime is down the last answer
    stays; the same pods are not asked of it again until the answer is a minute old (one
    ListContainers per refresh once failed a node scenario's bound on CRI requests); a pod
    recreated under its name gets its new uid once it is."""
    cri.add_container("c-old", "ml", "a", "main", pod_uid=OLD_UID, exited=True)
    cri.add_container("c-a", "ml", "a", "main", pod_uid=UID)
    cri.add_container("c-x", "ml", "stranger", "main", pod_uid=STRANGER_UID)
    client = CriClient(f"unix://{cri_socket}", timeout=5.0, retry_after=0.0)
    metrics = table(300, 1000)
    activity = Activity(300)
    clock, asked = Clock(), []

    def pod_uids() -> dict[tuple[str, str], str] | None:
        asked.append(clock.now)
        return client.pod_uids()

    allocations = Allocations(
        PodResourcesClient(sock),
        mapper("hybrid-two-gpu"),
        metrics,
        10,
        activity,
        pod_uids=pod_uids,
        clock=clock,
    )
    allocations.refresh()
    activity.submitted(("ml", "stranger", "main", DGPU), 2)  # on a card it holds none of
    assert allocations.refresh()
    assert value(metrics, ALLOCATED, **hold("ml", "a", uid=UID)) == 2
    assert value(metrics, ALLOCATED, **hold("ml", "b")) == 1  # not listed: no uid
    stranger = {"namespace": "ml", "pod": "stranger", "container": "main", "device": DGPU}
    assert value(metrics, UNALLOCATED_CALLS, **stranger, pod_uid=STRANGER_UID) == 2
    assert len(asked) == 2  # the stranger's calls named a pod more
    assert allocations.refresh()
    assert len(asked) == 2  # the same pods, a fresh answer: not asked again
    clock.now += 60
    cri.set_unavailable()
    assert allocations.refresh()
    assert value(metrics, ALLOCATED, **hold("ml", "a", uid=UID)) == 2
    assert len(asked) == 3
    cri.set_unavailable(False)
    cri.remove_container("c-a")
    cri.add_container("c-a2", "ml", "a", "main", pod_uid=NEW_UID)
    clock.now += 1  # the failed ask is asked again at the next refresh
    assert allocations.refresh()
    assert len(asked) == 4
    assert value(metrics, ALLOCATED, **hold("ml", "a", uid=NEW_UID)) == 2
    assert value(metrics, ALLOCATED, **hold("ml", "a", uid=UID)) is None
    client.close()


UID, OLD_UID = "0e6f7c3a-0000-4c5e-8f9a-00000000000a", "0e6f7c3a-0000-4c5e-8f9a-00000000000b"
NEW_UID, STRANGER_UID = "0e6f7c3a-0000-4c5e-8f9a-00000000000c", "0e6f7c3a-0000-4c5e-8f9a-0000000d"


class _Breaks(Activity):
    """An activity whose snapshot fails once, as a bug would."""

    broke = False

    def snapshot(self):  # type: ignore[override]
        if not self.broke:
            self.broke = True
            raise RuntimeError("a bug")
        return super().snapshot()


def test_the_thread_logs_a_failed_refresh_and_goes_on(
    kubelet: PodResourcesTestServer, sock: str, caplog
) -> None:
    metrics = table(300, 1000)
    allocations = Allocations(
        PodResourcesClient(sock), mapper("hybrid-two-gpu"), metrics, 0.01, _Breaks(300)
    )
    allocations.close()  # before start: nothing to join
    allocations = Allocations(
        PodResourcesClient(sock), mapper("hybrid-two-gpu"), metrics, 0.01, _Breaks(300)
    )
    with caplog.at_level(logging.ERROR, logger="kubenpu"):
        allocations.start()
        assert allocations._thread.name == "allocations" and allocations._thread.daemon
        deadline = threading.Event()
        while kubelet.requests["List"] < 3 and not deadline.wait(0.05):
            pass
        allocations.close()
    assert kubelet.requests["List"] >= 3  # the refreshes went on after the failure
    (failed,) = caplog.records
    # Through the source's Report: logged once a streak, counted by source.
    assert failed.getMessage() == "reading allocations failed (retrying): RuntimeError: a bug"
    assert value(metrics, SOURCE_ERRORS, source="allocations") >= 1
    assert value(metrics, ALLOCATED, **hold("ml", "a")) == 2


def test_an_upper_case_pci_address_maps_to_the_device() -> None:
    # sysfs names devices in lower-case hex (pci_name(), "%04x:%02x:%02x.%d" in
    # drivers/pci/probe.c); a plugin or a DRA driver may print the address in upper case.
    assert mapper("gaudi").device("amd.com/gpu", "0000:B3:00.0") == "0000:b3:00.0"


def test_a_dra_devices_cdi_names_come_through_the_client(
    kubelet: PodResourcesTestServer, sock: str
) -> None:
    claim = {"driver": "gpu.example.com", "pool": "n1", "device": "gpu-0"}
    claim["cdi"] = ["example.com/gpu=card1"]  # type: ignore[assignment]
    dynamic = [{"claim": "gpu", "claim_namespace": "ml", "devices": [claim]}]
    kubelet.set_state({"pods": [pod("ml", "p", [container("main", dynamic=dynamic)])]})
    (found,), _ = PodResourcesClient(sock).list()
    assert found.cdi == ("example.com/gpu=card1",)
    assert held([found], mapper("hybrid-two-gpu"))[0] == {
        Held("ml", "p", "main", IGPU, "gpu.example.com"): 1
    }


def test_a_dra_device_whose_name_maps_is_not_remapped_by_its_cdi_name() -> None:
    a = Allocated("ns", "p", "c", "gpu.example.com", DGPU, cdi=("example.com/gpu=card1",))
    assert mapper("hybrid-two-gpu").device(a.resource, a.id, a.cdi) == DGPU


def test_every_nameless_container_is_counted(kubelet: PodResourcesTestServer, sock: str) -> None:
    nameless = [pod("", f"p{i}", [container("main", {I915: [f"card1-{i}"]})]) for i in range(3)]
    # A container without a name is skipped alone: its pod's next container still counts.
    half = pod(
        "ml", "half", [container("", {I915: ["card1-5"]}), container("main", {I915: ["card1-6"]})]
    )
    kubelet.set_state({"pods": [*nameless, half]})
    found = [Allocated("ml", "half", "main", I915, "card1-6")]
    assert PodResourcesClient(sock).list() == (found, Counter({"empty_pod": 4}))


def test_a_channel_closed_between_dial_and_call_says_closed(
    kubelet: PodResourcesTestServer, sock: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    dial = client_module.dial

    def closed_at_once(path: str) -> object:  # close() on another thread, just after the dial
        channel = dial(path)
        channel.close()
        return channel

    monkeypatch.setattr(client_module, "dial", closed_at_once)
    with pytest.raises(PodResourcesError) as err:
        PodResourcesClient(sock).list()
    assert str(err.value) == f"{sock}: closed"


def test_a_request_ends_at_its_timeout_and_every_one_after_close_says_closed(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "kubelet.sock")
    wedged = WedgedKubelet(path)
    client = PodResourcesClient(path, timeout=0.2)
    try:
        with pytest.raises(PodResourcesError, match="DEADLINE_EXCEEDED"):
            client.list()
        slow = PodResourcesClient(path, timeout=60)
        ended: list[BaseException] = []

        def ask() -> None:
            try:
                slow.list()
            except PodResourcesError as err:
                ended.append(err)

        asking = threading.Thread(target=ask)
        asking.start()
        assert wedged.accepted.wait(30)
        slow.close()  # ends the request in flight
        asking.join(30)
        assert [str(e) for e in ended] == [f"{path}: List: CANCELLED: Channel closed!"]
        with pytest.raises(PodResourcesError) as err:
            slow.list()  # and every later one, without a new connection
        assert str(err.value) == f"{path}: closed"
    finally:
        wedged.close()


# --- build(): the source as the agent wires it from its config ---------------------------------


def configured(
    tmp_path: Path,
    sock: str,
    settings: str = "",
    discovery: str = "",
    found: tuple[Device, ...] = (),
) -> Node:
    """A Node (tests/fakes.py's fake_node) that discovered `found` (by default no device), its
    config PodResources at `sock` with `settings` (YAML under pod_resources, enabled: true
    unless they say otherwise) and `discovery` (YAML under discovery, beside its root)."""
    cfg = make_config(
        tmp_path,
        f"discovery:\n  root: {TESTDATA / 'hybrid-two-gpu'}\n{discovery}"
        f"attribution:\n  pod_resources:\n    socket: {sock}\n"
        f"{settings or '    enabled: true'}\n",
    )
    return fake_node(cfg, list(found))


def test_build_makes_no_source_when_disabled_or_without_activity(tmp_path: Path, sock: str) -> None:
    node = configured(tmp_path, sock)
    assert build(replace(node, activity=None)) is None  # nothing would give it signals of use
    assert build(configured(tmp_path, sock, "    enabled: false")) is None  # with activity


def test_the_built_source_refreshes_every_configured_interval(
    kubelet: PodResourcesTestServer, tmp_path: Path, sock: str
) -> None:
    allocations = build(configured(tmp_path, sock, "    enabled: true\n    interval_seconds: 0.01"))
    assert allocations is not None
    allocations.start()
    try:
        # Within the bound only at the interval set: the default 10 s would take 20 s.
        eventually(lambda: kubelet.requests["List"] >= 3, "three refreshes", bound=10)
    finally:
        allocations.close()


def test_the_built_sources_request_ends_at_the_configured_timeout(
    tmp_path: Path, sock: str
) -> None:
    os.makedirs(os.path.dirname(sock))
    wedged = WedgedKubelet(sock)
    node = configured(tmp_path, sock, "    enabled: true\n    timeout_seconds: 0.5")
    allocations = build(node)
    assert allocations is not None
    refresh = threading.Thread(target=allocations.refresh)
    try:
        refresh.start()
        # 0.5 s, with room for a loaded machine; the client's default is 5 s, gRPC's none.
        refresh.join(3)
        assert not refresh.is_alive()
        assert value(node.table, PODRESOURCES_ERRORS) == 1
    finally:
        allocations.close()  # ends a request still in flight
        refresh.join(30)
        wedged.close()


def test_the_built_source_rediscovers_under_the_discovery_root_leaving_ignored_devices_out(
    kubelet: PodResourcesTestServer, tmp_path: Path, sock: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The built source runs on the real clock: rediscover at once instead of after a minute.
    monkeypatch.setattr(allocations_module, "_REDISCOVER_SECONDS", 0.0)
    node = configured(tmp_path, sock, discovery=f"  ignore_devices: ['{DGPU}']\n")
    allocations = build(node)  # the node discovered no device: every id names none at first
    assert allocations is not None and allocations.refresh()
    assert value(node.table, ALLOCATED, **hold("ml", "a")) == 2  # the iGPU, found by the scan
    no_device = {"resource": "gpu.example.com", "reason": "no_device"}
    assert value(node.table, ALLOCATIONS_UNMAPPED, **no_device) == 1  # the dGPU, ignored
    allocations.close()


def test_the_built_source_names_pods_by_the_runtimes_uids(
    kubelet: PodResourcesTestServer, tmp_path: Path, sock: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = configured(tmp_path, sock, found=tuple(discover(TESTDATA / "hybrid-two-gpu")))
    monkeypatch.setattr(node.resolver, "pod_uids", lambda: {("ml", "a"): UID})
    allocations = build(node)
    assert allocations is not None and allocations.refresh()
    assert value(node.table, ALLOCATED, **hold("ml", "a", uid=UID)) == 2
    allocations.close()


def test_the_built_thread_is_stalled_past_three_intervals_and_timeouts(
    kubelet: PodResourcesTestServer, tmp_path: Path, sock: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refresh asks the kubelet twice and the runtime once, each up to its timeout, then
    waits the interval: three of those without a step fail liveness (60 s, twice 5 s and the
    runtime's 2 s: 216 s). The runtime's timeout was once left out: a slow runtime with short
    kubelet settings failed liveness while the thread still worked."""
    clock = Clock()
    monkeypatch.setattr(allocations_module, "Worker", partial(Worker, clock=clock))
    settings = "    enabled: true\n    interval_seconds: 60\n    timeout_seconds: 5"
    allocations = build(configured(tmp_path, sock, settings))
    assert allocations is not None
    worker = allocations.start()
    try:
        # The first step beat before it asked: the clock moves only after it.
        eventually(lambda: kubelet.requests["List"] >= 1, "the first refresh")
        assert worker.name == "allocations"
        assert_stalls_after(worker, clock, 216)
    finally:
        allocations.close()


def test_each_refresh_beats_so_a_long_running_thread_stays_live(
    kubelet: PodResourcesTestServer, sock: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()
    monkeypatch.setattr(allocations_module, "Worker", partial(Worker, clock=clock))
    allocations = Allocations(
        PodResourcesClient(sock), mapper("hybrid-two-gpu"), table(300, 1000), 0.01,
        Activity(300), stale_after=30,
    )  # fmt: skip
    worker = allocations.start()
    try:
        clock.now += 3600  # an hour of steps since the start
        asked = kubelet.requests["List"]
        # Two more requests: at least one whole step, its beat first, began after the move.
        eventually(lambda: kubelet.requests["List"] >= asked + 2, "two more refreshes", bound=10)
        assert worker.broken() is None
    finally:
        allocations.close()
