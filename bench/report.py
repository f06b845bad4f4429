"""The benchmark's table (Markdown) from bench_guest.py's bench.json and micro.py's JSON, and
with --plot a picture of its key figures: calls/s against the agent's CPU, per probe mode.

python bench/report.py BENCH_JSON [MICRO_JSON] [--plot PNG]
"""

from __future__ import annotations

import json
import math
import random
import statistics
import sys
from collections.abc import Callable
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
        f"after the other phases one process visits every pod's cgroup and makes calls there. "
        f"Idle CPU with {b['pods']} pods is the median of the last 3 of these 5 s windows from "
        "the tour's end:\n\n"
        + "".join(
            f"- {mode}: {', '.join(pct(w) for w in b['modes'][mode]['idle_cpu_windows_pods'])}\n"
            for mode in MODES
        )
        + "\n"
        + table(head, rows)
    )


def ratio(ns: list[float], base: float) -> str:
    return f"{statistics.median(ns) / base:.2f}x"


def floor(b: dict) -> str:
    """KubeNPU's aggregate mode against the bpftrace one-liner's arm, phase by phase."""
    agg, bt = b["modes"]["aggregate"], b["bpftrace"]
    base, best = b["baseline_ns_median"], min(b["baseline_ns"])

    def row(name: str, f: Callable[[dict], str]) -> list[str]:
        return [name, f(agg), f(bt)]

    def share(rec: dict) -> str:
        missing = rec["issued"] - rec["counted"]
        return f"{rec['counted']} / {rec['issued']}" + (
            f" (**{missing} not counted**)" * bool(missing)
        )

    def window_cpu(i: int) -> Callable[[dict], str]:
        return lambda r: pct(r["windows"][i]["cpu_per_second"])

    rows = [
        row("ns per call vs no agent (median)", lambda r: ratio(r["loops_ns"], base)),
        row("added ns per call (best loop)", lambda r: f"{min(r['loops_ns']) - best:.0f}"),
        row("agent CPU, idle", lambda r: pct(r["idle_cpu_per_second"])),
    ]
    for i, w in enumerate(agg["windows"]):
        rate = f"{w['target_rate']:.0f}/s" if w["target_rate"] else "max (every vCPU)"
        rows.append(row(f"agent CPU at {rate}", window_cpu(i)))
    rows += [
        ["counted / issued, every phase", share(total(agg)), share(bt["total"])],
        [
            "start → first count (s)",
            f"{agg['first_metric_seconds']:.1f}",
            f"{bt['attach_seconds']:.1f}",
        ],
        row("RSS at start (MiB)", lambda r: f"{r['rss_mib_start']:.0f}"),
        row(f"RSS with {b['pods']} pods (MiB)", lambda r: f"{r['rss_mib_steady']:.0f}"),
    ]
    head = ["", "KubeNPU aggregate", f"bpftrace one-liner on {bt['hook']}"]
    return (
        "### The floor: a bpftrace one-liner\n\n"
        f"`bpftrace -e '{bt['program']}'` ran the aggregate mode's phases in the same boot "
        "(loops, windows, the pod tour); its map, printed when it stops, is the count. KubeNPU's "
        "start → first count is start → first metric; bpftrace's is start → every probe "
        "attached (its BEGIN probe has run).\n\n" + table(head, rows)
    )


def restart(b: dict) -> str:
    r = b["restart"]
    across = r["across"]
    rows = [
        [
            "cold start, BCC fallback (compiles on the node, no pinning)",
            f"{r['bcc_attached_seconds']:.1f}",
            f"{r['bcc_first_metric_seconds']:.1f}",
            f"{r['bcc_rss_mib_start']:.0f}",
            "",
            "",
        ],
        [
            "cold start, pinning (CO-RE, loaded in the agent)",
            f"{r['cold_attached_seconds']:.1f}",
            f"{r['cold_first_metric_seconds']:.1f}",
            f"{r['cold_rss_mib_start']:.0f}",
            f"{r['cold_rss_mib_steady']:.0f}",
            "",
        ],
        [
            "restart that adopts the pins",
            f"{r['adopt_attached_seconds']:.1f}",
            f"{r['adopt_first_metric_seconds']:.1f}",
            f"{r['adopt_rss_mib_start']:.0f}",
            f"{r['adopt_rss_mib_steady']:.0f}",
            f"{across['lost']} of {across['issued']} (dropped: {drops(across)})",
        ],
    ]
    if "modes" in b:  # the in-process cold start of the same boot, no pinning
        m = b["modes"]["aggregate"]
        rows.insert(
            0,
            [
                "cold start, no pinning (in process)",
                f"{m['attach_seconds']:.1f}",
                f"{m['first_metric_seconds']:.1f}",
                f"{m['rss_mib_start']:.0f}",
                f"{m['rss_mib_steady']:.0f}",
                "",
            ],
        )
    head = [
        "aggregate mode",
        "start → attached (s)",
        "start → first metric (s)",
        "RSS at start (MiB)",
        f"RSS with {b['pods']} pods (MiB)",
        "calls lost across the restart",
    ]
    return (
        "### Cold starts and restarts with the probe pinned (docs/pinning.md, docs/core.md)\n\n"
        "The BCC fallback's cold start (it compiles), the CO-RE object's cold start that pins, "
        "then a paced load across a SIGKILL of the agent and a restart that adopts the pins; "
        "lost = issued - counted (drops listed apart).\n\n" + table(head, rows)
    )


def per_call(b: dict) -> str:
    """The per-call rounds (bench_guest.py hooks()): each arm's figures, then the paired rows."""
    arms = b["rounds"]["arms"]
    none = arms["none"]
    rows = []
    for arm, rec in arms.items():
        row = [arm if arm != "none" else "none (no agent)"]
        for call in ("tcgets", "drm"):
            added = [a - n for a, n in zip(rec[call], none[call], strict=True)]
            row += [f"{statistics.median(rec[call]):.0f}", f"{statistics.median(added):+.0f}"]
        idle = statistics.median(rec["idle"])
        per_second = statistics.median(rec["switches"]) / IDLE_SECONDS
        start = f"{statistics.median(rec['start']):.1f}" if arm != "none" else ""
        rows.append([*row, pct(idle), f"{per_second:.1f}", start])
    head = ["arm", "TCGETS ns/call", "added", "DRM ns/call", "added"]
    head += ["idle CPU", "switches/s at idle", "start (s)"]
    clean = b["rounds"]["clean"]
    checked = (
        "every arm started with no tracing program of an earlier arm loaded (bpftool)"
        if clean["bpftool"] and not clean["leftovers"]
        else f"arms not checked or not clean: {clean}"
    )
    return (
        f"### Cost per ioctl, paired by round ({b['hooks_rounds']} rounds)\n\n"
        f"Each round started every arm afresh, in an order reversed every other round; an arm's "
        f"figure in a round is the median of {b['loops_per_round']} tight loops of "
        f"{b['hooks_loop_calls']} calls of each: TCGETS on a pty (not a DRM ioctl) and "
        "DRM_IOCTL_MODE_CREATE_DUMB on vgem (counted). Medians over rounds; added: the median of "
        "(arm - no agent) in the same round. Idle CPU and context switches: over 5 s after the "
        "arm settled. Start: the default agent's start → first metric, a one-liner's start → "
        f"attached. {checked}.\n\n" + table(head, rows) + paired(arms, b["hooks_rounds"])
    )


IDLE_SECONDS = 5.0  # bench_guest.py IDLE_SECONDS: the window the switches are counted over
# What paired() sets against what: the agent's arm, and its floor.
VERSUS = (
    ("agent", "bpftrace"),
    ("agent untimed", "bpftrace"),
    ("agent", "bpftrace-timed drm_ioctl exit"),
    ("agent syscall exit", "bpftrace-timed syscall exit"),
    ("agent syscall exit", "bpftrace"),
    ("agent", "agent calls only"),
)


def bootstrap(
    rounds: list[tuple[float, ...]], stat: Callable[[list[tuple[float, ...]]], float]
) -> tuple[float, float, float]:
    """stat over the rounds, and its 95 % percentile interval over 2,000 resamples of whole
    rounds (seeded: a report renders the same twice)."""
    rng = random.Random(0)
    draws = sorted(stat(rng.choices(rounds, k=len(rounds))) for _ in range(2000))
    return stat(rounds), draws[50], draws[1949]


def _diff(rounds: list[tuple[float, ...]]) -> float:
    return statistics.fmean(a - b for a, b, _ in rounds)


def _ratio(rounds: list[tuple[float, ...]]) -> float:
    """The agent's added ns over the floor's; infinite where the floor adds nothing."""
    ours, floor, none = (statistics.fmean(col) for col in zip(*rounds, strict=True))
    return (ours - none) / (floor - none) if floor > none else math.inf


def _num(x: float, fmt: str) -> str:
    return "∞" if math.isinf(x) else format(x, fmt)


def _floor_added(rounds: list[tuple[float, ...]]) -> float:
    return statistics.fmean(floor - none for _, floor, none in rounds)


def _ratio_cell(rounds: list[tuple[float, ...]]) -> str:
    """The added ratio with its interval; "-" where the floor's own added ns are not above 0 at
    95 % (a ratio to nothing measurable)."""
    if bootstrap(rounds, _floor_added)[1] <= 0:
        return "-"
    ratio = bootstrap(rounds, _ratio)
    return f"{_num(ratio[0], '.2f')}x [{_num(ratio[1], '.2f')}, {_num(ratio[2], '.2f')}]"


def _width_cell(rounds: list[tuple[float, ...]]) -> str:
    """The difference's interval half-width against the floor's added ns (issue 45's bar: under
    20 %); "-" where the floor adds nothing."""
    floor = _floor_added(rounds)
    if floor <= 0:
        return "-"
    _, low, high = bootstrap(rounds, _diff)
    return f"±{(high - low) / 2 / floor:.0%}"


def paired(arms: dict, n: int) -> str:
    """The table that settles small differences: the agent's ns per call minus its floor's,
    round by round (both ran in every round), with 95 % intervals; an interval that holds 0 is
    no difference this run can tell."""
    rows = []
    for ours, floor in VERSUS:
        if ours not in arms or floor not in arms:
            continue
        row = [f"{ours} - {floor}"]
        for call in ("tcgets", "drm"):
            rounds = list(zip(arms[ours][call], arms[floor][call], arms["none"][call], strict=True))
            d = bootstrap(rounds, _diff)
            row += [f"{d[0]:+.0f} [{d[1]:+.0f}, {d[2]:+.0f}]", _ratio_cell(rounds)]
            row.append(_width_cell(rounds))
        rows.append(row)
    head = ["agent - floor"]
    head += [
        f"{c} {x}"
        for c in ("TCGETS", "DRM")
        for x in ("ns/call [95 %]", "added ratio", "half-width / floor's added")
    ]
    return (
        f"\n\n#### Paired by round ({n} rounds)\n\nDifferences are the mean over rounds of "
        "(agent - floor) in the same round; the added ratio is the agent's added ns over the "
        "floor's (each against the same rounds' no-agent loops). Intervals: 95 %, bootstrap "
        "over rounds.\n\n" + table(head, rows) + "\n"
    )


def sources(b: dict) -> str:
    """A row per default source: the agent with the calls alone, then with each on alone."""
    rows = [
        [row, pct(rec["idle_cpu"]), f"{rec['switches_per_second']:.1f}"]
        for row, rec in b["sources"].items()
    ]
    return (
        "### Idle, a row per default source (1 pod)\n\nThe agent counting calls alone, then "
        "with each of its other default sources on alone; CPU and context switches (all "
        "threads) over 10 s after it settled.\n\n"
        + table(["agent", "idle CPU", "switches/s"], rows)
    )


def idle_pods(b: dict) -> str:
    """Idle with PODS pods: the default agent and the one-liner, after the pod tour."""
    rows = [
        [
            arm,
            pct(rec["idle_cpu_per_second_pods"]),
            " ".join(pct(w) for w in rec["idle_cpu_windows_pods"]),
            f"{rec['rss_mib']:.0f}",
        ]
        for arm, rec in b["idle_pods"].items()
    ]
    return (
        "### Idle with 1,000 pods\n\nAfter one process made 3 calls in each pod's cgroup: the "
        "median of the last 3 of 6 windows of 5 s (every window beside it).\n\n"
        + table(["arm", "idle CPU", "windows", "RSS (MiB)"], rows)
    )


# What the jobs row sets against what: (arm, against), jobs/s of the first over the second's in
# the same round. The jobs probe alone is the agent against itself without it.
JOB_PAIRS = (("agent", "none"), ("agent jobs off", "none"), ("bpftrace", "none"))
JOB_PAIRS += (("agent", "agent jobs off"), ("agent", "bpftrace"))


def spread(values: list[float]) -> str:
    """A per-round figure: the median over rounds, [lowest, highest]."""
    return f"{statistics.median(values):.2f}x [{min(values):.2f}, {max(values):.2f}]"


def counted_cell(rec: dict) -> str:
    """The jobs the arm counted against those issued, over every round; "-" for an arm that
    counts no jobs."""
    if not rec["counted"]:
        return "-"
    counted, issued = sum(rec["counted"]), sum(rec["issued"])
    missing = issued - counted
    return f"{counted} / {issued}" + f" (**{missing} not counted**)" * bool(missing)


def by_round(rec: dict, base: dict) -> list[float]:
    """jobs/s of one arm over another's, round by round."""
    return [a / n for a, n in zip(rec["jobs_per_second"], base["jobs_per_second"], strict=True)]


def jobs(b: dict) -> str:
    """The GPU jobs row (bench_guest.py jobs()): each arm's jobs/s and CPU, then jobs/s ratios
    taken round by round."""
    j = b["jobs"]
    head = "### GPU jobs: jobs/s through the test driver's ring (docs/jobs.md)\n\n"
    if "skipped" in j:
        return head + f"Not measured: the test driver did not load ({j['skipped']})."
    arms = j["arms"]
    rows = []
    for arm, rec in arms.items():
        busy = arm != "none"
        per_million = [c / r * 1e6 for c, r in zip(rec["cpu"], rec["jobs_per_second"], strict=True)]
        rows.append(
            [
                arm if busy else "none (no agent)",
                f"{statistics.median(rec['jobs_per_second']):.0f}",
                pct(statistics.median(rec["cpu"])) if busy else "-",
                f"{statistics.median(per_million):.1f}" if busy else "-",
                counted_cell(rec),
            ]
        )
    ratios = [
        [f"{arm} / {base}", spread(by_round(arms[arm], arms[base]))]
        for arm, base in JOB_PAIRS
        if arm in arms and base in arms
    ]
    probes = sorted({line for rec in arms.values() for line in rec["probe"] if line})
    attached = all("attached" in line for line in probes) and bool(probes)
    said = "; ".join(f"`{line}`" for line in probes) or "no GPU jobs line"
    return (
        head + f"{j['rounds']} rounds, each starting every arm afresh in an order reversed every "
        f"other round; in each, {j['bursts']} bursts of {j['burst_jobs']} jobs of no length from "
        f"one process, on a fresh fd every {j['step_jobs']} jobs, timed from its start until it "
        "exits (a close waits until the scheduler has taken every job of the fd): jobs/s is "
        "the median over rounds of the bursts' median. CPU: the "
        "arm's process (all threads), % of one vCPU over the bursts. Counted: the agent's "
        "`kubenpu_jobs_total`, the one-liner's `@done` for the pod's cgroup. The one-liner:\n\n"
        f"```\n{j['program']}\n```\n\n"
        f"The agent's jobs probe said {said}"
        + ("" if attached else " (**not attached**)")
        + ".\n\n"
        + table(["arm", "jobs/s", "CPU", "CPU s per M jobs", "jobs counted / issued"], rows)
        + "\n\n#### Paired by round\n\n"
        "jobs/s of the first arm over the second's in the same round: the median over rounds "
        "[lowest, highest].\n\n" + table(["arms", "jobs/s ratio"], ratios)
    )


GUARD_CALLS = (("open_close", "open + close"), ("drm", "DRM ioctl"), ("tcgets", "TCGETS"))
GUARD_CALLS += (("fifo", "FIONREAD on a FIFO"),)


def _added(rounds: list[tuple[float, ...]]) -> float:
    return statistics.fmean(arm - none for arm, none in rounds)


def _allowed_cell(rec: dict) -> str:
    """The guard's `allowed` counts against the opens and DRM ioctls issued, over every round;
    "-" for no guard. A shortfall means a call the program did not see as allowed."""
    if not rec["issued"]:
        return "-"
    cells = []
    for op in ("open", "ioctl"):
        counted = sum(c[op] for c in rec["counted"])
        issued = sum(i[op] for i in rec["issued"])
        short = f" (**{issued - counted} not allowed**)" if counted != issued else ""
        cells.append(f"{op} {counted} / {issued}{short}")
    return ", ".join(cells)


def guard(b: dict) -> str:
    """The access guard's row (bench_guest.py guard()): ns per call under each arm, and what
    each mode adds to no guard, round by round, with a 95 % interval."""
    gd = b["guard"]
    arms = gd["arms"]
    none = arms["none"]
    calls = [(c, name) for c, name in GUARD_CALLS if c in none]  # KUBENPU_BENCH_GUARD_CALLS
    rows = []
    for arm, rec in arms.items():
        row = [arm if arm != "none" else "none (no guard)"]
        for call, _ in calls:
            row.append(f"{statistics.median(rec[call]):.0f}")
            if arm == "none":
                row.append("")
                continue
            added, low, high = bootstrap(list(zip(rec[call], none[call], strict=True)), _added)
            row.append(f"{added:+.0f} [{low:+.0f}, {high:+.0f}]")
        rows.append([*row, _allowed_cell(rec)])
    head = ["arm"]
    for _, name in calls:
        head += [f"{name} ns/call", "added [95 %]"]
    clean = (
        "every arm started with no guard program of an earlier arm loaded"
        if not gd["leftovers"]
        else f"arms started beside a leftover: {gd['leftovers']}"
    )
    return (
        "### The access guard: cost per call, paired by round (docs/guard.md)\n\n"
        f"{gd['rounds']} rounds, each starting every arm afresh in an order reversed every other "
        f"round; an arm's figure in a round is the median of {gd['loops_per_round']} tight loops "
        f"of {gd['open_loop_calls']} opens + closes of vgem's card and of {gd['loop_calls']} "
        "calls of DRM_IOCTL_MODE_CREATE_DUMB on it, from one pod's cgroup (the pod is allocated "
        "the card: the guard's allowed path, for an ioctl only with `ioctl: true`), of TCGETS on "
        "a pty (a char device the guard does not guard) and of FIONREAD on a FIFO (no device at "
        "all), those measured; audit and enforce hook file_open and file_receive only. Medians "
        "over rounds; added: the mean over rounds of (arm - no guard) in the same round, 95 % "
        "bootstrap interval over rounds (one that holds 0 is no cost this run can tell). "
        "Allowed: the guard's own counts against the calls issued; "
        f"{clean}.\n\n" + table([*head, "allowed / issued"], rows)
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
    if "telemetry_read_ms" in m:  # figures measured before device telemetry lack it
        what = "one telemetry read, every device of the 5 fixture machines (sysfs/hwmon)"
        fdinfo.append([what, m["telemetry_read_ms"]])
    return (
        f"### Host micro-benchmark (Python {m['python']}, no VM)\n\n"
        + table(["user-space path", "ns"], rows)
        + "\n\n"
        + table(["fdinfo (synthetic /proc tree)", "ms"], fdinfo)
    )


def cpu_points(mode: dict) -> tuple[list[float], list[float]]:
    """(achieved calls/s, agent CPU % of a vCPU): idle, then each window of the Agent CPU table."""
    rates = [0.0] + [float(w["rate"]) for w in mode["windows"]]
    cpu = [mode["idle_cpu_per_second"]] + [w["cpu_per_second"] for w in mode["windows"]]
    return rates, [c * 100 for c in cpu]


def plot(bench: dict, png: Path) -> None:
    """The Agent CPU table's numbers as a picture (docs/performance.md shows it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for mode in MODES:
        rates, cpu = cpu_points(bench["modes"][mode])
        ax.plot([r / 1000 for r in rates], cpu, marker="o", label=f"{mode} mode")
    ax.set_xlabel("achieved calls/s (thousands); 0 = idle")
    ax.set_ylabel("agent CPU, % of one vCPU")
    ax.set_title(f"Agent CPU vs call rate, kernel {bench['kernel']}, QEMU TCG", loc="left")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=90)
    plt.close(fig)


def render(bench: dict, micro_figures: dict | None) -> str:
    parts = [f"## KubeNPU benchmark: kernel {bench['kernel']}, {bench['cpus']} vCPUs (QEMU TCG)"]
    if "modes" in bench:  # not with bench_guest.py --hooks
        parts[0] += f", max ~{bench['max_rate']} calls/s with no agent"
        parts += [cost(bench), cpu(bench), exactness(bench), start_memory(bench)]
        if "bpftrace" in bench:
            parts.append(floor(bench))
    if "rounds" in bench:
        parts.append(per_call(bench))
    if "sources" in bench:
        parts.append(sources(bench))
    if "idle_pods" in bench:
        parts.append(idle_pods(bench))
    if "restart" in bench:
        parts.append(restart(bench))
    if "jobs" in bench:
        parts.append(jobs(bench))
    if "guard" in bench:
        parts.append(guard(bench))
    if micro_figures:
        parts.append(micro(micro_figures))
    return "\n\n".join(parts) + "\n"


def images(text: str) -> str:
    """scripts/image.sh's size line per variant: `<variant>: <ref>: <size> unpacked, ...`."""
    rows = [line.split(": ", 2) for line in text.splitlines() if line.count(": ") >= 2]
    return "\n### The image (docs/core.md)\n\n" + table(
        ["variant", "image", "size"], [[v, f"`{ref}`", size] for v, ref, size in rows]
    )


def _option(argv: list[str], name: str) -> tuple[Path | None, list[str]]:
    if name not in argv:
        return None, argv
    at = argv.index(name)
    return Path(argv[at + 1]), argv[:at] + argv[at + 2 :]


def main(argv: list[str]) -> int:
    png, argv = _option(argv, "--plot")
    sizes, argv = _option(argv, "--images")
    bench = json.loads(Path(argv[0]).read_text())
    micro_figures = json.loads(Path(argv[1]).read_text()) if len(argv) > 1 else None
    sys.stdout.write(render(bench, micro_figures))
    if sizes is not None and sizes.exists():
        sys.stdout.write(images(sizes.read_text()))
    if png:
        plot(bench, png)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
