"""Host-only stress of the metrics endpoint (no VM): idle connections and concurrent scrapes.

    python bench/scrape_stress.py [--json FILE] [--idle 3000] [--scrapes 200] [--series 2000]
    python bench/scrape_stress.py --attach PID:PORT ...   (stress a server that is already up)

Starts the agent's real metrics server (kubenpu.export.start with default settings but on
127.0.0.1) in a child process with SERIES kubenpu_ioctl_total series, then measures, from the
outside, the child's threads and RSS (/proc/PID/status):
  1. IDLE connections opened and left silent (a slowloris): thread and RSS growth;
  2. SCRAPES concurrent full scrapes of /metrics, in ROUNDS rounds: latency p50/p99/max;
  3. the same scrapes while the IDLE connections are still held.
Speed figures only; the behaviour (bounded threads, timeouts) is asserted by tests/test_export.py.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def serve(series: int, port: int) -> None:
    """The child: the real server with `series` ioctl series; says "ready", runs until EOF."""
    from kubenpu import config, export
    from kubenpu.sources.registry import table

    class Healthy:
        def live(self) -> tuple[bool, str]:
            return True, ""

        def ready(self) -> tuple[bool, str]:
            return True, ""

    cfg = config.Config.model_validate(
        {"node_name": "bench", "export": {"prometheus": {"host": "127.0.0.1", "port": port}}}
    )
    metrics = table(300, series + 1)
    for i in range(series):
        pod, kind = divmod(i, 2)
        metrics.add_calls("bench", f"pod-{pod // 2}", f"c{pod % 2}", "0000:03:00.0", "vgem",
                          ("submit", "wait")[kind], i + 1)  # fmt: skip
    tel = export.start(cfg, metrics, Healthy())
    print("ready", flush=True)
    sys.stdin.read()
    tel.shutdown()


def start_server(series: int) -> tuple[subprocess.Popen[str], int]:
    """The child serving on a free port, once it is ready: (process, port). Stop it with
    communicate("")."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    child = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(port), "--series", str(series)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert child.stdout is not None
    assert child.stdout.readline() == "ready\n", "the metrics server did not start"
    return child, port


def report(name: str, result: dict[str, object], path: str | None) -> None:
    """One line per figure on stdout, and the JSON file when asked for."""
    for key, value in result.items():
        print(f"{name} {key}: {value}")
    if path:
        Path(path).write_text(json.dumps(result, indent=1) + "\n")


def proc_status(pid: int) -> tuple[int, float]:
    """(threads, RSS in MB) of a process."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return int(fields["Threads"]), int(fields["VmRSS"].split()[0]) / 1024


def open_idle(port: int, n: int) -> list[socket.socket]:
    idle = []
    for _ in range(n):
        s = socket.socket()
        s.settimeout(30)
        s.connect(("127.0.0.1", port))
        idle.append(s)
    return idle


def scrape_round(port: int, n: int) -> list[float]:
    """n scrapes started at once; each one's seconds from connect to the last byte."""
    start = threading.Barrier(n)
    times: list[float] = []
    lock = threading.Lock()

    def one() -> None:
        start.wait()
        t0 = time.monotonic()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60) as r:
                ok = b"kubenpu_ioctl_total" in r.read()
        except OSError:
            ok = False
        with lock:
            times.append(time.monotonic() - t0 if ok else float("inf"))

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return times


def percentiles(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    failed = sum(t == float("inf") for t in ordered)
    return {"p50_s": pick(0.50), "p99_s": pick(0.99), "max_s": ordered[-1], "failed": failed}


def stress(pid: int, port: int, idle_n: int, scrapes: int, rounds: int) -> dict[str, object]:
    threads0, rss0 = proc_status(pid)
    out: dict[str, object] = {"threads_before": threads0, "rss_mb_before": round(rss0, 1)}
    idle = open_idle(port, idle_n)
    time.sleep(1)  # let the server accept them all (well within the read timeout)
    threads1, rss1 = proc_status(pid)
    out |= {"idle_threads_added": threads1 - threads0, "idle_rss_mb_added": round(rss1 - rss0, 1)}
    out["scrape_with_idle"] = percentiles(scrape_round(port, scrapes))
    for s in idle:
        s.close()
    time.sleep(1)
    out["scrape"] = percentiles([t for _ in range(rounds) for t in scrape_round(port, scrapes)])
    threads2, rss2 = proc_status(pid)
    out |= {"threads_after": threads2, "rss_mb_after": round(rss2, 1)}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idle", type=int, default=3000)
    parser.add_argument("--scrapes", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--series", type=int, default=2000)
    parser.add_argument("--attach", metavar="PID:PORT", help="stress this server instead")
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument("--serve", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the idle sockets, both ends
    if args.serve:
        serve(args.series, args.serve)
        return 0
    child = None
    if args.attach:
        pid, port = map(int, args.attach.split(":"))
    else:
        child, port = start_server(args.series)
        pid = child.pid
    try:
        result = stress(pid, port, args.idle, args.scrapes, args.rounds)
    finally:
        if child:
            child.communicate("", timeout=60)
    result |= {"idle": args.idle, "scrapes": args.scrapes, "series": args.series}
    report("scrape_stress", result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
