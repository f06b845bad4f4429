"""kubenpuctl: show what the agent would count, from sysfs, /proc and the vendor plug-ins.

Needs no privileges, no BCC and nothing outside the standard library, so that a plain
`pip install kubenpu` gives a working command.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn, TypeVar

from kubenpu import __version__
from kubenpu.cli import top as kubenpu_top
from kubenpu.cli.top import contention, guard, latency, placement
from kubenpu.cli.top.frames import pod_name
from kubenpu.discovery import Device, discover
from kubenpu.metrics.catalogue import DEVICE_ERRORS, FREQUENCY, POWER, TEMPERATURE, Spec
from kubenpu.resolve import DEFAULT_ENDPOINT, Attribution, containers
from kubenpu.sources.fdinfo import Client, FdinfoReader
from kubenpu.sources.sysfs import Reading, health, read_device
from kubenpu.text import iec_bytes, printable
from kubenpu.vendors import Vendor, all_vendors, by_name, core, for_driver

PROG = "kubenpuctl"
METRICS_URL = "http://localhost:8080/metrics"  # the agent's, on its own node
T = TypeVar("T")
_CRI_SECONDS = 2.0


class UsageError(Exception):
    """A one-line error for the user; exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, not argparse's usage dump: errors from this tool are always one line.
        raise UsageError(f"{message} (see {PROG} --help)")


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(format=f"{PROG}: warning: %(message)s", level=logging.WARNING)
    try:
        args = _parser().parse_args(argv)
        out = args.run(args)
        if out is not None:  # the live `top` view prints nothing when it ends
            print(out)
    except UsageError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except SystemExit as e:  # --help and --version
        return int(e.code or 0)
    except BrokenPipeError:
        # The reader went away (`kubenpuctl ioctls | head`): stop quietly, and keep the
        # interpreter from failing again when it flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Show what the KubeNPU agent would count.")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    commands = parser.add_subparsers(title="commands", required=True, metavar="COMMAND")

    devices = commands.add_parser("devices", help="list DRM and accel devices from sysfs")
    devices.add_argument(
        "--root", default="/", help="read DIR/sys and DIR/dev instead of /sys and /dev"
    )
    devices.add_argument("--output", "-o", choices=("table", "json"), default="table")
    devices.set_defaults(run=_devices)

    clients = commands.add_parser("clients", help="list DRM clients and their usage from /proc")
    clients.add_argument(
        "--root", default="/", help="read DIR/proc and DIR/sys instead of /proc and /sys"
    )
    clients.add_argument(
        "--cri",
        metavar="ENDPOINT",
        help=f"the container runtime's CRI socket, to name the pods (default {DEFAULT_ENDPOINT}"
        ", when it exists)",
    )
    clients.add_argument("--output", "-o", choices=("table", "json"), default="table")
    clients.set_defaults(run=_clients)

    ioctls = commands.add_parser("ioctls", help="list the ioctls that are counted")
    ioctls.add_argument("vendor", nargs="?", metavar="VENDOR", help="only this vendor (or drm)")
    ioctls.add_argument("--output", "-o", choices=("table", "tsv", "json"), default="table")
    ioctls.set_defaults(run=_ioctls)
    _top_parser(commands)
    _latency_parser(commands)
    _contention_parser(commands)
    _placement_parser(commands)
    _guard_parser(commands)
    _allocations_parser(commands)
    return parser


def _latency_parser(commands: argparse._SubParsersAction) -> None:
    latency = commands.add_parser(
        "latency", help="one pod's call durations and errors, from an agent's /metrics"
    )
    latency.add_argument("pod", metavar="NAMESPACE/POD", help="the pod, e.g. ml/trainer-0")
    _url_option(latency)
    latency.add_argument("--output", "-o", choices=("table", "json"), default="table")
    latency.set_defaults(run=_latency)


def _latency(args: argparse.Namespace) -> str:
    namespace, slash, pod = args.pod.partition("/")
    if not (slash and namespace and pod):
        raise UsageError(f"{args.pod!r} is not NAMESPACE/POD")
    found = _fetched(lambda: latency.read(args.url, namespace, pod))
    if args.output == "json":
        return json.dumps([h.as_json() for h in found], indent=2)
    return latency.render(found, namespace, pod)


def _contention_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "contention", help="who waited behind whom on one device, from an agent's /metrics"
    )
    parser.add_argument("device", metavar="DEVICE", help="the device id, e.g. 0000:03:00.0")
    _url_option(parser)
    _window_option(parser, "the wait")
    parser.add_argument("--output", "-o", choices=("table", "json"), default="table")
    parser.set_defaults(run=_contention)


def _window_option(parser: argparse.ArgumentParser, what: str) -> None:
    _seconds_option(
        parser,
        "--window",
        parse=_window,
        default=10.0,
        help=f"{what} between two reads that many seconds apart (default 10; 0: the totals "
        "since the agent started)",
    )


def _window(text: str) -> float:
    return 0.0 if text.strip() in ("0", "0.0") else _seconds(text)


def _contention(args: argparse.Namespace) -> str:
    found = _fetched(lambda: contention.read(args.url, args.device, args.window))
    if args.output == "json":
        return json.dumps([p.as_json() for p in found.pairs], indent=2)
    if not found.exported:  # a bare header reads like a failure to read
        return (
            f"{found.device}: no GPU job waits exported for it (the agent's probe.jobs is off, "
            "or no job was ever queued on its rings: docs/jobs.md)"
        )
    if not found.pairs:
        since = f"in the last {args.window:g} s" if args.window else "since the agent started"
        return f"{found.device}: no GPU job waited in its queues {since}"
    rows = [
        [
            pod_name(p.namespace, p.pod),
            p.ring,
            p.behind,
            f"{p.seconds:.3f}",
            f"{100 * p.share:.0f}%",
        ]
        for p in found.pairs
    ]
    return _table(["WAITER", "RING", "BEHIND", "SECONDS", "SHARE"], rows)


def _placement_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "placement",
        help="which pods call a device from CPUs on another NUMA node, and the fix",
    )
    _url_option(parser)
    parser.add_argument("--root", default="/", help="read DIR/sys (the CPUs) instead of /sys")
    _window_option(parser, "the calls")
    parser.add_argument("--output", "-o", choices=("table", "json"), default="table")
    parser.set_defaults(run=_placement)


def _placement(args: argparse.Namespace) -> str:
    found = _fetched(lambda: placement.read(args.url, Path(args.root), args.window))
    if args.output == "json":
        return json.dumps([r.as_json() for r in found], indent=2)
    if not found:  # a bare header reads like a failure to read
        return (
            "no remote calls counted: no device has a NUMA node (kubenpuctl devices), or the "
            "agent runs in events mode (docs/placement.md)"
        )
    rows = [
        [
            pod_name(r.namespace, r.pod),
            r.device,
            "-" if r.numa_node is None else str(r.numa_node),
            f"{100 * r.share:.0f}%",
            f"{r.calls:g}",
            r.device_cpus or "-",
            r.pod_cpus or "-",
            r.qos or "-",
            r.fix,
        ]
        for r in found
    ]
    header = ["POD", "DEVICE", "NODE", "REMOTE", "CALLS", "DEVICE CPUS", "POD CPUS", "QOS", "FIX"]
    return _table(header, rows)


def _guard_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "guard", help="the access guard's policy per pod and device, and its denials"
    )
    _url_option(parser)
    parser.add_argument("--output", "-o", choices=("table", "json"), default="table")
    parser.set_defaults(run=_guard)


def _guard(args: argparse.Namespace) -> str:
    found = _fetched(lambda: guard.read(args.url))
    if args.output == "json":
        return json.dumps([r.as_json() for r in found.rows], indent=2)
    if not found.exported:
        return (
            "the access guard is off on this agent (guard.mode: off, or no BPF LSM: docs/guard.md)"
        )
    table = _table(
        ["POD", "DEVICE", "MODE", "ACCESS", "DENIED"],
        [
            [
                pod_name(r.namespace, r.pod),
                r.device,
                r.mode,
                r.access or "-",
                ", ".join(f"{op} {n}" for op, n in sorted(r.denied.items())) or "-",
            ]
            for r in found.rows
        ],
    )
    unchecked = ", ".join(f"{d} {op} {why} {n}" for (d, op, why), n in found.unchecked.items() if n)
    return table + (f"\nlet through unchecked: {unchecked}" if unchecked else "")


def _allocations_parser(commands: argparse._SubParsersAction) -> None:
    from kubenpu.resolve.podresources import DEFAULT_SOCKET

    alloc = commands.add_parser(
        "allocations", help="each pod's allocated devices, from the kubelet's PodResources API"
    )
    alloc.add_argument("--socket", default=DEFAULT_SOCKET, help="the kubelet's PodResources socket")
    alloc.add_argument("--root", default="/", help="read DIR/sys instead of /sys for the mapping")
    alloc.add_argument("--output", "-o", choices=("table", "json"), default="table")
    alloc.set_defaults(run=_allocations)


def _top_parser(commands: argparse._SubParsersAction) -> None:
    top = commands.add_parser("top", help="live call rates per pod, container and device")
    source = top.add_mutually_exclusive_group()
    _url_option(source, "one agent's /metrics (default)")
    source.add_argument(
        "--prometheus", metavar="URL", help="a Prometheus query API: every node, with rate()"
    )
    _seconds_option(
        top, "--window", default=60.0, help="--prometheus: the rate() window (default 60)"
    )
    _seconds_option(top, "--interval", "-n", default=2.0, help="seconds between reads (default 2)")
    top.add_argument("--once", action="store_true", help="read twice, print one frame, exit")
    top.add_argument(
        "--output", "-o", choices=("table", "json"), default="table", help="json implies --once"
    )
    top.add_argument(
        "--sort",
        choices=tuple(kubenpu_top.SORTS),
        default="total",
        metavar="COLUMN",
        help=f"sort by: {', '.join(kubenpu_top.SORTS)} (default total; keys in the view)",
    )
    top.set_defaults(run=_top)


def _url_option(
    parser: argparse.ArgumentParser | argparse._MutuallyExclusiveGroup,
    help: str = "the agent's /metrics (default)",
) -> None:
    parser.add_argument("--url", default=METRICS_URL, help=help)


def _seconds_option(
    parser: argparse.ArgumentParser,
    *flags: str,
    default: float,
    help: str,
    parse: Callable[[str], float] | None = None,
) -> None:
    parser.add_argument(
        *flags, type=parse or _seconds, default=default, metavar="SECONDS", help=help
    )


def _fetched(read: Callable[[], T]) -> T:
    """What `read` returns; its TopError (no agent there, or an answer it cannot read) is the
    user's to fix, said without a traceback."""
    try:
        return read()
    except kubenpu_top.TopError as e:
        raise UsageError(str(e)) from None


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0.1 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds in 0.1..3600")
    return value


def _top(args: argparse.Namespace) -> str | None:
    source: kubenpu_top.Source = (
        kubenpu_top.PrometheusSource(args.prometheus, args.window)
        if args.prometheus
        else kubenpu_top.ScrapeSource(args.url)
    )
    try:
        if args.once or args.output == "json":
            # A table for a person fits their terminal; for a pipe it is never cut.
            width = shutil.get_terminal_size().columns if sys.stdout.isatty() else 10**6
            return kubenpu_top.once(source, args.interval, args.output, args.sort, width)
        if not sys.stdout.isatty():
            raise UsageError("the live view needs a terminal; use --once for scripts")
        kubenpu_top.live(source, args.interval, args.sort)
    except kubenpu_top.TopError as e:
        raise UsageError(str(e)) from None
    return None


def _devices(args: argparse.Namespace) -> str:
    if not (Path(args.root) / "sys").is_dir():
        raise UsageError(f"{args.root}: no sys directory to read")
    devices = discover(args.root)
    now = {d.id: Summary.of(read_device(d, args.root)) for d in devices}
    if args.output == "json":
        return json.dumps([_device_json(d, now[d.id]) for d in devices], indent=2)
    if not devices:  # a bare header reads like a failure to read
        return (
            f"no DRM or accel device under {Path(args.root) / 'sys/class'} (drm, accel): no GPU "
            "or NPU driver is loaded, or this is not the node's /sys"
        )
    rows = [
        [
            d.driver or "-",
            d.pci_id or "-",
            d.id,
            ",".join(f"{n.major}:{n.minor}" for n in d.nodes),
            "-" if d.numa_node is None else str(d.numa_node),
            d.vendor or "-",
            _unit(now[d.id].power_watts, "W"),
            _unit(now[d.id].temperature_celsius, "°C"),
            _unit(now[d.id].frequency_mhz, "MHz"),
            now[d.id].health,
        ]
        for d in devices
    ]
    header = ["DRIVER", "PCI ID", "ADDRESS", "MAJOR:MINOR", "NUMA", "VENDOR", "POWER", "TEMP"]
    return _table([*header, "FREQ", "HEALTH"], rows)


@dataclass(frozen=True)
class Summary:
    """What `kubenpuctl devices` shows of a reading: the first sensor of each kind."""

    power_watts: float | None
    temperature_celsius: float | None
    frequency_mhz: float | None
    uncorrected: int | None  # None: the driver publishes no error counts
    health: str  # hw.state by its rule, but for wedged: that takes the agent's uevents

    @classmethod
    def of(cls, reading: Reading) -> Summary:
        def first(spec: Spec, **attrs: str) -> float | None:
            found = (v for s, a, v in reading.values if s is spec and attrs.items() <= a.items())
            return next(found, None)

        freq = first(FREQUENCY, state="actual")
        counted = first(DEVICE_ERRORS) is not None
        return cls(
            first(POWER),
            first(TEMPERATURE),
            None if freq is None else freq / 1e6,
            reading.uncorrected if counted else None,
            health(reading),
        )


def _unit(value: float | None, unit: str) -> str:
    return "-" if value is None else f"{value:.0f} {unit}"


def _device_json(d: Device, now: Summary) -> dict[str, object]:
    return {
        "power_watts": now.power_watts,
        "temperature_celsius": now.temperature_celsius,
        "frequency_mhz": now.frequency_mhz,
        "health": now.health,
        "uncorrected_errors": now.uncorrected,
        "driver": d.driver,
        "pci_id": d.pci_id,
        "address": d.id,
        "nodes": [f"{n.major}:{n.minor}" for n in d.nodes],
        "vendor": d.vendor,
        "numa_node": d.numa_node,
        "paths": [n.path for n in d.nodes],
    }


def _clients(args: argparse.Namespace) -> str:
    root = Path(args.root)
    if not (root / "proc").is_dir():
        raise UsageError(f"{args.root}: no proc directory to read")
    scan = FdinfoReader(discover(root), root).scan()
    if scan.skipped:
        counts = ", ".join(f"{reason} {n}" for reason, n in sorted(scan.skipped.items()))
        logging.warning("skipped (see docs/fdinfo.md): %s", counts)
    owners = _owners([c.cgroup for c in scan.clients if c.cgroup], args.cri)
    if args.output == "json":
        return json.dumps(
            [_client_json(c, owners.get(c.cgroup or "")) for c in scan.clients], indent=2
        )
    rows = [
        [
            c.device,
            c.driver,
            str(c.client_id),
            ",".join(map(str, c.pids)),
            _pod_cell(owners.get(c.cgroup or "")),
            _busy(c) or "-",
            _memory(c) or "-",
            c.cgroup or "-",  # last: a kubepods path is long
        ]
        for c in scan.clients
    ]
    return _table(["DEVICE", "DRIVER", "CLIENT", "PIDS", "POD", "BUSY", "MEMORY", "CGROUP"], rows)


@dataclass(frozen=True)
class _Owner:
    """The pod of a client's cgroup: its names when the container runtime answers."""

    pod_uid: str
    container_id: str | None
    names: Attribution | None = None


def _owners(cgroups: list[str], endpoint: str | None) -> dict[str, _Owner]:
    """The pod cgroups among `cgroups`, by path, named through the CRI where it answers."""
    pods = {path: p for path in cgroups if (p := containers.parse(path)) is not None}
    ids = {p.container_id for p in pods.values() if p.container_id}
    named = _cri_names(endpoint) if ids else {}
    return {
        path: _Owner(p.pod_uid, p.container_id, named.get(p.container_id or ""))
        for path, p in pods.items()
    }


def _cri_names(endpoint: str | None) -> dict[str, Attribution]:
    """Every pod container the runtime lists, by id; empty when it cannot answer, with a
    warning when the endpoint was given (the default one is only asked when it exists)."""
    fallback = "pods are named by their cgroup's pod uid"
    try:  # gRPC is an agent extra: a plain `pip install kubenpu` lacks it
        from kubenpu.resolve.cri import CriClient, socket_path
    except ImportError as e:
        if endpoint is not None:
            logging.warning("%s: --cri needs the agent extras (%s)", fallback, e.name)
        return {}
    path = socket_path(endpoint or DEFAULT_ENDPOINT)
    if not os.path.exists(path):
        if endpoint is not None:
            logging.warning("%s: no CRI socket at %s", fallback, path)
        return {}
    # Its warning speaks of retrying, as the agent does; one line here says what it means.
    # The level is put back: a caller in the same process (a test, an embedding) keeps its own.
    cri_log = logging.getLogger("kubenpu.resolve.cri")
    level = cri_log.level
    cri_log.setLevel(logging.ERROR)
    client = CriClient(endpoint or DEFAULT_ENDPOINT, timeout=_CRI_SECONDS)
    try:
        listed = client.containers()
    finally:
        client.close()
        cri_log.setLevel(level)
    if not listed:
        logging.warning("%s: the CRI at %s listed no container (not answering?)", fallback, path)
    return {cid: a for cid, a in listed.items() if a.pod}


def _pod_cell(owner: _Owner | None) -> str:
    if owner is None:
        return "-"
    if owner.names is None:
        return f"uid:{owner.pod_uid}"
    return f"{owner.names.namespace}/{owner.names.pod}/{owner.names.container}"


def _client_json(c: Client, owner: _Owner | None) -> dict[str, object]:
    names = owner.names if owner else None
    return {
        "device": c.device,
        "driver": c.driver,
        "client_id": c.client_id,
        "pids": c.pids,
        "namespace": names.namespace if names else None,
        "pod": names.pod if names else None,
        "container": names.container if names else None,
        "pod_uid": owner.pod_uid if owner else None,
        "container_id": owner.container_id if owner else None,
        "cgroup": c.cgroup,
        "engines": c.engines,
        "memory": {
            region: {f"{k}_bytes": v for k, v in sizes.items()}
            for region, sizes in c.memory.items()
        },
    }


def _busy(c: Client) -> str:
    """Busy time per engine; where the driver counts cycles instead (xe), the busy share of the
    cycles elapsed since the client opened the device, else (msm without totals) the cycles."""
    cells = []
    for name, e in c.engines.items():
        if "busy_ns" in e:
            cells.append(f"{name}={e['busy_ns'] / 1e9:.3f}s")
        elif "cycles" in e:
            total = e.get("total_cycles")
            share = f"{100 * e['cycles'] / total:.1f}%" if total else f"{e['cycles']}cy"
            cells.append(f"{name}={share}")
    return ",".join(cells)


def _memory(c: Client) -> str:
    """Resident bytes per region (total where the driver prints no resident), non-zero only."""
    cells = []
    for region, m in c.memory.items():
        size = m.get("resident", m.get("total", 0))
        if size:
            cells.append(f"{region}={iec_bytes(size)}")
    return ",".join(cells)


def _ioctls(args: argparse.Namespace) -> str:
    vendors = _selected(args.vendor)
    ioctls = [(v.name, i) for v in vendors for i in sorted(v.ioctls, key=lambda i: i.nr)]
    if args.output == "json":
        rows = [{"vendor": v, "nr": i.nr, "kind": i.kind.label, "name": i.name} for v, i in ioctls]
        return json.dumps(rows, indent=2)
    rows = [[v, f"0x{i.nr:02X}", i.kind.label, i.name] for v, i in ioctls]
    if args.output == "tsv":
        return "\n".join("\t".join(r) for r in [["vendor", "nr", "kind", "name"], *rows])
    return _table(["VENDOR", "NR", "KIND", "NAME"], rows)


def _selected(name: str | None) -> tuple[Vendor, ...]:
    if name is None:
        return (core(), *all_vendors())
    vendor = by_name(name) or for_driver(name)  # `devices` shows drivers: intel_vpu is ivpu
    if vendor is None and name.lower().startswith("nvidia"):
        raise UsageError(
            f"{name}: NVIDIA is out of scope: CUDA talks to /dev/nvidia* through nvidia.ko, not "
            "through DRM, so no call of it is counted; use NVIDIA's DCGM exporter (README, "
            "Scope: NVIDIA)"
        )
    if vendor is None:
        known = ", ".join(v.name for v in (core(), *all_vendors()))
        raise UsageError(
            f"unknown vendor or driver {name!r} (vendors: {known}; or a driver "
            "name `devices` shows)"
        )
    return (vendor,)


def _allocations(args: argparse.Namespace) -> str:
    try:  # gRPC is an agent extra: a plain `pip install kubenpu` lacks it
        from kubenpu.resolve.podresources.client import PodResourcesClient, PodResourcesError
    except ImportError as e:
        raise UsageError(
            f"allocations needs the agent extras ({e.name}): pip install 'kubenpu[agent]'"
        ) from None
    from kubenpu.resolve.podresources.mapping import Mapper, Unmapped

    if not os.path.exists(args.socket):  # gRPC would say it in three nested messages
        raise UsageError(
            f"no kubelet PodResources socket at {args.socket}: run this on a node, as root, or "
            "give the kubelet's socket with --socket"
        )
    mapper = Mapper(discover(args.root))
    client = PodResourcesClient(args.socket)
    try:
        found, skipped = client.list()
    except PodResourcesError as e:
        if "UNAVAILABLE" in str(e):  # a socket left by a kubelet that is not running
            raise UsageError(
                f"the kubelet does not answer at {args.socket}: is it running?"
            ) from None
        raise UsageError(str(e)) from None
    finally:
        client.close()
    rows = []
    for a in found:
        device = mapper.device(a.resource, a.id, a.cdi, a.numa)
        unmapped = isinstance(device, Unmapped)
        rows.append(
            {
                "namespace": a.namespace,
                "pod": a.pod,
                "container": a.container,
                "resource": a.resource,
                "id": a.id,
                "pool": a.pool,
                "claim": a.claim,
                "device": None if unmapped else device,
                "unmapped": device.value if unmapped else None,
            }
        )
    for reason, n in skipped.items():
        logging.warning("%d PodResources entries skipped: %s", n, reason)
    if args.output == "json":
        return json.dumps(rows, indent=2)
    return _table(
        ["NAMESPACE", "POD", "CONTAINER", "RESOURCE", "ID", "DEVICE"],
        [
            [
                r["namespace"],
                r["pod"],
                r["container"],
                r["resource"],
                r["id"] or '""',
                r["device"] or f"- ({r['unmapped']})",
            ]
            for r in rows
        ],
    )


def _table(header: list[str], rows: list[list[str]]) -> str:
    """Columns as wide as their widest cell plus two spaces, without trailing blanks. Cells
    come from sysfs, /proc and the runtime: control characters in them are escaped."""
    rows = [[printable(cell) for cell in row] for row in rows]
    widths = [max(len(r[col]) for r in [header, *rows]) for col in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    )


if __name__ == "__main__":
    sys.exit(main())
