"""The agent's whole payload, byte for byte: the /metrics scrape (Prometheus text and OpenMetrics,
as Prometheus asks for it) and the OTLP push (semconv and legacy attribute names), against the
golden files tests/testdata/payload-*.

Every source reports into one series table through its families (put, set), with fixed inputs
(one function per source below: what it reports), and the real exporters (export.start: the
metrics server on a port, the pusher to an OTLP/HTTP receiver) render it. Every family of the
catalogue has points; the store's series cap is set so that each of its overflow paths is taken.

The files were written by this test (KUBENPU_REGEN=1) and then read by eye: each family's name,
type, unit, help and labels, and the OTLP names and attributes. A change to them is a change to what
users see, to be read again in review; `scripts/payload_shape.py` prints the shape of a real
agent's scrape or push for the same comparison on a VM run.
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest
from google.protobuf import json_format
from helpers import StubHealth, free_port
from otlp_receiver import OtlpHttpReceiver

# Every kubenpu name the test uses, imported here only: after a move, re-point these lines.
from kubenpu import config, export
from kubenpu.kernel.abi import DURATION_SLOTS, ERRORS, duration_slot
from kubenpu.kernel.records import Durations, JobTimes, Key
from kubenpu.metrics import catalogue as c
from kubenpu.metrics.inputs import AllocationState, DeviceRow, Held, Where
from kubenpu.metrics.own import (
    CERTIFICATES,
    CRI,
    DEVICES,
    EXHAUSTED,
    EXPORT_FAILED,
    INDEX_REBUILT,
    KERNEL_READ_FAILED,
    SOURCE_DURATION,
    SOURCE_FAILED,
    STAMPS,
)
from kubenpu.metrics.series import Series as Metrics
from kubenpu.sources import allocations as alloc
from kubenpu.sources import guard as guard_room
from kubenpu.sources import jobs as gpu_jobs
from kubenpu.sources import telemetry as tel
from kubenpu.sources import usage, wedges
from kubenpu.sources.calls import attribution as calls_room
from kubenpu.sources.registry import table

TESTDATA = Path(__file__).parent / "testdata"
NODE = "node-a"
SECOND = 1_000_000_000
AGENT_START_NS = 1_750_000_000 * SECOND  # 2025-06-15T15:06:40Z
SERIES_TTL = 5.0  # seconds: a pod gone this long before the render is retired, one gone later kept
# The series the sources below hold (ioctl 6, durations 3, remote calls 2, jobs 3 x 4,
# blocked-by 3, allocations 7, telemetry 34, resets 2) plus 2 of the flood's 5 telemetry points:
# over_the_cap() then finds no room.
MAX_SERIES = 71

# --- who calls: the pods and processes the sources report ----------------------------------

MI210 = ("0000:c3:00.0", "amdgpu")
NPU = ("0000:00:0b.0", "ivpu")
UID = "0e6f7c3a-1b2d-4c5e-8f9a-0b1c2d3e4f5a"
OLD_UID = "5b8a2c1d-0000-4c5e-8f9a-0b1c2d3e4f5a"  # the same pod name, before a restart
TRAINER = Where("ml", "trainer-0", UID, "worker", *MI210)
OLD_TRAINER = Where("ml", "trainer-0", OLD_UID, "worker", *MI210)
SERVER = Where("serving", "llm-0", "7d1e2f3a-4b5c-4d6e-8f70-8192a3b4c5d6", "server", *NPU)
BATCH_UID = "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d"
BATCH = Where("batch", "job-0", BATCH_UID, "step", *MI210)
CTR = Where("default", "", "", "ctr-bench", *MI210)  # started with ctr: no pod labels
HOST_TOOL = Where("", "", "", "", *MI210)  # a host process: counted, labels empty


def calls(m: Metrics, who: Where, kind: str, n: int) -> None:
    m.add_calls(who.namespace, who.pod, who.container, who.device, who.vendor, kind, n, who.pod_uid)


def gone(m: Metrics, who: Where) -> None:
    m.gone(who)


def durations(seconds: list[float], errors: dict[str, int] | None = None) -> Durations:
    """One cgroup's cumulative durations, in the kernel's slots."""
    slots = [0] * DURATION_SLOTS
    for s in seconds:
        slots[duration_slot(round(s * SECOND))] += 1
    errs = tuple((errors or {}).get(name, 0) for name in ERRORS)
    return Durations(round(sum(seconds) * SECOND), tuple(slots), errs)


def hw(device: tuple[str, str], kind: str, name: str) -> c.Attrs:
    """A device's hw.* attributes, in the order the telemetry source builds them."""
    vendor = {"amdgpu": "AMD", "ivpu": "Intel"}[device[1]]
    base = {"device": device[0], "vendor": device[1], "hw.id": device[0], "hw.type": kind}
    return {**base, "hw.vendor": vendor, "hw.name": name}


def sensor(device: c.Attrs, chip: str, name: str, kind: str) -> c.Attrs:
    """A sensor's own component attributes (semconv: hw.parent names the device, whose name,
    vendor and descriptions it does not repeat)."""
    own = {"hw.id": f"{device['hw.id']}/{chip}/{name}", "hw.type": kind}
    parent = {"device": device["device"], "vendor": device["vendor"], "hw.parent": device["hw.id"]}
    return {**parent, **own, "sensor": name, "chip": chip}


# --- what each source reports ----------------------------------------------------------------


def wiring(m: Metrics) -> None:
    """The devices the agent counts."""
    m.set(
        DEVICES,
        NODE,
        [DeviceRow(*MI210, "amdgpu", "1002:740f", "0"), DeviceRow(*NPU, "ivpu", "", "")],
    )


def kernel(m: Metrics) -> None:
    """The probe's counts, call durations and losses, as attributed."""
    calls(m, TRAINER, "submit", 120)
    calls(m, TRAINER, "alloc", 7)
    calls(m, OLD_TRAINER, "submit", 30)
    calls(m, SERVER, "wait", 4)
    calls(m, CTR, "submit", 2)
    calls(m, HOST_TOOL, "alloc", 3)
    # Two cgroups of one series sum slot by slot; an ETIME failure is counted by name.
    m.put(
        calls_room.DURATIONS,
        TRAINER,
        "submit",
        (Key(101, 226, 1, 1), durations([2e-6, 0.0012, 70.0])),
    )
    m.put(
        calls_room.DURATIONS,
        TRAINER,
        "submit",
        (Key(102, 226, 1, 1), durations([3e-4], {"ETIME": 1})),
    )
    m.put(
        calls_room.DURATIONS,
        TRAINER,
        "alloc",
        (Key(101, 226, 1, 2), durations([5e-5], {"ENOMEM": 2})),
    )
    m.put(
        calls_room.DURATIONS, SERVER, "wait", (Key(201, 261, 0, 3), durations([0.02], {"EINTR": 1}))
    )
    # The trainer's calls on the MI210 (NUMA node 0): two cgroups' remote calls sum; a key
    # without any is 0 (its share is 0, not unknown).
    m.put(calls_room.REMOTE, TRAINER, "submit", (Key(101, 226, 1, 1), 80))
    m.put(calls_room.REMOTE, TRAINER, "submit", (Key(102, 226, 1, 1), 10))
    m.put(calls_room.REMOTE, TRAINER, "alloc", (Key(101, 226, 1, 2), 0))
    m.set(calls_room.EVENTS, "", 166)
    m.set(calls_room.DROPS, "ringbuf_full", 3)
    m.set(calls_room.DROPS, "device_unknown", 1)
    m.set(calls_room.UNTIMED_CALLS, "", 2)
    m.set(calls_room.LATE, "", 1)
    m.set(KERNEL_READ_FAILED, "", 1)
    m.set(STAMPS, "kernel", 1_750_000_010.5)


def jobs(m: Metrics) -> None:
    """The DRM GPU scheduler's jobs per ring, and the kernel side's losses."""
    wait = durations([1e-5, 2e-4])
    run = durations([0.003, 0.004])
    m.put(gpu_jobs.JOB_TIMES, TRAINER, "gfx_0.0.0", (101, JobTimes(3, 2, wait, run)))
    m.put(
        gpu_jobs.JOB_TIMES,
        TRAINER,
        "comp_1.0.0",
        (101, JobTimes(1, 1, durations([1e-6]), durations([0.5]))),
    )
    m.put(gpu_jobs.JOB_TIMES, SERVER, "npu", (201, JobTimes(0, 0, durations([]), durations([]))))
    m.set(gpu_jobs.LOST, "", {"unmatched": 2, "keys_full": 0, "events_full": 1, "events_late": 0})
    # the trainer's wait: 1.5 s behind the server's jobs, 0.25 s behind its own, 0.01 s idle
    m.put(gpu_jobs.BEHIND, TRAINER, "gfx_0.0.0\nserving\nllm-0", 1_500_000_000)
    m.put(gpu_jobs.BEHIND, TRAINER, "gfx_0.0.0\nml\ntrainer-0", 250_000_000)
    m.put(gpu_jobs.IDLE, TRAINER, "gfx_0.0.0", 10_000_000)


def attribution(m: Metrics) -> None:
    """Why calls have no pod, and the CRI requests made to find one."""
    m.set(calls_room.UNNAMED, "not_pod", 3)
    m.set(calls_room.UNNAMED, "cri_error", 1)
    m.set(calls_room.EXPIRED, "", 1)
    m.set(CRI, "", (0.004, True))
    m.set(CRI, "", (2.0, False))
    m.set(INDEX_REBUILT, "", 1)


def batch_pod_gone(m: Metrics) -> None:
    """A batch pod's one call, then its container ends: retired before the render."""
    calls(m, BATCH, "submit", 1)
    gone(m, BATCH)


def fdinfo(m: Metrics) -> None:
    """The DRM clients' engine time, cycles, capacities and memory per pod."""
    m.put(usage.ENGINES[c.ENGINE_BUSY], TRAINER, "gfx", 12.5)
    m.put(usage.ENGINES[c.ENGINE_BUSY], SERVER, "compute", 0.25)
    m.put(usage.ENGINES[c.ENGINE_CYCLES], TRAINER, "gfx", 4_000_000)
    m.put(usage.ENGINES[c.ENGINE_TOTAL_CYCLES], TRAINER, "gfx", 9_000_000)
    if not m.put(usage.ENGINES[c.ENGINE_BUSY], TRAINER, "gfx", float("inf")):
        m.set(usage.SKIPS, "out_of_range", 1)  # what Usage counts when the table refuses it
    m.set(
        usage.GAUGES,
        "",
        (
            {(TRAINER, "gfx"): 1, (TRAINER, "compute"): 4, (SERVER, "compute"): 1},
            {
                (TRAINER, "vram", "resident"): 1 << 30,
                (TRAINER, "gtt", "total"): 64 << 20,
                (SERVER, "memory", "resident"): 8 << 20,
            },
        ),
    )
    m.set(usage.SKIPS, "vanished", 2)
    m.set(usage.SKIPS, "no_client_id", 1)
    m.set(EXHAUSTED, "fdinfo", 1)
    m.set(STAMPS, "fdinfo", 1_750_000_011.25)
    m.set(SOURCE_DURATION, "fdinfo", 0.125)  # the framework's, at each read (sources.base.Report)
    m.set(SOURCE_FAILED, "fdinfo", 0)
    m.set(SOURCE_FAILED, "jobs", 1)


STATES = ("ok", "degraded", "failed")  # hw.state: one point each, 1 for the state now


def mi210_telemetry() -> list[tuple[c.Spec, c.Attrs, float]]:
    """A GPU whose driver publishes semconv's descriptive attributes (hw.model, ...)."""
    gpu = hw(MI210, "gpu", "card1") | {"hw.model": "AMD Instinct MI210"}
    gpu |= {"hw.serial_number": "692221000312", "hw.firmware_version": "113-D67301-063"}
    edge = sensor(gpu, "amdgpu", "edge", "temperature")
    vdd = sensor(gpu, "amdgpu", "vddgfx", "voltage")
    own = {"device": MI210[0], "vendor": MI210[1]}
    return [
        (c.POWER, {**gpu, "sensor": "PPT", "chip": "amdgpu", "source": "driver"}, 63.0),
        (c.POWER_LIMIT, {**gpu, "sensor": "PPT", "chip": "amdgpu", "limit": "throttled"}, 300.0),
        (c.TEMPERATURE, edge, 41.0),
        (c.TEMPERATURE_LIMIT, {**edge, "limit": "high.critical"}, 100.0),
        (c.VOLTAGE, vdd, 0.736),
        (c.FREQUENCY, {**gpu, "domain": "sclk", "state": "actual"}, 1.7e9),
        (c.THROTTLE, {**gpu, "domain": "gfx", "reason": "status"}, 0.0),
        (c.MEMORY_USED, {**gpu, "region": "vram"}, 1073741824.0),
        (c.MEMORY_LIMIT, {**gpu, "region": "vram"}, 25753026560.0),
        (c.MEMORY_UTILIZATION, {**gpu, "region": "vram"}, 0.0417),
        (c.UTILIZATION, {**gpu, "task": "general"}, 0.37),
        (c.MEMORY_BUSY, gpu, 0.05),
        (c.DEVICE_ERRORS, {**gpu, "block": "gfx", "type": "corrected"}, 2.0),
        (c.DEVICE_ERRORS, {**gpu, "block": "gfx", "type": "uncorrected"}, 0.0),
        (c.ENERGY, {**gpu, "source": "driver"}, 1234.5),
        (c.ENERGY_IDLE, own, 1000.0),
        (c.ENERGY_UNATTRIBUTED, own, 4.5),
        *((c.DEVICE_STATUS, {**gpu, "state": s}, float(s == "ok")) for s in STATES),
        (c.TELEMETRY_STALE, own, 0.0),
    ]


def npu_telemetry() -> list[tuple[c.Spec, c.Attrs, float]]:
    """An accel device: its hw.gpu.* points go out on OTLP under kubenpu.npu.* names."""
    npu = hw(NPU, "npu", "accel0")
    own = {"device": NPU[0], "vendor": NPU[1]}
    return [
        (c.MEMORY_USED, {**npu, "region": "device"}, 67108864.0),
        (c.MEMORY_LIMIT, {**npu, "region": "device"}, 1 << 30),
        (c.MEMORY_UTILIZATION, {**npu, "region": "device"}, 0.0625),
        (c.UTILIZATION, {**npu, "task": "general"}, 0.5),
        (c.FREQUENCY, {**npu, "domain": "npu", "state": "actual"}, 1.4e9),
        (c.DEVICE_BUSY, npu, 81.234567),
        (c.ENERGY, {**npu, "source": "integrated"}, 20.0),
        (c.ENERGY_IDLE, own, 19.0),
        (c.ENERGY_UNATTRIBUTED, own, 0.0),
        *((c.DEVICE_STATUS, {**npu, "state": s}, float(s == "failed")) for s in STATES),
        (c.TELEMETRY_STALE, own, 1.0),
    ]


def telemetry(m: Metrics) -> None:
    """Each device's sysfs/hwmon read, and the energy it split among pods."""
    m.set(tel.TELEMETRY, MI210[0], mi210_telemetry())
    m.set(tel.TELEMETRY, NPU[0], npu_telemetry())
    m.set(tel.SKIPS, "missing", 3)
    m.set(tel.SKIPS, "deadline", 1)
    m.put(tel.POD_ENERGY_SHARES, TRAINER, "", 230_500_000)
    m.put(tel.POD_ENERGY_SHARES, SERVER, "", 1_000_000)
    m.set(STAMPS, "telemetry", 1_750_000_012.0)


def allocations_state() -> AllocationState:
    gpu = Held("ml", "trainer-0", "worker", MI210[0], "amd.com/gpu")
    npu = Held("serving", "llm-0", "server", NPU[0], "intel.com/npu")
    return AllocationState(
        shares={gpu: 1, npu: 1},
        idle={gpu: (12.5, AGENT_START_NS + 2 * SECOND), npu: (0.0, AGENT_START_NS + 3 * SECOND)},
        idle_for={gpu: 2.5},
        unallocated={("ml", "trainer-0", "worker", NPU[0]): (6, AGENT_START_NS + 4 * SECOND)},
        unmapped={("amd.com/gpu", "no_device"): 1},
        uids={("ml", "trainer-0"): UID},  # the runtime lists trainer-0's; llm-0 it does not
    )


def allocations(m: Metrics) -> None:
    """The kubelet's PodResources allocations, their idle time and the calls outside them."""
    m.set(alloc.ALLOCATIONS, "", allocations_state())
    m.set(alloc.ERRORS, "", 1)


def uevents(m: Metrics) -> None:
    """DRM wedged and devcoredump uevents, and the pods a reset hit."""
    m.set(wedges.RESETS, (*MI210, "rebind"), 1)
    m.set(wedges.RESETS, (*MI210, "none"), 1)
    m.set(wedges.COREDUMPS, MI210, 1)
    m.set(wedges.SKIPS, "unknown_device", 1)
    m.put(gpu_jobs.RESETS[c.POD_HANGS], TRAINER, "", 1)
    m.put(gpu_jobs.RESETS[c.RESET_VICTIMS], OLD_TRAINER, "", 1)


def guard(m: Metrics) -> None:
    """The access guard: opens denied in enforce, ioctls audit would deny, an open by a pod
    cgroup not yet seen, and the policy of the last refresh."""
    batch, trainer = ("batch", "job-0", BATCH_UID), ("ml", "trainer-0", UID)
    denied = {
        (*batch, MI210[0], "open", "enforce"): (2, AGENT_START_NS + 3 * SECOND),
        (*trainer, NPU[0], "ioctl", "audit"): (5, AGENT_START_NS + 4 * SECOND),
    }
    m.set(guard_room.DENIED, "", denied)
    m.set(guard_room.UNCHECKED_FAMILY, (MI210[0], "open", "unseen"), 1)
    policy = {
        (*batch, MI210[0], "enforce", "denied"): 1,
        (*trainer, MI210[0], "audit", "allocated"): 1,
    }
    m.set(guard_room.POLICY, "", policy)


def exporters(m: Metrics) -> None:
    """The exporters' own: a failed push, a refused accept, the certificates checked at start."""
    m.set(EXPORT_FAILED, "", 1)
    m.set(EXHAUSTED, "metrics_server", 2)
    # export.start reports them from the TLS files it checks; the test serves without TLS.
    m.set(CERTIFICATES, "", {"export.prometheus.tls.cert_file": 1_780_000_000.0})


def old_trainer_gone(m: Metrics) -> None:
    """The restarted pod's first incarnation ends: still exported for series_ttl_seconds."""
    gone(m, OLD_TRAINER)


def over_the_cap(m: Metrics) -> None:
    """A device with more sensors than room, then a new pod's calls and jobs, a new timed series
    and one more unallocated user: each left out and counted (kubenpu.overflow_*)."""
    flood = hw(("0000:04:00.0", "amdgpu"), "gpu", "card2")
    sensors = [sensor(flood, "amdgpu", f"temp{i}", "temperature") for i in range(1, 6)]
    m.set(tel.TELEMETRY, "0000:04:00.0", [(c.TEMPERATURE, s, 40.0) for s in sensors])
    late = Where("ml", "late-0", "11111111-2222-4333-8444-555555555555", "worker", *MI210)
    calls(m, late, "submit", 9)
    m.put(
        gpu_jobs.JOB_TIMES, late, "gfx_0.0.0", (301, JobTimes(1, 0, durations([]), durations([])))
    )
    m.put(calls_room.DURATIONS, CTR, "submit", (Key(401, 226, 1, 1), durations([1e-3])))
    state = allocations_state()
    state.unallocated[("batch", "job-1", "step", NPU[0])] = (1, AGENT_START_NS + 5 * SECOND)
    m.set(alloc.ALLOCATIONS, "", state)


SOURCES: tuple[Callable[[Metrics], None], ...] = (
    wiring,
    kernel,
    jobs,
    attribution,
    batch_pod_gone,
    fdinfo,
    telemetry,
    allocations,
    uevents,
    guard,
    exporters,
    old_trainer_gone,
    over_the_cap,
)

# --- the render: the agent's exporters, on a fixed clock -------------------------------------

# What Prometheus 2.x sends: it gets OpenMetrics. A plain client (curl) gets text/plain 0.0.4.
OPENMETRICS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
    "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)
ACCEPT = {"payload-prometheus.txt": "text/plain", "payload-openmetrics.txt": OPENMETRICS_ACCEPT}
PUSHED = {"payload-otlp-semconv.json": "semconv", "payload-otlp-legacy.json": "legacy"}
GOLDEN = (*ACCEPT, *PUSHED)


class Wall:
    """time.time_ns, read by the store (the agent's and each pod's series start) and the pusher
    (a push's time). Neither takes a clock to inject, so the test patches time.time_ns: it moves
    one second per source, by hand, so that how often the code reads it changes nothing."""

    def __init__(self) -> None:
        self.ns = AGENT_START_NS

    def __call__(self) -> int:
        return self.ns

    def monotonic(self) -> float:
        """The store's clock for series_ttl_seconds, on the same time line."""
        return self.ns / SECOND


@contextmanager
def started(metrics: Metrics, attributes: str, otlp_port: int) -> Iterator[export.Exporters]:
    """export.start as the agent calls it, pushing to otlp_port, only when asked (push())."""
    otlp = {"enabled": True, "protocol": "http/protobuf", "attributes": attributes}
    otlp |= {"endpoint": f"http://127.0.0.1:{otlp_port}", "interval_seconds": 86400}
    prometheus = {"host": "127.0.0.1", "port": free_port()}
    cfg = config.Config(node_name=NODE, export={"prometheus": prometheus, "otlp": otlp})
    exporters = export.start(cfg, metrics, StubHealth())
    try:
        yield exporters
    finally:
        exporters.shutdown()


def scraped(port: int, accept: str) -> str:
    """/metrics, with prometheus_client's process_* values (this pytest's memory and CPU) as 0,
    so that the file stays a scrape parsers take, and the OTel SDK's version in target_info as
    <sdk>: neither is the agent's."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers={"Accept": accept})
    with urllib.request.urlopen(request, timeout=10) as reply:
        text = reply.read().decode()
    text = re.sub(r"^(process_\w+) \S+$", r"\1 0", text, flags=re.MULTILINE)
    return re.sub(r'telemetry_sdk_version="[^"]*"', 'telemetry_sdk_version="<sdk>"', text)


def received(rx: OtlpHttpReceiver, since: int) -> str:
    """The requests pushed since the `since`th, as OTLP/JSON (protobuf's JSON mapping), the OTel
    SDK's version in the resource as <sdk>."""
    requests = [json_format.MessageToDict(r) for r in rx.requests[since:]]
    for request in requests:
        for rm in request["resourceMetrics"]:
            for kv in rm["resource"]["attributes"]:
                if kv["key"] == "telemetry.sdk.version":
                    kv["value"]["stringValue"] = "<sdk>"
    return json.dumps(requests, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def render() -> dict[str, str]:
    """Every golden file's content: the sources report, then each exporter renders once."""
    with pytest.MonkeyPatch.context() as mp, OtlpHttpReceiver() as rx, ExitStack() as stack:
        wall = Wall()
        mp.setattr(time, "time_ns", wall)
        for var in ("OTEL_RESOURCE_ATTRIBUTES", "OTEL_SERVICE_NAME"):
            mp.delenv(var, raising=False)
        metrics = table(SERIES_TTL, MAX_SERIES, wall.monotonic)
        agents = {a: stack.enter_context(started(metrics, a, rx.port)) for a in PUSHED.values()}
        for source in SOURCES:
            wall.ns += SECOND
            source(metrics)
        wall.ns += SECOND
        server = agents["semconv"].server
        assert server is not None
        out = {name: scraped(server.port, accept) for name, accept in ACCEPT.items()}
        for name, attributes in PUSHED.items():
            pusher, since = agents[attributes].pusher, len(rx.requests)
            assert pusher is not None and pusher.push()
            out[name] = received(rx, since)
        return out


@pytest.fixture(scope="module")
def payloads() -> dict[str, str]:
    return render()


@pytest.mark.parametrize("name", GOLDEN)
def test_the_payload_is_as_reviewed(payloads: dict[str, str], name: str) -> None:
    golden = TESTDATA / name
    if os.environ.get("KUBENPU_REGEN"):
        golden.write_bytes(payloads[name].encode())
        pytest.skip(f"rewrote {golden.name}")
    assert payloads[name] == golden.read_bytes().decode()


def test_every_family_of_the_catalogue_has_points(payloads: dict[str, str]) -> None:
    """The sources above cover the catalogue: a family without points would be a golden HELP
    line alone, its labels unchecked."""
    text = payloads["payload-prometheus.txt"]
    empty = [
        s.prometheus_name
        for s in c.SPECS
        if not re.search(rf"^{s.prometheus_name}(_bucket|_count|_sum)?[{{ ]", text, re.MULTILINE)
    ]
    assert not empty
