"""Adds GPU job queue waits to a dashboards recording that predates them (docs/dashboards.md):
the wait histogram and its split into the seconds behind each pod and on an idle ring, for
three pods on the VM tests' scheduler-backed driver, at constant rates from 3 s before the
first scrape. Per pod and ring the split sums to the histogram's sum exactly (whole ns), the
agent's conservation rule (docs/jobs.md#who-is-in-my-way).

usage: .venv/bin/python tests/testdata/dashboards_job_waits.py RECORDING.json (rewritten in place)
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from kubenpu.metrics.catalogue import JOB_WAIT, JOB_WAIT_BEHIND, JOB_WAIT_IDLE

DEVICE, RING = "platform:kubenpu_testdrm", "testdrm-ring"
TRAINER, INFER = ("team-a", "trainer-0"), ("team-b", "infer-7d9f")
# (namespace, pod, container): jobs per second, ns waited per second behind each pod, and idle.
PODS = {
    ("team-a", "trainer-0", "main"): (2, {TRAINER: 40_000_000, INFER: 30_000_000}, 20_000_000),
    ("team-b", "infer-7d9f", "server"): (10, {TRAINER: 400_000_000, INFER: 50_000_000}, 20_000_000),
    ("team-d", "render-0", "gpu"): (5, {TRAINER: 200_000_000, INFER: 100_000_000}, 10_000_000),
}
BOUNDS = [2.0**e for e in range(-20, 7, 2)] + [math.inf]  # the agent's classic buckets


def lines(seconds: float) -> list[str]:
    """The three families' exposition after `seconds` of jobs."""
    wait, behind = JOB_WAIT.prometheus_name, JOB_WAIT_BEHIND.prometheus_name
    idle = JOB_WAIT_IDLE.prometheus_name
    hist, parts, idles = [], [], []
    for (namespace, pod, container), (rate, by, idle_rate) in PODS.items():
        place = (
            f'container="{container}",device="{DEVICE}",namespace="{namespace}",pod="{pod}",'
            f'ring="{RING}",vendor=""'
        )
        jobs = int(rate * seconds)
        behind_ns = {who: int(n * seconds) for who, n in by.items()}
        idle_ns = int(idle_rate * seconds)
        total_ns = sum(behind_ns.values()) + idle_ns
        mean = total_ns / 1e9 / max(jobs, 1)
        for le in BOUNDS:  # none below a quarter of the mean, half to 4x it, all past
            n = 0 if le < mean / 4 else jobs if le >= mean * 4 else jobs // 2
            bound = "+Inf" if le == math.inf else repr(le)
            hist.append(f'{wait}_bucket{{{place},le="{bound}"}} {float(n)}')
        hist.append(f"{wait}_count{{{place}}} {float(jobs)}")
        hist.append(f"{wait}_sum{{{place}}} {total_ns / 1e9!r}")
        for (ns, who), n in behind_ns.items():
            by_labels = f'behind_namespace="{ns}",behind_pod="{who}"'
            parts.append(f"{behind}{{{by_labels},{place}}} {n / 1e9!r}")
        idles.append(f"{idle}{{{place}}} {idle_ns / 1e9!r}")
    return [
        *(f"# HELP {wait} {JOB_WAIT.description}", f"# TYPE {wait} histogram", *hist),
        *(f"# HELP {behind} {JOB_WAIT_BEHIND.description}", f"# TYPE {behind} counter", *parts),
        *(f"# HELP {idle} {JOB_WAIT_IDLE.description}", f"# TYPE {idle} counter", *idles),
    ]


def main(path: Path) -> None:
    raw = path.read_text()
    record = json.loads(raw)
    start = record["scrapes"][0]["time"] - 3.0
    for scrape in record["scrapes"]:
        added = lines(scrape["time"] - start)
        scrape["text"] = scrape["text"].rstrip("\n") + "\n" + "\n".join(added) + "\n"
    path.write_text(json.dumps(record) + raw[len(raw.rstrip()) :])


if __name__ == "__main__":
    main(Path(sys.argv[1]))
