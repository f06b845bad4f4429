"""kubenpu/export/otlp.py's points as the OTel SDK's OTLP encoder puts them on the wire: every
field of every kind of point, the NPU split and the legacy names (test_export pushes them to
real receivers; test_semconv checks the telemetry against the conventions)."""

from __future__ import annotations

import pytest
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.sdk.resources import Resource
from otlp_receiver import attrs

from kubenpu import __version__
from kubenpu.export import otlp
from kubenpu.kernel import abi
from kubenpu.metrics.catalogue import CRI_BOUNDS, Spec
from kubenpu.metrics.points import ExpHist, Hist, Point

RESOURCE = Resource({"service.name": "kubenpu", "k8s.node.name": "n1"})
T0 = 1_700_000_000_000_000_000
POD = {"namespace": "ns", "pod": "p", "pod_uid": "u-1", "container": "c"}


def wire(snapshot: list[tuple[Spec, list[Point]]]) -> dict:
    """The encoded request's metrics by name, and its scope."""
    request = encode_metrics(otlp.metrics_data(snapshot, RESOURCE))
    [rm] = request.resource_metrics
    [sm] = rm.scope_metrics
    metrics = {m.name: m for m in sm.metrics}
    return {"scope": (sm.scope.name, sm.scope.version, sm.schema_url, rm.schema_url), **metrics}


def spec(name: str, kind: str, **more: object) -> Spec:
    return Spec(name, kind, "s", f"what {name} is", **more)  # type: ignore[arg-type]


def test_each_number_kind_keeps_its_instrument_times_and_type() -> None:
    counter, updown, gauge = spec("c", "counter"), spec("u", "updowncounter"), spec("g", "gauge")
    size = spec("m", "updowncounter", integer=True)
    got = wire([
        (counter, [Point(POD, 5, T0)]),
        (updown, [Point(POD, 7.5, T0)]),
        (gauge, [Point(POD, 0.25, T0)]),
        (size, [Point(POD, 3.6, T0)]),
        (spec("empty", "gauge"), []),  # no points: no metric
    ])  # fmt: skip
    assert got["scope"] == ("kubenpu", __version__, "", "")
    assert set(got) == {"scope", "c", "u", "g", "m"}
    c, u, g, m = got["c"], got["u"], got["g"], got["m"]
    assert (c.description, c.unit) == ("what c is", "s")
    assert (c.sum.is_monotonic, c.sum.aggregation_temporality) == (True, 2)
    assert (u.sum.is_monotonic, u.sum.aggregation_temporality) == (False, 2)
    assert g.WhichOneof("data") == "gauge"
    [cp], [up], [gp], [mp] = (x.data_points for x in (c.sum, u.sum, g.gauge, m.sum))
    assert (cp.as_int, up.as_double, gp.as_double, mp.as_int) == (5, 7.5, 0.25, 4)
    for p in (cp, up):
        assert p.start_time_unix_nano == T0 and p.time_unix_nano > T0
    assert gp.time_unix_nano > T0  # a gauge has no start
    assert {kv.key for kv in cp.attributes} == set(POD)


def test_a_cri_histogram_point_has_its_buckets_bounds_and_extremes() -> None:
    cri = spec("cri", "histogram")
    buckets = (1, 0, 2) + (0,) * (len(CRI_BOUNDS) - 2)
    seen = Hist(3, 0.7, buckets, 0.001, 0.5)
    got = wire(
        [(cri, [Point({}, seen, T0), Point({"x": "none"}, Hist(0, 0.0, buckets, 9, 9), T0)])]
    )
    h = got["cri"].histogram
    assert h.aggregation_temporality == 2
    full, empty = h.data_points
    assert (attrs(full.attributes), attrs(empty.attributes)) == ({}, {"x": "none"})
    assert (full.count, full.sum, full.min, full.max) == (3, 0.7, 0.001, 0.5)
    assert list(full.bucket_counts) == list(buckets)
    assert list(full.explicit_bounds) == list(CRI_BOUNDS)
    assert full.start_time_unix_nano == T0 and full.time_unix_nano > T0
    assert (empty.count, empty.min, empty.max) == (0, 0.0, 0.0)  # no calls: no extremes


def slots(held: dict[int, int]) -> tuple[int, ...]:
    return tuple(held.get(i, 0) for i in range(abi.DURATION_SLOTS))


def test_an_exponential_point_is_the_kernels_buckets_with_their_bounds_as_extremes() -> None:
    durations = spec("d", "histogram")
    points = [
        Point({"k": "two"}, ExpHist(slots({5: 1, 10: 3}), 0.25), T0),
        Point({"k": "zero"}, ExpHist(slots({0: 2}), 1e-7), T0),
        Point({"k": "lowest"}, ExpHist(slots({1: 1}), 1e-6), T0),
        Point({"k": "none"}, ExpHist(slots({}), 0.0), T0),
    ]
    got = wire([(durations, points)])
    e = got["d"].exponential_histogram
    assert e.aggregation_temporality == 2
    two, zero, lowest, none = e.data_points
    assert (two.count, two.sum, two.scale, two.zero_count, two.flags) == (4, 0.25, 2, 0, 0)
    assert two.positive.offset == abi.FIRST_INDEX
    assert list(two.positive.bucket_counts) == list(slots({5: 1, 10: 3})[1:])
    assert (two.negative.offset, list(two.negative.bucket_counts)) == (0, [])
    assert two.start_time_unix_nano == T0 and two.time_unix_nano > T0
    # min: the lower bound of the lowest bucket held; max: the upper bound of the highest.
    assert (two.min, two.max) == (
        2 ** ((4 + abi.FIRST_INDEX) / 4),
        2 ** ((10 + abi.FIRST_INDEX) / 4),
    )
    assert (zero.zero_count, zero.min, zero.max) == (2, 0.0, 2 ** ((1 + abi.FIRST_INDEX) / 4))
    assert (lowest.min, lowest.max) == (
        2 ** (abi.FIRST_INDEX / 4),
        2 ** ((1 + abi.FIRST_INDEX) / 4),
    )
    assert (none.count, none.min, none.max) == (0, 0.0, 0.0)


def test_npu_points_of_a_gpu_metric_go_under_its_npu_name_and_others_stay() -> None:
    memory = Spec("hw.gpu.memory.usage", "updowncounter", "By", "d", npu="kubenpu.npu.memory.usage")
    plain = Spec("kubenpu.other", "gauge", "1", "d")
    gpu, npu = Point({"hw.type": "gpu", "hw.id": "a"}, 1, T0), Point({"hw.type": "npu"}, 2, T0)
    named = otlp.otlp_names([(memory, [gpu, npu]), (plain, [npu])], "semconv")
    assert [(s.name, s.npu, [p.value for p in ps]) for s, ps in named] == [
        ("hw.gpu.memory.usage", "kubenpu.npu.memory.usage", [1]),
        ("kubenpu.npu.memory.usage", "", [2]),
        ("kubenpu.other", "", [2]),  # a metric without an NPU name keeps every point
    ]
    assert named[1][0].unit == "By" and named[1][0].kind == "updowncounter"
    only_gpu = otlp.otlp_names([(memory, [gpu])], "semconv")
    assert [(s.name, len(ps)) for s, ps in only_gpu] == [("hw.gpu.memory.usage", 1)]


def test_semconv_renames_the_pod_labels_and_legacy_sums_same_named_pods() -> None:
    counter = spec("calls", "counter")
    first = Point({**POD, "pod_uid": "u-1"}, 5, T0 + 10)
    second = Point({**POD, "pod_uid": "u-2"}, 7, T0)
    other = Point({**POD, "pod": "q", "pod_uid": "u-3"}, 1, T0 + 5)
    [(_, semconv)] = otlp.otlp_names([(counter, [first, second])], "semconv")
    assert sorted(p.attrs["k8s.pod.uid"] for p in semconv) == ["u-1", "u-2"]
    assert set(semconv[0].attrs) == {
        "k8s.namespace.name", "k8s.pod.name", "k8s.pod.uid", "k8s.container.name"
    }  # fmt: skip
    [(_, legacy)] = otlp.otlp_names([(counter, [first, second, other])], "legacy")
    by_pod = {p.attrs["pod"]: p for p in legacy}
    assert by_pod["p"] == Point({"namespace": "ns", "pod": "p", "container": "c"}, 12, T0)
    assert by_pod["q"].value == 1 and by_pod["q"].start_ns == T0 + 5
    cri = spec("cri", "histogram")
    h = Hist(1, 0.1, (1,) + (0,) * len(CRI_BOUNDS), 0.1, 0.1)
    [(_, hists)] = otlp.otlp_names([(cri, [Point({}, h, T0), Point({}, h, T0 + 1)])], "legacy")
    assert hists == [Point({}, h, T0 + 1)]  # a histogram is not summed: the later one stands


@pytest.mark.parametrize("earlier_first", [True, False])
def test_legacy_sum_starts_at_the_earlier_pod_in_either_order(earlier_first: bool) -> None:
    """Whichever of a recreated pod's two series comes first, the sum starts at the earlier
    start: neither the first's nor the last's start stands for both."""
    counter = spec("calls", "counter")
    old, new = Point({**POD, "pod_uid": "u-1"}, 5, T0), Point({**POD, "pod_uid": "u-2"}, 7, T0 + 9)
    points = [old, new] if earlier_first else [new, old]
    [(_, [summed])] = otlp.otlp_names([(counter, points)], "legacy")
    assert (summed.value, summed.start_ns) == (12, T0)


def uniform(kind: str, n: int) -> list[tuple[Spec, list[Point]]]:
    """n points of one spec, each with a pod's labels: numbers, CRI histograms or the kernel's
    exponential buckets (each bucket holding 2^40 calls, the most its varint can cost)."""
    values = {
        "counter": lambda i: i,
        "histogram": lambda i: Hist(i, 0.5, (i,) * (len(CRI_BOUNDS) + 1), 0.001, 0.5),
        "exponential": lambda i: ExpHist((2**40,) * abi.DURATION_SLOTS, 0.5),
    }[kind]
    s = spec(f"kubenpu.{kind}", "counter" if kind == "counter" else "histogram")
    return [(s, [Point({**POD, "pod": f"p{i}"}, values(i), T0) for i in range(n)])]


@pytest.mark.parametrize("kind", ["counter", "histogram", "exponential"])
@pytest.mark.parametrize("max_bytes", [4096, 65536])
def test_batches_fit_the_request_size_and_are_more_than_half_full(kind, max_bytes) -> None:
    """Each request encodes to at most max_bytes, and each but the last to more than half of
    it: the sizes are bounded by each kind's own layout (a histogram point is fifteen times a
    number's), not by the largest, which would send many more requests."""
    snapshot = uniform(kind, 2000)
    sizes = [
        encode_metrics(otlp.metrics_data(batch, RESOURCE)).ByteSize()
        for batch in otlp.batches(snapshot, RESOURCE, max_bytes)
    ]
    assert len(sizes) > 1 and max(sizes) <= max_bytes
    assert min(sizes[:-1]) > max_bytes / 2, sizes


def test_a_large_resource_counts_in_every_requests_size() -> None:
    """Every request carries the resource: five names at Kubernetes' longest (253 bytes) weigh
    a third of a 4 KiB request, so a bound that took them off (mutmut's `batches_4`) sends
    requests over the size. (One that left them out stays within the bound's own margin.)"""
    keys = ("k8s.node.name", "host.name", "k8s.cluster.name", "k8s.pod.name", "service.instance.id")
    resource = Resource({"service.name": "kubenpu"} | {key: key[0] * 253 for key in keys})
    sizes = [
        encode_metrics(otlp.metrics_data(batch, resource)).ByteSize()
        for batch in otlp.batches(uniform("counter", 2000), resource, 4096)
    ]
    assert len(sizes) > 1 and max(sizes) <= 4096, max(sizes)


def test_many_metrics_of_one_bare_point_each_fit_the_request_size() -> None:
    """Where the bound is tightest: a metric per point and no attributes, so each metric's name,
    description and unit weigh most of a request."""
    snapshot = [
        (
            Spec(f"kubenpu.a.rather.long.metric.name.{i:03}", "gauge", "By", f"what {i} is"),
            [Point({}, 1.5, T0)],
        )
        for i in range(300)
    ]
    for max_bytes in (1024, 4096):
        sizes = [
            encode_metrics(otlp.metrics_data(batch, RESOURCE)).ByteSize()
            for batch in otlp.batches(snapshot, RESOURCE, max_bytes)
        ]
        assert len(sizes) > 1 and max(sizes) <= max_bytes, (max_bytes, max(sizes))
