"""Prometheus rendering: the agent's series table as a prometheus_client collector, plus target_info
for the resource. Names are Spec.prometheus_name: Prometheus' own OTLP translation of each OTel
name and unit, so both export paths name a metric alike.

A scrape encodes family by family with prometheus_client's own encoder, and keeps each family's
bytes with the points they came from: a family whose points are all unchanged is not encoded
again. At idle that is every family but the read timestamps: an idle scrape of 1,000 pods
went from 2.3 s of CPU to 0.4 s on the host (docs/performance.md).
"""

from __future__ import annotations

import gzip
from collections.abc import Callable, Hashable, Iterable, Iterator
from typing import Any
from urllib.parse import parse_qs

from opentelemetry.sdk.resources import Resource
from prometheus_client import CollectorRegistry, ProcessCollector, make_wsgi_app
from prometheus_client.core import Metric as PromMetric
from prometheus_client.exposition import choose_encoder, gzip_accepted
from prometheus_client.registry import Collector

from kubenpu.kernel import abi
from kubenpu.metrics.catalogue import CRI_BOUNDS, SPECS, Spec
from kubenpu.metrics.points import ExpHist, Hist, Point
from kubenpu.metrics.series import Series

# The classic buckets of an ExpHist: every other power of two of its range, 2^-20 s to 2^6 s,
# each an edge of the kernel's buckets, so no count is re-binned. `le` 2^k holds the under
# slot and every bucket whose upper bound 2^((i+1)/4) is at most 2^k: the slots before
# 4k + 1 - FIRST_INDEX.
EXP_EDGES = tuple((2.0**k, 4 * k + 1 - abi.FIRST_INDEX) for k in range(abi.FIRST_INDEX // 4, 7, 2))


def _label_name(key: str) -> str:
    return key.replace(".", "_")


def _label_value(v: str | bool) -> str:
    return str(v).lower() if isinstance(v, bool) else v


class PrometheusCollector(Collector):
    """Renders the series table's snapshots for prometheus_client, plus target_info for the
    resource."""

    def __init__(self, metrics: Series, resource: Resource) -> None:
        self._metrics = metrics
        self._target = {_label_name(k): str(v) for k, v in resource.attributes.items()}

    def collect(self) -> Iterator[PromMetric]:
        yield self.target_info()
        for spec, points in self._metrics.collect():
            yield self.family(spec, points)

    def describe(self) -> Iterator[PromMetric]:
        """Every family by name, without samples: what `?name[]=` filters look names up in
        (without it the registry knew none, and a filtered scrape was empty)."""
        yield self.target_info()
        for spec in SPECS:
            name = spec.prometheus_name.removesuffix("_total")
            yield PromMetric(name, spec.description, spec.prometheus_kind)

    def target_info(self) -> PromMetric:
        info = PromMetric("target_info", "Target metadata (the OTel resource)", "gauge")
        info.add_sample("target_info", self._target, 1)
        return info

    def snapshot(self) -> list[tuple[Spec, list[Point]]]:
        return self._metrics.collect()

    @staticmethod
    def family(spec: Spec, points: list[Point]) -> PromMetric:
        name = spec.prometheus_name
        fam = PromMetric(name.removesuffix("_total"), spec.description, spec.prometheus_kind)
        for p in points:
            labels = {_label_name(k): _label_value(v) for k, v in p.attrs.items()}
            if isinstance(p.value, Hist | ExpHist):
                for le, n in _cumulative(p.value):
                    fam.add_sample(name + "_bucket", {**labels, "le": le}, n)
                fam.add_sample(name + "_count", labels, p.value.count)
                fam.add_sample(name + "_sum", labels, p.value.total)
            else:
                fam.add_sample(name, labels, p.value)
        return fam


def _cumulative(h: Hist | ExpHist) -> Iterator[tuple[str, int]]:
    """(le, calls at most le) of a histogram's classic buckets, +Inf last."""
    if isinstance(h, ExpHist):
        for edge, end in EXP_EDGES:
            yield repr(edge), sum(h.slots[:end])
    else:
        cumulative = 0
        for bound, n in zip(CRI_BOUNDS, h.buckets, strict=False):
            cumulative += n
            yield repr(bound), cumulative
    yield "+Inf", h.count


class _One(Collector):
    """One family, for an encoder that takes a registry."""

    def __init__(self, family: PromMetric) -> None:
        self._family = family

    def collect(self) -> Iterator[PromMetric]:
        yield self._family


_EOF = b"# EOF\n"  # OpenMetrics' last line: once, after every family
# Points of a family built into samples and encoded at once: 1,000 pods' call histograms are
# 30,000 samples, ~16 MiB of objects together, and the agent's RSS kept them after the scrape.
FAMILY_CHUNK = 100


def _samples(encoded: bytes) -> bytes:
    """An encoded family's sample lines: its header (# HELP, # TYPE, # UNIT) left out."""
    while encoded.startswith(b"# "):
        encoded = encoded.partition(b"\n")[2]
    return encoded


class MetricsApp:
    """/metrics for the metrics server: the agent's Metrics and the process' own metrics, as
    prometheus_client's WSGI app serves them (Accept, gzip, name[] filters, methods), and
    which of its renderings a request gets. A plain GET encodes the families here, each
    only when its points changed since that rendering last encoded it."""

    def __init__(self, metrics: Series, resource: Resource) -> None:
        self._collector = PrometheusCollector(metrics, resource)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self._collector)
        self._process = CollectorRegistry(auto_describe=False)
        for target in (registry, self._process):
            ProcessCollector(registry=target)  # process_resident_memory_bytes and friends
        self._app = make_wsgi_app(registry)  # every request but a plain GET
        # (content type, metric name) -> the points last encoded and their bytes, for the last
        # content type asked only: the cache holds one exposition at most (10 MB with 1,000
        # pods of every series kind) and its points, and Prometheus asks for one.
        self._encoded: dict[tuple[str, str], tuple[list[Point], bytes]] = {}
        self._encoded_type = ""

    def __call__(
        self, environ: dict[str, Any], start_response: Callable[..., Any]
    ) -> Iterable[bytes]:
        plain = environ["REQUEST_METHOD"] == "GET" and environ.get("PATH_INFO") != "/favicon.ico"
        if not plain or "name[]" in parse_qs(environ.get("QUERY_STRING", "")):
            return self._app(environ, start_response)
        encoder, content_type = choose_encoder(environ.get("HTTP_ACCEPT"))
        output = self._encode(encoder, content_type)
        headers = [("Content-Type", content_type)]
        if gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING", "")):
            output = gzip.compress(output)
            headers.append(("Content-Encoding", "gzip"))
        start_response("200 OK", headers)
        return [output]

    def _encode(self, encoder: Callable[[Collector], bytes], content_type: str) -> bytes:
        """What encoder(registry) gives, family by family, unchanged ones from the cache.
        Two variants rendering at once may both encode a family: each keeps a (points, bytes)
        pair whole under its own content type, so either's bytes are right for its points."""
        if self._encoded_type != content_type:  # the other type's entries would not be used
            self._encoded_type, self._encoded = content_type, {}
        encoded = self._encoded
        parts = [encoder(_One(self._collector.target_info()))]
        for spec, points in self._collector.snapshot():
            key = (content_type, spec.prometheus_name)
            cached = encoded.get(key)
            if cached is None or cached[0] != points:
                cached = encoded[key] = (points, self._family_bytes(encoder, spec, points))
            parts.append(cached[1])
        parts.append(encoder(self._process))
        eof = parts[-1].endswith(_EOF)
        return b"".join(p.removesuffix(_EOF) for p in parts) + (_EOF if eof else b"")

    def _family_bytes(
        self, encoder: Callable[[Collector], bytes], spec: Spec, points: list[Point]
    ) -> bytes:
        """encoder() of the family, FAMILY_CHUNK points at a time, its header once."""
        parts = []
        for start in range(0, max(len(points), 1), FAMILY_CHUNK):
            family = self._collector.family(spec, points[start : start + FAMILY_CHUNK])
            part = encoder(_One(family)).removesuffix(_EOF)
            parts.append(_samples(part) if start else part)
        return b"".join(parts)

    @staticmethod
    def variant(accept: str, encoding: str) -> Hashable:
        """The rendering that requests with these Accept and Accept-Encoding headers get: the
        same bytes for all the requests of one variant (the server shares them)."""
        return choose_encoder(accept)[1], gzip_accepted(encoding)
