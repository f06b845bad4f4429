"""The benchmark's table (Markdown) from bench_guest.py's bench.json and micro.py's JSON.

python bench/report.py BENCH_JSON [MICRO_JSON]
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

MODES = ("aggregate", "events")


def table(headers: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def pct(cpu_per_second: float) -> str:
    return f"{cpu_per_second * 100:.1f} %"


def drops(rec: dict) -> str:
    return ", ".join(f"{r} {n}" for r, n in sorted(rec["dropped"].items())) or "0"


def exact(rec: dict) -> str:
    ok = rec["counted"] + sum(rec["dropped"].values()) == rec["issued"]
    return "yes" if ok else "**NO**"


def cost(b: dict) -> str:
    base = b["baseline_ns_median"]
    best = min(b["baseline_ns"])
    rows = []
    for name, ns in [("none", b["baseline_ns"])] + [(m, b["modes"][m]["loops_ns"]) for m in MODES]:
        med = statistics.median(ns)
        ratios = [f"{min(ns) / best:.2f}x", f"{med / base:.2f}x", f"{min(ns) - best:.0f}"]
        rows.append([name, f"{min(ns):.0f}", f"{med:.0f}", f"{max(ns):.0f}", *ratios])
    head = ["agent", "ns per call: best", "median", "worst"]
    head += ["best vs no agent", "median vs no agent", "added ns (best)"]
    return (
        f"### Added cost per ioctl\n\nTight loops of {b['loop_calls']} DRM_IOCTL_MODE_CREATE_DUMB "
        f"calls on vgem (`drmcall`), {len(b['modes']['aggregate']['loops_ns'])} per agent; the "
        f"no-agent loops ran before, between and after the agent phases "
        f"({len(b['baseline_ns'])} loops).\n\n" + table(head, rows)
    )


def cpu(b: dict) -> str:
    m = {mode: b["modes"][mode] for mode in MODES}
    rows = [
        ["idle (no calls)", "-"]
        + [x for mode in MODES for x in (pct(m[mode]["idle_cpu_per_second"]), "-", "-")]
    ]
    for i, w in enumerate(m["aggregate"]["windows"]):
        target = f"{w['target_rate']:.0f}/s" if w["target_rate"] else "max (every vCPU)"
        row = [target, " / ".join(f"{m[mode]['windows'][i]['rate']}" for mode in MODES)]
        for mode in MODES:
            wm = m[mode]["windows"][i]
            row += [pct(wm["cpu_per_second"]), f"{wm['cpu_seconds_per_million']:.1f}", drops(wm)]
        rows.append(row)
    head = ["rate", "achieved calls/s (agg / ev)"]
    head += [f"{mode} {h}" for mode in MODES for h in ("CPU", "CPU s per M calls", "drops")]
    agg, ev = m["aggregate"]["windows"], m["events"]["windows"]
    flat = (
        f"Rate x{agg[1]['rate'] / agg[0]['rate']:.0f}: the agent's CPU per second x"
        f"{agg[1]['cpu_per_second'] / agg[0]['cpu_per_second']:.2f} in aggregate mode, x"
        f"{ev[1]['cpu_per_second'] / ev[0]['cpu_per_second']:.2f} in events mode."
    )
    return (
        "### Agent CPU\n\nThe agent's utime+stime (/proc/PID/stat). CPU: % of one vCPU while "
        "the calls are made. CPU s per M calls: from the first call until /metrics accounts for "
        "the last (the catch-up included), per million calls.\n\n"
        + table(head, rows)
        + "\n\n"
        + flat
    )


def exactness(b: dict) -> str:
    rows = []
    for mode in MODES:
        for name, rec in (
            ("max-rate window", b["modes"][mode]["windows"][-1]),
            ("every window and loop", total(b["modes"][mode])),
        ):
            rows.append([mode, name, rec["issued"], rec["counted"], drops(rec), exact(rec)])
    head = ["mode", "calls", "issued", "counted", "dropped", "counted + dropped = issued"]
    return "### Exactness\n\n" + table(head, rows)


def total(res: dict) -> dict:
    recs = [res["loops"], *res["windows"], res["tour"]]
    dropped: dict[str, int] = {}
    for rec in recs:
        for r, n in rec["dropped"].items():
            dropped[r] = dropped.get(r, 0) + n
    return {
        "issued": sum(r["issued"] for r in recs),
        "counted": sum(r["counted"] for r in recs),
        "dropped": dropped,
    }


def start_memory(b: dict) -> str:
    rows = []
    for mode in MODES:
        r = b["modes"][mode]
        tour = r["tour"]
        rows.append(
            [
                mode,
                f"{r['attach_seconds']:.1f}",
                f"{r['first_metric_seconds']:.1f}",
                f"{r['rss_mib_start']:.0f}",
                f"{r['rss_mib_steady']:.0f}",
                f"{tour['attributed']} / {tour['issued']} ({tour['series']} series)",
                pct(r["idle_cpu_per_second"]),
                pct(r["idle_cpu_per_second_pods"]),
            ]
        )
    head = [
        "mode",
        "start → attached (s)",
        "start → first metric (s)",
        "RSS at start (MiB)",
        f"RSS with {b['pods']} pods (MiB)",
        "pod calls attributed / issued",
        "idle CPU, 1 pod",
        f"idle CPU, {b['pods']} pods",
    ]
    return (
        f"### Start and memory with {b['pods']} pods\n\n{b['pods']} kubelet-style pod cgroups "
        "(systemd driver) exist before the agent starts, each known to the CRI test server; "
        f"after the other phases one process visits every pod's cgroup and makes calls there.\n\n"
        + table(head, rows)
    )


def micro(m: dict) -> str:
    rows = [
        ["decode one ring-buffer record", m["decode_ns_per_event"]],
        ["decode + fold into the Tally (per-event mode, polling thread)", m["tally_ns_per_event"]],
        ["whole per-event path: fold, then resolve + count per key", m["events_path_ns_per_event"]],
        ["aggregate mode, per key per collection (1,000 pods, 3 kinds)", m["aggregate_ns_per_key"]],
    ]
    fdinfo = [
        ["full /proc scan at start: 1,000 DRM clients among 50,000 fds", m["fdinfo_full_scan_ms"]],
        ["one fdinfo read (every fdinfo.interval_seconds): the 1,000 holders", m["fdinfo_read_ms"]],
    ]
    return (
        f"### Host micro-benchmark (Python {m['python']}, no VM)\n\n"
        + table(["user-space path", "ns"], rows)
        + "\n\n"
        + table(["fdinfo (synthetic /proc tree)", "ms"], fdinfo)
    )


def render(bench: dict, micro_figures: dict | None) -> str:
    parts = [
        f"## KubeNPU benchmark: kernel {bench['kernel']}, {bench['cpus']} vCPUs (QEMU TCG), "
        f"max ~{bench['max_rate']} calls/s with no agent",
        cost(bench),
        cpu(bench),
        exactness(bench),
        start_memory(bench),
    ]
    if micro_figures:
        parts.append(micro(micro_figures))
    return "\n\n".join(parts) + "\n"


def main() -> int:
    bench = json.loads(Path(sys.argv[1]).read_text())
    micro_figures = json.loads(Path(sys.argv[2]).read_text()) if len(sys.argv) > 2 else None
    sys.stdout.write(render(bench, micro_figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
