"""kubenpuctl latency: one pod's call durations and errors, from one agent's /metrics: per
instance of the pod (its uid: a recreated pod's predecessor may still be exported), container,
device and kind, the classic buckets of kubenpu_ioctl_duration_seconds (each the
calls in it, from its cumulative count) and kubenpu_ioctl_errors_total by error."""

from __future__ import annotations

from dataclasses import dataclass, field

from kubenpu.cli.top.sources import BUCKETS, ERRORS, Series, _get, parse

DURATION = BUCKETS.removesuffix("_bucket")
PLACE = ("pod_uid", "container", "device", "vendor", "kind")


@dataclass
class PodHistogram:
    place: tuple[str, ...]  # PLACE's values
    calls: int = 0
    seconds: float = 0.0
    cumulative: dict[float, int] = field(default_factory=dict)  # le -> calls at most le
    errors: dict[str, int] = field(default_factory=dict)

    def buckets(self) -> list[tuple[float, int]]:
        """(le, calls in the bucket that ends there), lowest first."""
        below, found = 0, []
        for le in sorted(self.cumulative):
            found.append((le, self.cumulative[le] - below))
            below = self.cumulative[le]
        return found

    def as_json(self) -> dict[str, object]:
        return {
            **dict(zip(PLACE, self.place, strict=True)),
            "calls": self.calls,
            "total_seconds": self.seconds,
            "buckets": [{"le_seconds": le, "calls": n} for le, n in self.buckets()],
            "errors": dict(sorted(self.errors.items())),
        }


def pod_histograms(series: list[Series], namespace: str, pod: str) -> list[PodHistogram]:
    """The pod's histograms, one per pod uid, container, device and kind, sorted by them."""
    found: dict[tuple[str, ...], PodHistogram] = {}
    for s in series:
        if (s.labels.get("namespace"), s.labels.get("pod")) != (namespace, pod):
            continue
        place = tuple(s.labels.get(k, "") for k in PLACE)
        if s.name not in (BUCKETS, f"{DURATION}_count", f"{DURATION}_sum", ERRORS):
            continue
        h = found.setdefault(place, PodHistogram(place))
        if s.name == BUCKETS and "le" in s.labels:
            h.cumulative[float(s.labels["le"])] = int(s.value)
        elif s.name == f"{DURATION}_count":
            h.calls = int(s.value)
        elif s.name == f"{DURATION}_sum":
            h.seconds = s.value
        elif s.name == ERRORS and s.value:
            h.errors[s.labels.get("error", "")] = int(s.value)
    return [found[k] for k in sorted(found)]


def read(url: str, namespace: str, pod: str, timeout: float = 5.0) -> list[PodHistogram]:
    """The pod's histograms from one scrape of `url`. Raises TopError."""
    series, _ = parse(_get(url, timeout, "text/plain;version=0.0.4"))
    return pod_histograms(series, namespace, pod)


# Which calls an agent times (kubenpu/kernel/core.py CoreKernel._exits), for a pod without any.
WHICH_ARE_TIMED = (
    "An agent times counted calls (probe.durations) at drm_ioctl's exit, which DRM calls alone "
    "pass (fexit, or a kretprobe without CAP_SYS_ADMIN where drm is a module); where drm is not "
    "loaded, or perf_event_paranoid above 2 or lockdown refuses the kretprobe, calls are counted "
    "untimed unless probe.durations_exit is syscall (every ioctl of the node then pays an exit). "
    "The agent's start logs which: 'counted calls timed at the exit of ...' or '... untimed'."
)


def render(histograms: list[PodHistogram], namespace: str, pod: str) -> str:
    """A block per histogram: its place, calls and total time, each bucket with a bar."""
    if not histograms:
        return f"{namespace}/{pod}: no timed calls. {WHICH_ARE_TIMED}"
    blocks = []
    uids = {h.place[0] for h in histograms}
    for h in histograms:
        uid, container, device, _, kind = h.place
        # Two uids: the pod was recreated and its predecessor is still exported; say which is which.
        who = f"{namespace}/{pod}" + (f" (uid {uid})" if len(uids) > 1 else "")
        lines = [f"{who} {container} {device} {kind}: {h.calls} calls, {h.seconds:.6g} s"]
        for le, n in h.buckets():
            bar = "#" * round(40 * n / max(h.calls, 1))
            lines.append(f"  <= {_bound(le):>9} {n:>10}  {bar}")
        if h.errors:
            lines.append("  errors: " + ", ".join(f"{e} {n}" for e, n in sorted(h.errors.items())))
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def _bound(seconds: float) -> str:
    if seconds == float("inf"):
        return "+Inf"
    if seconds >= 1:
        return f"{seconds:g} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} us"
