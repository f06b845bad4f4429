"""/metrics encoded family by family with a cache (kubenpu.export.prometheus.MetricsApp): the
bytes must be prometheus_client's own for the whole registry, in both formats and gzipped, after
any sequence of changes; and an unchanged family is not encoded again."""

from __future__ import annotations

import gzip
from typing import Any
from unittest import mock

import pytest
from fakes import Clock
from helpers import calls
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from kubenpu import config, export
from kubenpu.export import prometheus
from kubenpu.export.prometheus import MetricsApp
from kubenpu.kernel import abi
from kubenpu.kernel.records import Durations
from kubenpu.metrics.catalogue import COUNTER_SOURCES
from kubenpu.metrics.inputs import Where
from kubenpu.metrics.own import CRI, STAMPS
from kubenpu.metrics.series import Series
from kubenpu.sources.calls.attribution import DROPS, DURATIONS
from kubenpu.sources.calls.events import Key
from kubenpu.sources.registry import table

TEXT = "text/plain"
OPENMETRICS = "application/openmetrics-text; version=1.0.0"
PROMETHEUS_ACCEPT = (  # what Prometheus 3 sends
    "application/openmetrics-text;version=1.0.0;escaping=underscores,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)
ACCEPTS = (TEXT, OPENMETRICS, PROMETHEUS_ACCEPT, "")

# Label values as pods and containers may name them, and what the formats must escape.
names = st.sampled_from(["a", "b", 'q"uote', "back\\slash", "new\nline", "ünï", ""])
ops = st.one_of(
    st.tuples(st.just("calls"), names, names, names, st.sampled_from(["submit", "alloc"]),
              st.integers(1, 2**70)),
    st.tuples(st.just("timed"), names, names, st.integers(0, abi.DURATION_SLOTS - 1),
              st.integers(1, 10**12)),
    st.tuples(st.just("gone"), names, names, names),
    st.tuples(st.just("tick"), st.floats(0, 120)),
    st.tuples(st.just("read"), st.sampled_from(COUNTER_SOURCES),
              st.floats(0, 2e9, allow_nan=False)),
    st.tuples(st.just("dropped"), st.sampled_from(["ringbuf_full", "device_unknown"]),
              st.integers(1, 100)),
)  # fmt: skip


def apply(m: Series, clock: Clock, op: tuple) -> None:
    match op:
        case ("calls", ns, pod, c, kind, n):
            calls(m, ns, pod, c, n, kind)
        case ("timed", pod, c, slot, ns_total):
            calls(m, "ns", pod, c, 1)
            slots = [0] * abi.DURATION_SLOTS
            slots[slot] = 1
            value = Durations(ns_total, tuple(slots), (0,) * len(abi.ERRORS))
            where = Where("ns", pod, "", c, "0000:03:00.0", "vgem")
            m.put(DURATIONS, where, "submit", (Key(1, 226, 0, 0), value))
        case ("gone", ns, pod, c):
            m.gone(Where(ns, pod, "", c, "", ""))
        case ("tick", seconds):
            clock.now += seconds
        case ("read", source, at):
            m.set(STAMPS, source, at)
        case ("dropped", reason, n):
            m.set(DROPS, reason, n)


def app_and_reference(clock: Clock) -> tuple[Series, MetricsApp, CollectorRegistry]:
    m = table(60, 10_000, clock)
    app = MetricsApp(m, export.build_resource(config.Config(node_name="node-a")))
    app._process = CollectorRegistry()  # the process' CPU seconds differ from one call to the next
    reference = CollectorRegistry(auto_describe=False)
    reference.register(app._collector)
    return m, app, reference


def get(app: MetricsApp, accept: str, gzipped: bool = False, query: str = "") -> tuple[dict, bytes]:
    environ = {
        "REQUEST_METHOD": "GET",
        "PATH_INFO": "/metrics",
        "QUERY_STRING": query,
        "HTTP_ACCEPT": accept,
        "HTTP_ACCEPT_ENCODING": "gzip" if gzipped else "",
    }
    answer: dict[str, Any] = {}

    def start_response(status: str, headers: list[tuple[str, str]]) -> None:
        answer.update(headers, status=status)

    body = b"".join(app(environ, start_response))
    return answer, gzip.decompress(body) if gzipped else body


@settings(max_examples=150)  # no deadline: tests/conftest.py's profile
@given(st.lists(st.lists(ops, max_size=6), min_size=1, max_size=6))
def test_the_cached_rendering_is_prometheus_clients_after_any_changes(batches) -> None:
    with mock.patch.object(prometheus, "FAMILY_CHUNK", 2):  # families of several chunks
        rendered_as_the_library_does(batches)


def rendered_as_the_library_does(batches: list[list[tuple]]) -> None:
    clock = Clock()
    m, app, reference = app_and_reference(clock)
    for batch in batches:
        for op in batch:
            apply(m, clock, op)
        for accept in ACCEPTS:
            encoder, content_type = choose_encoder(accept)
            headers, body = get(app, accept)
            assert headers["Content-Type"] == content_type
            assert body == encoder(reference)


def test_gzip_and_the_content_type_are_the_librarys():
    clock = Clock()
    m, app, reference = app_and_reference(clock)
    calls(m, "ns", "p", "c", 3)
    for accept in ACCEPTS:
        encoder, content_type = choose_encoder(accept)
        headers, body = get(app, accept, gzipped=True)
        assert (headers["Content-Encoding"], headers["Content-Type"]) == ("gzip", content_type)
        assert body == encoder(reference)


def test_an_unchanged_family_is_not_encoded_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """At idle a scrape re-encodes only what moved: here the calls of one pod, nothing else."""
    clock = Clock()
    m, app, reference = app_and_reference(clock)
    for pod in range(50):
        calls(m, "ns", f"p{pod}", "c", 1)
    encoded: list[str] = []
    family = app._collector.family
    monkeypatch.setattr(
        app._collector, "family", lambda s, p: encoded.append(s.name) or family(s, p)
    )
    get(app, TEXT)
    first = len(encoded)
    get(app, TEXT)
    assert len(encoded) == first  # nothing changed: nothing encoded
    calls(m, "ns", "p7", "c", 1)
    _, body = get(app, TEXT)
    assert encoded[first:] == ["kubenpu.ioctl"]
    assert body == choose_encoder(TEXT)[0](reference)


def test_filters_and_other_methods_are_the_librarys():
    """A name[] filter gets only that family (it got nothing: the registry knew no names)."""
    clock = Clock()
    m, app, _ = app_and_reference(clock)
    calls(m, "ns", "p", "c", 3)
    _, body = get(app, TEXT, query="name[]=kubenpu_ioctl_total")
    assert body.startswith(b"# HELP kubenpu_ioctl_total")
    assert b"target_info" not in body
    answer: dict[str, Any] = {}
    environ = {"REQUEST_METHOD": "POST", "PATH_INFO": "/metrics", "QUERY_STRING": ""}
    app(environ, lambda status, headers: answer.update(status=status))
    assert answer["status"].startswith("405")


def test_the_histograms_buckets_are_the_hand_counted_ones():
    """Against text written out here, not the library's rendering of the same collector (which
    shares the cumulation with the cache and would pass an off-by-one in it). The calls' slots:
    1 under 2^-20 s, 2 in (2^-20, 2^-19.75], 4 in (2^-18.25, 2^-18] (at most the 2^-18 edge),
    8 just above it, 16 over 64 s. The CRI requests: one exactly on 1 ms, one of 30 ms, one of
    30 s."""
    clock = Clock()
    m, app, _ = app_and_reference(clock)
    calls(m, "ns", "p", "c", 31)
    slots = [0] * abi.DURATION_SLOTS
    slots[0], slots[1], slots[8], slots[9], slots[-1] = 1, 2, 4, 8, 16
    value = Durations(5_000_000, tuple(slots), (0,) * len(abi.ERRORS))
    where = Where("ns", "p", "", "c", "0000:03:00.0", "vgem")
    m.put(DURATIONS, where, "submit", (Key(1, 226, 0, 0), value))
    for seconds in (0.001, 0.03, 30.0):
        m.set(CRI, "", (seconds, True))
    _, body = get(app, TEXT)
    got = [line for line in body.decode().splitlines() if "_bucket{" in line]
    pod = 'container="c",device="0000:03:00.0",kind="submit",le="{}",namespace="ns",pod="p",'
    pod += 'pod_uid="",vendor="vgem"'
    calls_buckets = [
        ("9.5367431640625e-07", 1),
        ("3.814697265625e-06", 7),
        ("1.52587890625e-05", 15),
        *[(le, 15) for le in ("6.103515625e-05", "0.000244140625", "0.0009765625")],
        *[(le, 15) for le in ("0.00390625", "0.015625", "0.0625", "0.25", "1.0", "4.0")],
        ("16.0", 15),
        ("64.0", 15),
        ("+Inf", 31),
    ]
    cri_buckets = [("0.001", 1), *[(le, 1) for le in ("0.0025", "0.005", "0.01", "0.025")]]
    cri_buckets += [(le, 2) for le in ("0.05", "0.1", "0.25", "0.5", "1.0", "2.5", "5.0", "10.0")]
    cri_buckets += [("+Inf", 3)]
    h, cri = "kubenpu_ioctl_duration_seconds_bucket", "kubenpu_cri_request_duration_seconds_bucket"
    assert got == [
        *[f"{h}{{{pod.format(le)}}} {n}.0" for le, n in calls_buckets],
        *[f'{cri}{{le="{le}"}} {n}.0' for le, n in cri_buckets],
    ]
