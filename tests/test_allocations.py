"""Allocations from the kubelet's PodResources API: id formats, the client against a real gRPC
server (tests/podresources_server.py), and idle / shared / unallocated accounting with the real
Metrics."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakes import Clock
from podresources_server import PodResourcesTestServer, container, pod

from kubenpu.allocations import Allocations, held
from kubenpu.discovery import discover
from kubenpu.metrics.catalogue import (
    ALLOCATED,
    ALLOCATED_IDLE,
    ALLOCATED_IDLE_FOR,
    ALLOCATIONS_UNMAPPED,
    ENGINE_BUSY,
    PODRESOURCES_ERRORS,
    UNALLOCATED_CALLS,
)
from kubenpu.metrics.inputs import Held, Where
from kubenpu.metrics.store import Metrics
from kubenpu.resolve.podresources.client import Allocated, PodResourcesClient, PodResourcesError
from kubenpu.resolve.podresources.mapping import Mapper, Unmapped

TESTDATA = Path(__file__).parent / "testdata"
IGPU, DGPU = "0000:00:02.0", "0000:03:00.0"  # hybrid-two-gpu: i915 card1, amdgpu card0
I915 = "gpu.intel.com/i915"


def mapper(machine: str) -> Mapper:
    return Mapper(discover(TESTDATA / machine), TESTDATA / machine)


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
        # Habana: the serial number sysfs prints.
        ("gaudi", "habana.ai/gaudi2", "AN87654321", "0000:33:00.0"),
        ("gaudi", "habana.ai/gaudi2", "AN12345678", "0000:b3:00.0"),
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
        ("gaudi", "habana.ai/gaudi2", "NOSUCHSERIAL", Unmapped.NO_DEVICE),
    ],
)
def test_id_formats(machine: str, resource: str, ident: str, device: str) -> None:
    assert mapper(machine).device(resource, ident) == device


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


def test_unimplemented_allocatable_is_asked_once(
    kubelet: PodResourcesTestServer, sock: str
) -> None:
    client = PodResourcesClient(sock)
    assert client.allocatable() is None
    assert client.allocatable() is None
    assert kubelet.requests["GetAllocatableResources"] == 1


def test_allocatable(kubelet: PodResourcesTestServer, sock: str) -> None:
    kubelet.set_state({**STATE, "allocatable": [{"resource": I915, "ids": ["card1-0", "card1-1"]}]})
    assert PodResourcesClient(sock).allocatable() == [(I915, "card1-0"), (I915, "card1-1")]


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


def points(metrics: Metrics, spec: object) -> dict[tuple, float]:
    found = dict(metrics.collect())[spec]  # type: ignore[index]
    return {tuple(sorted(p.attrs.items())): p.value for p in found}


def value(metrics: Metrics, spec: object, **attrs: str) -> float | None:
    return points(metrics, spec).get(tuple(sorted(attrs.items())))


def hold(ns: str, p: str, device: str = IGPU, resource: str = I915) -> dict[str, str]:
    return {"namespace": ns, "pod": p, "container": "main", "device": device, "resource": resource}


@pytest.fixture
def tracked(kubelet: PodResourcesTestServer, sock: str) -> tuple[Allocations, Metrics, Clock]:
    clock = Clock()
    metrics = Metrics("node", 300, 1000, clock=clock)
    allocations = Allocations(
        PodResourcesClient(sock), mapper("hybrid-two-gpu"), metrics, 10, clock=clock
    )
    return allocations, metrics, clock


def submit(metrics: Metrics, p: str, device: str = IGPU, n: int = 1) -> None:
    metrics.add_calls("ml", p, "main", device, "i915", "submit", n)


def test_shares_and_unmapped(tracked: tuple[Allocations, Metrics, Clock]) -> None:
    allocations, metrics, _ = tracked
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


def test_idle_allocation_accumulates_and_use_stops_it(
    tracked: tuple[Allocations, Metrics, Clock],
) -> None:
    allocations, metrics, clock = tracked
    allocations.refresh()
    assert value(metrics, ALLOCATED_IDLE, **hold("ml", "idle")) == 0
    clock.now += 10
    submit(metrics, "a")  # a submits; b only shares the card: its calls are not b's use
    allocations.refresh()
    assert value(metrics, ALLOCATED_IDLE, **hold("ml", "idle")) == 10
    assert value(metrics, ALLOCATED_IDLE, **hold("ml", "a")) == 0
    assert value(metrics, ALLOCATED_IDLE, **hold("ml", "b")) == 10
    clock.now += 10
    metrics.add_calls("ml", "idle", "main", IGPU, "i915", "wait", 5)  # not submit-class: idle
    metrics.add_engine(ENGINE_BUSY, Where("ml", "b", "main", IGPU, "i915"), "render", 0.5)
    allocations.refresh()
    assert value(metrics, ALLOCATED_IDLE, **hold("ml", "idle")) == 20
    assert value(metrics, ALLOCATED_IDLE, **hold("ml", "b")) == 10  # engine time is use
    assert value(metrics, ALLOCATED_IDLE, **hold("ml", "a")) == 10  # no submit since
    # The current streak: idle all along, broken by engine time, idle since the submit.
    streaks = {p: value(metrics, ALLOCATED_IDLE_FOR, **hold("ml", p)) for p in ("idle", "a", "b")}
    assert streaks == {"idle": 20, "a": 10, "b": 0}


def test_calls_on_a_device_not_allocated_are_flagged(
    tracked: tuple[Allocations, Metrics, Clock],
) -> None:
    allocations, metrics, clock = tracked
    allocations.refresh()
    submit(metrics, "dra", n=3)  # dra holds the dGPU, calls the iGPU
    submit(metrics, "stranger", DGPU)  # holds nothing
    clock.now += 10
    allocations.refresh()

    def user(p: str, d: str) -> tuple:
        return tuple(
            sorted({"namespace": "ml", "pod": p, "container": "main", "device": d}.items())
        )

    want = {user("dra", IGPU): 3, user("stranger", DGPU): 1}
    assert points(metrics, UNALLOCATED_CALLS) == want
    clock.now += 10
    allocations.refresh()  # no calls since: the counter holds
    assert points(metrics, UNALLOCATED_CALLS) == want
    submit(metrics, "dra", n=2)
    allocations.refresh()
    assert points(metrics, UNALLOCATED_CALLS) == {**want, user("dra", IGPU): 5}


def test_released_allocation_retires(
    kubelet: PodResourcesTestServer, tracked: tuple[Allocations, Metrics, Clock]
) -> None:
    allocations, metrics, clock = tracked
    allocations.refresh()
    kubelet.set_state({"pods": STATE["pods"][1:]})
    clock.now += 10
    allocations.refresh()
    assert value(metrics, ALLOCATED, **hold("ml", "idle")) is None
    assert value(metrics, ALLOCATED_IDLE, **hold("ml", "idle")) is None


def test_dead_kubelet_is_counted_and_last_allocations_kept(
    kubelet: PodResourcesTestServer, tracked: tuple[Allocations, Metrics, Clock], caplog
) -> None:
    allocations, metrics, _ = tracked
    allocations.refresh()
    kubelet.stop()
    with caplog.at_level(logging.WARNING):
        assert not allocations.refresh()
        assert not allocations.refresh()
    assert value(metrics, PODRESOURCES_ERRORS) == 2
    assert len([r for r in caplog.records if "PodResources" in r.message]) == 1  # once a streak
    assert value(metrics, ALLOCATED, **hold("ml", "a")) == 2


def test_thousands_of_pods(kubelet: PodResourcesTestServer, sock: str) -> None:
    pods = [pod("ml", f"p{i}", [container("main", {I915: [f"card1-{i}"]})]) for i in range(5000)]
    pods += [pod("ml", f"q{i}", [container("main", {"x.com/y": [f"z{i}"]})]) for i in range(5000)]
    kubelet.set_state({"pods": pods})
    metrics = Metrics("node", 300, 1000)
    assert Allocations(PodResourcesClient(sock), mapper("hybrid-two-gpu"), metrics, 10).refresh()
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
