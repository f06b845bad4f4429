"""Host-only stress figures of big nodes and floods (no VM), for `make bench`:

    python bench/stress.py [--json FILE] [--idle 6000] [--hold 60] [--cgroups 10000]
                           [--misses 200] [--series 20000,100000]

1. probes under idle connections: IDLE connections to the real metrics server (a child process,
   as bench/scrape_stress.py starts it) held silent for HOLD seconds while /healthz is asked
   once a second, as a kubelet does: answered within 5 s, latency p50 and max;
2. misses in a big tree: CGROUPS cgroup directories and MISSES calls from cgroups already
   removed, resolved by the real Resolver as one attribution batch is (prefetch, then resolve
   each): seconds and tree walks;
3. push sizes: SERIES kubenpu_ioctl_total series pushed by the real OtlpPusher to a real gRPC
   receiver (tests/otlp_receiver.py, 4 MiB limit): requests, largest request, seconds.
Speed and size figures only; the behaviour is asserted by the unit tests (test_export.py,
test_agent.py, test_resolver.py).
"""

from __future__ import annotations

import argparse
import http.client
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from scrape_stress import open_idle, percentiles, proc_status, report, start_server  # noqa: E402

PROBE_TIMEOUT = 5.0  # seconds a probe may take to count as answered


def probe(port: int) -> float:
    """Seconds to a /healthz answer; inf when none within PROBE_TIMEOUT."""
    t0 = time.monotonic()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=PROBE_TIMEOUT)
        conn.request("GET", "/healthz")
        ok = conn.getresponse().status == 200
        conn.close()
    except OSError:
        ok = False
    return time.monotonic() - t0 if ok else float("inf")


def idle_probes(idle: int, hold: float) -> dict[str, object]:
    child, port = start_server(2000)
    try:
        held = open_idle(port, idle)
        times: list[float] = []
        deadline = time.monotonic() + hold
        while time.monotonic() < deadline:
            times.append(probe(port))
            time.sleep(max(0.0, 1.0 - times[-1]) if times[-1] != float("inf") else 0)
        threads, rss = proc_status(child.pid)
        for s in held:
            s.close()
    finally:
        child.communicate("", timeout=60)
    answered = [t for t in times if t != float("inf")]
    return {
        "idle": idle,
        "hold_s": hold,
        "probes": len(times),
        "answered": len(answered),
        "probe": percentiles(times),
        "server_threads": threads,
        "server_rss_mb": round(rss, 1),
    }


def tree_misses(cgroups: int, misses: int) -> dict[str, object]:
    from kubenpu.resolve.resolver import Resolver

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "cgroup"
        pods = root / "kubepods.slice" / "kubepods-besteffort.slice"
        for i in range(cgroups):
            (pods / f"pod{i:05d}.slice").mkdir(parents=True)
        gone = []
        for i in range(misses):  # real inode numbers that the tree no longer has
            d = Path(tmp) / f"gone{i}"
            d.mkdir()
            gone.append(d.stat().st_ino)
        walks: list[int] = []
        resolver = Resolver(
            str(root), f"unix://{tmp}/no-cri.sock", 0.1, on_rebuild=lambda: walks.append(1)
        )
        try:
            t0 = time.monotonic()
            resolver.prefetch([pods.stat().st_ino])  # the first walk, at start
            first = time.monotonic() - t0
            walks.clear()
            t0 = time.monotonic()
            resolver.prefetch(gone)  # one attribution batch: its misses share one walk
            answers = {str(resolver.resolve(c).reason) for c in gone}
            batch = time.monotonic() - t0
        finally:
            resolver.close()
    return {
        "cgroups": cgroups,
        "misses": misses,
        "first_walk_s": round(first, 3),
        "batch_s": round(batch, 3),
        "batch_walks": len(walks),
        "answers": sorted(answers),
    }


def push_sizes(series: int) -> dict[str, object]:
    from otlp_receiver import OtlpReceiver

    from kubenpu import config
    from kubenpu.export import build_resource
    from kubenpu.export.otlp import OtlpPusher
    from kubenpu.sources.registry import table

    with OtlpReceiver() as rx:
        cfg = config.Config.model_validate(
            {
                "node_name": "bench",
                "metrics": {"max_series": series},
                "export": {
                    "otlp": {
                        "enabled": True,
                        "endpoint": f"http://127.0.0.1:{rx.port}",
                        "timeout_seconds": 300,
                        "interval_seconds": 86_400,  # only the push below, and the final one
                    }
                },
            }
        )
        metrics = table(300, series)
        for i in range(series):
            metrics.add_calls("bench", f"pod-{i:06d}", "container", "0000:03:00.0", "xe",
                              "submit", i + 1)  # fmt: skip
        pusher = OtlpPusher(cfg.export.otlp, metrics, build_resource(cfg))
        pusher.start()
        t0 = time.monotonic()
        ok = pusher.push()
        seconds = time.monotonic() - t0
        sizes = [r.ByteSize() for r in rx.requests]
        pusher.shutdown()
    return {
        "series": series,
        "delivered": ok,
        "requests": len(sizes),
        "largest_request_mb": round(max(sizes) / 1e6, 2),
        "total_mb": round(sum(sizes) / 1e6, 2),
        "limit_mb": round(cfg.export.otlp.max_request_bytes / 1e6, 2),
        "push_s": round(seconds, 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idle", type=int, default=6000)
    parser.add_argument("--hold", type=float, default=60)
    parser.add_argument("--cgroups", type=int, default=10_000)
    parser.add_argument("--misses", type=int, default=200)
    parser.add_argument("--series", default="20000,100000")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the idle sockets' client ends
    result: dict[str, object] = {
        "idle_probes": idle_probes(args.idle, args.hold),
        "tree_misses": tree_misses(args.cgroups, args.misses),
        "push_sizes": [push_sizes(int(n)) for n in args.series.split(",")],
    }
    report("stress", result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
