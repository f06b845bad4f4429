"""kubenpu.metrics: exact counts, series lifecycle, the cardinality cap, bounded memory."""

from __future__ import annotations

import math
import threading
from collections import Counter
from pathlib import Path

import pytest
from fakes import Clock, FakeResolver
from helpers import VGEM_INFO, VGEM_ROW, calls, ioctl_key, memory_growth, values

from kubenpu import config, export
from kubenpu.discovery import Device, Node
from kubenpu.export import otlp
from kubenpu.export.prometheus import PrometheusCollector
from kubenpu.kernel import abi
from kubenpu.kernel.records import Durations, Key
from kubenpu.metrics.catalogue import (
    ALLOCATED,
    ALLOCATED_IDLE,
    CRI_BOUNDS,
    DEVICE_STATUS,
    DROP_REASONS,
    DROPPED,
    IOCTL,
    IOCTL_DURATION,
    IOCTL_ERRORS,
    IOCTL_SERIES,
    K8S_ATTRIBUTES,
    OVERFLOW_ATTRS,
    OVERFLOW_CALLS,
    OVERFLOW_SERIES,
    POD_HANGS,
    POD_LABELS,
    POWER,
    SPECS,
    TELEMETRY_STALE,
    UNATTRIBUTED,
    UNATTRIBUTED_REASONS,
    Spec,
)
from kubenpu.metrics.inputs import AllocationState, Held, Where
from kubenpu.metrics.own import CRI, DEVICES, INDEX_REBUILT
from kubenpu.resolve import Attribution
from kubenpu.sources.allocations import ALLOCATIONS
from kubenpu.sources.calls.attribution import DROPS, DURATIONS, EVENTS, UNNAMED, Attributor
from kubenpu.sources.calls.events import Batch
from kubenpu.sources.jobs import RESETS
from kubenpu.sources.registry import table
from kubenpu.sources.telemetry import TELEMETRY


def test_counts_are_exact() -> None:
    m = table(300, 100)
    calls(m, "ns", "p", "c", 3)
    calls(m, "ns", "p", "c", 4)
    calls(m, "ns", "p", "c", 1, kind="wait")
    calls(m, "", "", "", 2)
    m.set(UNNAMED, "not_pod", 2)
    m.set(DROPS, "queue_full", 7)
    m.set(EVENTS, "", 10)
    m.set(INDEX_REBUILT, "", 1)
    m.set(DEVICES, "node-a", [VGEM_ROW])
    assert values(m, IOCTL) == {
        ioctl_key("ns", "p", "c"): 7,
        ioctl_key("ns", "p", "c", "wait"): 1,
        ioctl_key("", "", ""): 2,
    }
    snap = {s.name: {frozenset(p.attrs.items()): p.value for p in pts} for s, pts in m.collect()}
    assert snap["kubenpu.unattributed_calls"][frozenset({("reason", "not_pod")})] == 2
    assert snap["kubenpu.unattributed_calls"][frozenset({("reason", "cri_error")})] == 0
    assert snap["kubenpu.events.dropped"][frozenset({("reason", "queue_full")})] == 7
    assert snap["kubenpu.events.received"] == {frozenset(): 10}
    assert snap["kubenpu.cgroup_index.rebuilds"] == {frozenset(): 1}
    assert snap["kubenpu.device.info"] == {frozenset(VGEM_INFO.items()): 1}


def test_cri_histogram_and_errors() -> None:
    m = table(300, 100)
    for seconds, ok in ((0.0005, True), (0.03, True), (30.0, False)):
        m.set(CRI, "", (seconds, ok))
    snap = {s.name: pts for s, pts in m.collect()}
    h = snap["kubenpu.cri.request.duration"][0].value
    assert (h.count, h.low, h.high, sum(h.buckets)) == (3, 0.0005, 30.0, 3)
    assert (h.buckets[0], h.buckets[5], h.buckets[-1]) == (1, 1, 1)  # ≤1ms, ≤50ms, +Inf
    assert snap["kubenpu.cri.errors"][0].value == 1


def test_a_request_exactly_on_a_bound_is_in_that_bucket() -> None:
    """`le` is at most: a request of exactly a bound's seconds is in the bucket it ends, one
    a hair longer in the next; exactly the last bound is not +Inf."""
    m = table(300, 100)
    for seconds in (CRI_BOUNDS[0], CRI_BOUNDS[4], math.nextafter(CRI_BOUNDS[4], 1), CRI_BOUNDS[-1]):
        m.set(CRI, "", (seconds, True))
    [point] = {s.name: pts for s, pts in m.collect()}["kubenpu.cri.request.duration"]
    buckets = point.value.buckets
    assert {i: n for i, n in enumerate(buckets) if n} == {0: 1, 4: 1, 5: 1, len(CRI_BOUNDS) - 1: 1}


def test_pod_series_retire_after_ttl_when_all_containers_are_gone() -> None:
    clock = Clock()
    m = table(60, 100, clock)
    calls(m, "ns", "p", "a")
    calls(m, "ns", "p", "b")
    m.gone(Where("ns", "p", "", "a", "", ""))
    clock.now += 3600
    assert set(values(m, IOCTL)) == {ioctl_key("ns", "p", "a"), ioctl_key("ns", "p", "b")}
    m.gone(Where("ns", "p", "", "b", "", ""))
    clock.now += 59
    assert len(values(m, IOCTL)) == 2  # still within the TTL: the last counts get exported
    clock.now += 1
    assert values(m, IOCTL) == {}
    assert (values(m, IOCTL_SERIES), m.pods_held()) == ({}, 0)


def test_two_pods_of_one_name_one_after_the_other_are_two_series_retiring_apart() -> None:
    """A StatefulSet's pod-0 recreated: same namespace, pod and container names, a new uid.
    The old pod's counts stay its own (and retire after the TTL); the new pod starts at 0."""
    clock = Clock()
    m = table(60, 100, clock)
    calls(m, "ns", "p", "c", 2, uid="uid-old")
    m.gone(Where("ns", "p", "uid-old", "c", "", ""))
    calls(m, "ns", "p", "c", 3, uid="uid-new")
    assert values(m, IOCTL) == {
        ioctl_key("ns", "p", "c", uid="uid-old"): 2,
        ioctl_key("ns", "p", "c", uid="uid-new"): 3,
    }
    clock.now += 60
    assert values(m, IOCTL) == {ioctl_key("ns", "p", "c", uid="uid-new"): 3}
    assert m.pods_held() == 1


def test_containers_without_pod_labels_retire_each_on_its_own() -> None:
    clock = Clock()
    m = table(60, 100, clock)
    calls(m, "", "", "ctr-a", 2)
    calls(m, "", "", "ctr-b", 3)
    calls(m, "", "", "", 4)  # unattributed: no container to retire
    m.gone(Where("", "", "", "ctr-a", "", ""))
    m.gone(Where("", "", "", "", "", ""))
    clock.now += 60
    assert values(m, IOCTL) == {ioctl_key("", "", "ctr-b"): 3, ioctl_key("", "", ""): 4}
    assert values(m, IOCTL_SERIES) == {(): 2}


def test_a_call_revives_a_gone_container() -> None:
    clock = Clock()
    m = table(60, 100, clock)
    calls(m, "ns", "p", "a", 5)
    m.gone(Where("ns", "p", "", "a", "", ""))
    clock.now += 30
    calls(m, "ns", "p", "a", 1)  # a restarted container with the same name
    clock.now += 3600
    assert values(m, IOCTL) == {ioctl_key("ns", "p", "a"): 6}
    m.gone(Where("ns", "p", "", "unknown", "", ""))  # never seen: ignored, allocates nothing
    assert m.pods_held() == 1


def test_cardinality_cap_folds_new_series_into_overflow() -> None:
    m = table(60, 3)
    for i in range(5):
        calls(m, "ns", f"p{i}", "c", 10)
    calls(m, "ns", "p0", "c", 1)  # an existing series keeps counting
    got = values(m, IOCTL)
    assert got == {
        ioctl_key("ns", "p0", "c"): 11,
        ioctl_key("ns", "p1", "c"): 10,
        ioctl_key("ns", "p2", "c"): 10,
        tuple(OVERFLOW_ATTRS.values()): 20,
    }
    assert values(m, OVERFLOW_CALLS) == {(): 20}
    assert sum(got.values()) == 51  # nothing lost


def _allocations(pods: int) -> AllocationState:
    helds = [Held("ns", f"p{i}", "c", "0000:03:00.0", "gpu.intel.com/i915") for i in range(pods)]
    return AllocationState(
        shares=dict.fromkeys(helds, 1),
        idle={h: (5.0, 1) for h in helds},
        unallocated={("ns", "q", "c", "0000:03:00.0"): (3, 1)},
    )


def test_allocation_and_telemetry_series_count_against_the_cap() -> None:
    """50,001 pods' allocations were ~150,000 series past metrics.max_series."""
    m = table(60, 8)
    calls(m, "ns", "p0", "c", 10)  # one ioctl series: 7 left
    power = [(POWER, {"sensor": f"s{i}"}, 1.0) for i in range(4)]
    m.set(TELEMETRY, "0000:03:00.0", power[:3])  # 4 left
    m.set(ALLOCATIONS, "", _allocations(5))  # 2 series a Held: 2 Helds fit
    assert {k[1] for k in values(m, ALLOCATED)} == {"p0", "p1"}
    assert {k[1] for k in values(m, ALLOCATED_IDLE)} == {"p0", "p1"}
    calls(m, "ns", "p9", "c", 4)  # the cap is full: folded into overflow
    assert values(m, OVERFLOW_CALLS) == {(): 4}
    assert values(m, OVERFLOW_SERIES) == {("allocations",): 3 * 2 + 1}  # and the unallocated
    m.set(TELEMETRY, "0000:03:00.0", power)  # the device's own room is used again, and 1 more
    assert len(values(m, POWER)) == 3
    assert values(m, OVERFLOW_SERIES)[("telemetry",)] == 1
    m.set(ALLOCATIONS, "", AllocationState())  # released: room for new pods' calls
    calls(m, "ns", "p9", "c", 1)
    assert values(m, IOCTL)[ioctl_key("ns", "p9", "c")] == 1


def test_a_telemetry_read_keeps_the_devices_state_first_then_its_points_in_read_order() -> None:
    """Short of room, a device's read keeps its state (hw.status, the stale flag) before its
    other points, which it keeps in read order; with no room at all, the state alone, past the
    cap (docs/metrics.md, The series cap). It once kept the first points read, which left the
    state, listed last, out."""
    m = table(60, 8)
    calls(m, "ns", "p0", "c", 10)  # one ioctl series: 7 left
    hw = {"device": "0000:03:00.0", "vendor": "vgem"}
    power = [(POWER, {**hw, "sensor": f"s{i}"}, 1.0) for i in range(4)]
    state = [(DEVICE_STATUS, {**hw, "state": s}, float(s == "ok")) for s in ("ok", "failed")]
    state.append((TELEMETRY_STALE, hw, 0.0))
    m.set(TELEMETRY, "0000:03:00.0", [*power, *state])  # 7 points: all fit
    assert values(m, OVERFLOW_SERIES) == {}
    m.set(TELEMETRY, "0000:03:00.0", [*power, (POWER, {**hw, "sensor": "s4"}, 1.0), *state])
    assert [k[-1] for k in values(m, POWER)] == ["s0", "s1", "s2", "s3"]  # s4: no room left
    assert values(m, DEVICE_STATUS) == {(*hw.values(), "ok"): 1.0}
    assert len(dict(m.collect())[TELEMETRY_STALE]) == 1
    assert values(m, OVERFLOW_SERIES) == {("telemetry",): 1}
    full = table(60, 2)
    calls(full, "ns", "p0", "c")
    calls(full, "ns", "p1", "c")  # the cap full of calls: no room
    full.set(TELEMETRY, "0000:03:00.0", [*power, *state])
    assert (values(full, POWER), values(full, DEVICE_STATUS)) == ({}, {(*hw.values(), "ok"): 1.0})
    assert len(dict(full.collect())[TELEMETRY_STALE]) == 1
    assert values(full, OVERFLOW_SERIES) == {("telemetry",): 4}
    assert values(full, IOCTL_SERIES) == {(): 2}  # the pods' call series stay


def test_expired_series_free_the_cap_at_once_not_at_the_next_collect() -> None:
    clock = Clock()
    m = table(60, 2, clock)
    calls(m, "ns", "old", "a")
    calls(m, "ns", "old", "a", kind="wait")
    m.gone(Where("ns", "old", "", "a", "", ""))
    clock.now += 60  # expired; no collect() since
    calls(m, "ns", "new", "b", 4)
    assert values(m, IOCTL_SERIES) == {(): 1}
    assert values(m, IOCTL) == {ioctl_key("ns", "new", "b"): 4}
    assert values(m, OVERFLOW_CALLS) == {}


def test_a_dropped_pods_histograms_give_their_room_back() -> None:
    """A pod with one call series and its durations histogram (2 of the cap's 4) is dropped
    after the TTL: all 4 are free again, for 4 new pods' call series, none folded."""
    clock = Clock()
    m = table(60, 4, clock)
    calls(m, "ns", "old", "a")
    where = Where("ns", "old", "", "a", "0000:03:00.0", "vgem")
    assert m.put(DURATIONS, where, "submit", ("cgroup 7", Durations(5, (1,), ())))
    m.gone(Where("ns", "old", "", "a", "", ""))
    clock.now += 60
    for i in range(4):
        calls(m, "ns", f"new{i}", "b")
    assert len(values(m, IOCTL)) == 4
    assert values(m, OVERFLOW_CALLS) == {}


def test_concurrent_updates_and_collections_are_exact() -> None:
    m = table(60, 10_000)
    stop = threading.Event()

    def collect() -> None:
        while not stop.is_set():
            m.collect()

    reader = threading.Thread(target=collect)
    reader.start()
    writers = [
        threading.Thread(
            target=lambda w=w: [calls(m, "ns", f"p{i % 50}", f"c{w}") for i in range(20_000)]
        )
        for w in range(4)
    ]
    for t in writers:
        t.start()
    for t in writers:
        t.join()
    stop.set()
    reader.join()
    assert sum(values(m, IOCTL).values()) == 80_000


def test_churn_of_1000_containers_returns_memory_to_baseline() -> None:
    """1000 containers (500 pods x 2) come and go; their series are retired after the TTL and the
    state, rendered through both exporters each round, does not grow with the pods that left."""
    clock = Clock()
    cfg = config.Config(node_name="n")
    m = table(60, 10_000, clock)
    resource = export.build_resource(cfg)
    prom = PrometheusCollector(m, resource)
    calls(m, "", "", "", 1)  # the never-retired host series

    def round_(wave: int) -> None:
        for p in range(50):
            for c in ("app", "sidecar"):
                calls(m, "ns", f"pod-{wave}-{p}", c, 3)
        list(prom.collect())
        otlp.metrics_data(m.collect(), resource)
        for p in range(50):
            for c in ("app", "sidecar"):
                m.gone(Where("ns", f"pod-{wave}-{p}", "", c, "", ""))
        clock.now += 61
        list(prom.collect())
        otlp.metrics_data(m.collect(), resource)

    after, peak = memory_growth(round_, 9)  # 9 more waves: 1000 containers in all
    assert (values(m, IOCTL_SERIES), m.pods_held()) == ({(): 1}, 1)
    assert values(m, IOCTL) == {ioctl_key("", "", ""): 1}
    assert peak > 20_000  # the measurement does see a wave's state...
    # ...and what stays is the dict tables sized for the peak of live pods (a wave), not for
    # the pods that came and went: flat from the second wave on.
    assert after[-1] < 8_000
    assert after[-1] - after[1] <= 0


def _doc_rows() -> dict[str, list[str]]:
    """docs/metrics.md table rows by Prometheus name: [name, OTel name (unit), type, labels,
    meaning]."""
    text = (Path(__file__).parents[1] / "docs" / "metrics.md").read_text()
    rows = [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in text.splitlines()
        if line.startswith("| `")
    ]
    return {row[0].strip(" `"): row for row in rows}


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_help_texts_and_the_metrics_doc_agree(spec: Spec) -> None:
    row = _doc_rows()[spec.prometheus_name]
    assert row[1].startswith(f"`{spec.name}`")
    assert f"(`{spec.unit}`)" in row[1] if spec.unit else "(" not in row[1]
    assert row[-1].startswith(spec.description)
    assert row[3] == ", ".join(f"`{label}`" for label in spec.labels)


def test_every_reason_is_in_its_help_text() -> None:
    for spec, reasons in ((DROPPED, DROP_REASONS), (UNATTRIBUTED, UNATTRIBUTED_REASONS)):
        assert [r for r in reasons if f"{r} (" not in spec.description] == []


def test_the_pod_inputs_name_the_catalogues_pod_labels_in_order() -> None:
    """Where's fields are the series' labels (the table builds attrs from Where._asdict())."""
    assert Where._fields[: len(POD_LABELS)] == POD_LABELS
    assert set(POD_LABELS) == K8S_ATTRIBUTES.keys()


VGEM = Device("platform:vgem", None, None, None, (Node("/dev/dri/card0", "card0", 226, 0),), "vgem")


def _timed(calls: int) -> Durations:
    """One cgroup's cumulative durations: `calls` calls of at most 2^-20 s, one of them ENOMEM."""
    slots = (calls,) + (0,) * (abi.DURATION_SLOTS - 1)
    errors = tuple(int(e == "ENOMEM") for e in abi.ERRORS)
    return Durations(calls * 1000, slots, errors)


def test_dead_non_pod_cgroups_fold_into_the_unattributed_series_and_free_their_values() -> None:
    """The unattributed calls' series never retire, and each dead non-pod cgroup's durations
    were kept in it, per cgroup, for good (2,000 after reaping 2,000). A reaped cgroup's
    durations are folded into its series' totals: the histogram and errors keep every call,
    and waves of 1,000 reaped cgroups leave nothing of theirs behind."""
    resolver, metrics = FakeResolver(), table(60, 10_000)
    attributor = Attributor([VGEM], resolver, metrics)
    for cgroup in range(4_000):
        resolver.answers[cgroup] = Attribution(reason="not_pod")
        resolver.dead.add(cgroup)  # read only at the reap, after the wave's calls

    def wave(first: int) -> None:
        cgroups = range(first, first + 1_000)
        attributor.flush(Batch(counts=Counter({Key(c, 226, 0, 1): 1 for c in cgroups})))
        attributor.timed({Key(c, 226, 0, 1): _timed(3) for c in cgroups})
        attributor.forget(attributor.dead_cgroups())
        resolver.forgotten.clear()  # the fake's record, not the agent's memory

    after, _ = memory_growth(lambda n: wave(n * 1_000), 3)
    [hist] = values(metrics, IOCTL_DURATION).values()
    assert hist.count == 3 * 4_000
    errors = ("", "", "", VGEM.id, "vgem", "submit", "ENOMEM")
    assert values(metrics, IOCTL_ERRORS) == {errors: 4_000}
    # What stays is the dict tables sized for a wave; each cgroup's durations kept was ~500 KB
    # a wave.
    assert after[2] - after[0] < 10_000


def test_a_row_only_a_reset_made_retires_and_counts_under_the_cap() -> None:
    """A reset that names a pod with no other series made a row outside the cap that never
    retired. It takes room as the pod's other series do, and retires after the TTL unless the
    pod shows life; the unattributed unit, which never retires, keeps its row."""
    clock = Clock()
    m = table(60, 2, clock)
    hangs = RESETS[POD_HANGS]
    gone_pod = Where("ns", "gone", "u-1", "c", "0000:03:00.0", "vgem")
    assert m.put(hangs, gone_pod, "", 1)
    assert m.put(hangs, Where("", "", "", "", "0000:03:00.0", "vgem"), "", 1)
    assert not m.put(hangs, Where("ns", "third", "u-3", "c", "0000:03:00.0", "vgem"), "", 1)
    assert values(m, OVERFLOW_SERIES) == {("resets",): 1}
    clock.now += 59
    assert len(values(m, POD_HANGS)) == 2  # exported for the TTL
    clock.now += 1
    assert set(values(m, POD_HANGS)) == {("", "", "", "0000:03:00.0", "vgem")}
    assert m.pods_held() == 1
    assert m.put(hangs, Where("ns", "third", "u-3", "c", "0000:03:00.0", "vgem"), "", 1)
