"""kubenpu-agent: discover devices, attach the probe, attribute calls to pods, export counts.

Two workers: the `poll` thread moves ring-buffer records into the Tally; the `attribution` thread
reads the kernel's counters, attributes the Tally's counts to pods and reaps dead cgroups. No
exception stops either: each iteration is guarded, and Health reports a worker that died anyway.
"""

from __future__ import annotations

import argparse
import logging
import resource
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from kubenpu import __version__
from kubenpu.discovery import Device, discover
from kubenpu.events import Tally
from kubenpu.fdinfo import FdinfoReader
from kubenpu.kernel.errors import ProbeError
from kubenpu.kernel.loader import open_kernel
from kubenpu.kernel.pinned import uninstall
from kubenpu.probe import Probe
from kubenpu.services import Services
from kubenpu.vendors import Kind, by_name, core

try:  # `pip install kubenpu` (kubenpuctl only) lacks these: main() says so in one line
    from kubenpu import config, export
    from kubenpu.attribution import Attributor
    from kubenpu.metrics.inputs import DeviceRow
    from kubenpu.metrics.store import Metrics
    from kubenpu.resolve.resolver import Resolver
    from kubenpu.telemetry import Telemetry
    from kubenpu.usage import Usage
except ModuleNotFoundError as exc:
    if (exc.name or "").startswith("kubenpu"):
        raise
    _MISSING_EXTRAS: ModuleNotFoundError | None = exc
else:
    _MISSING_EXTRAS = None

log = logging.getLogger("kubenpu")

_POLL_MS = 100
_FLUSH_SECONDS = 0.5  # first sightings and per-event tallies: new pods resolved at once
# A CRI answer for held counts starts a flush before _FLUSH_SECONDS, at most this often: the
# answers that come meanwhile are taken by the same flush.
_ANSWERS_EVERY_SECONDS = 0.1
# Aggregate mode reads the kernel's counts this often: its cost grows with the number of keys,
# not with the call rate, and scrapes and pushes (15 s by default) see counts at most this old.
_READ_SECONDS = 5.0
_REAP_SECONDS = 5.0
# Liveness fails when the kernel's counters were last read longer ago than this many reads.
_STALE_READS = 3
# Stopping the probe, the CRI lookups and the exporters (a final OTLP push) together takes at
# most this long: within Kubernetes' default 30 s grace period before SIGKILL.
_STOP_SECONDS = 25.0
# The workers finish their step within this after the stop signal, or are left behind (daemon
# threads): with the 1 s the main loop takes to notice and _STOP_SECONDS, exit takes <= 29 s.
_JOIN_SECONDS = 3.0


def select_devices(devices: Iterable[Device], ignore: Iterable[str]) -> list[Device]:
    """Devices the probe will count: those with a vendor plug-in and not ignored by config."""
    ignored = set(ignore)
    chosen = []
    for dev in devices:
        nodes = ",".join(f"{n.major}:{n.minor}" for n in dev.nodes)
        if dev.vendor is None or dev.id in ignored:
            why = "ignored by config" if dev.id in ignored else "no vendor plug-in"
            log.info(
                "device %s driver=%s nodes=%s: not counted (%s)", dev.id, dev.driver, nodes, why
            )
            continue
        log.info(
            "device %s driver=%s pci_id=%s numa=%s nodes=%s vendor=%s",
            dev.id,
            dev.driver,
            dev.pci_id,
            dev.numa_node,
            nodes,
            dev.vendor,
        )
        chosen.append(dev)
    return chosen


def fdinfo_devices(devices: Iterable[Device], ignore: Iterable[str]) -> list[Device]:
    """Devices whose DRM clients fdinfo reads: every one not ignored by config. A driver without
    a vendor plug-in has no ioctl table to count, but may still print usage stats."""
    ignored = set(ignore)
    return [d for d in devices if d.id not in ignored]


def _log_tables(devices: list[Device]) -> None:
    for name in sorted({core().name, *(d.vendor for d in devices if d.vendor)}):
        vendor = by_name(name)
        kinds = ", ".join(f"{k.label}={sum(i.kind == k for i in vendor.ioctls)}" for k in Kind)
        log.info("vendor table %s (%s): %s", name, vendor.header, kinds)


def _numa(dev: Device) -> str:
    return "" if dev.numa_node is None else str(dev.numa_node)


class Health:
    """Liveness and readiness for /healthz and /readyz."""

    def __init__(self, stale_after: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._stale_after = stale_after
        self._clock = clock
        self._workers: list[threading.Thread] = []
        self._attached = False
        self._last_read: float | None = None
        self._last_poll: float | None = None

    def watch(self, worker: threading.Thread) -> None:
        self._workers.append(worker)

    def attached(self) -> None:
        self._attached = True

    def kernel_read(self) -> None:
        self._last_read = self._clock()

    def polled(self) -> None:
        """The poll thread is back from a poll: a wedged one, in either mode, stops calling
        this while the attribution thread still reads the kernel's counters."""
        self._last_poll = self._clock()

    def live(self) -> tuple[bool, str]:
        dead = [w.name for w in self._workers if not w.is_alive()]
        if dead:
            return False, f"worker thread stopped: {', '.join(dead)}"
        for what, last in (
            ("kernel counters last read", self._last_read),
            ("ring buffer last polled", self._last_poll),
        ):
            if last is not None and (age := self._clock() - last) > self._stale_after:
                return False, f"{what} {age:.0f} s ago"
        return True, "ok"

    def ready(self) -> tuple[bool, str]:
        if not self._attached:
            return False, "probe not attached yet"
        if self._last_read is None:
            return False, "kernel counters not read yet"
        return True, "ok"


class _Streak:
    """Logs the first failure of a streak and the recovery, not every repeat."""

    def __init__(self, what: str) -> None:
        self._what = what
        self._failures = 0

    def failed(self, exc: BaseException) -> None:
        self._failures += 1
        if self._failures == 1:
            log.error("%s failed (retrying): %s: %s", self._what, type(exc).__name__, exc)

    def ok(self) -> None:
        if self._failures:
            log.info("%s works again after %d failure(s)", self._what, self._failures)
            self._failures = 0


class Agent:
    """The running agent: one thread polls the kernel, another attributes and counts."""

    def __init__(
        self,
        *,
        probe: Probe,
        tally: Tally,
        attributor: Attributor,
        metrics: Metrics,
        resolver: Resolver,
        health: Health,
        devices: int,
        usage: Usage | None = None,
        usage_interval: float = 5.0,
        telemetry: Telemetry | None = None,
        answered: threading.Event | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.probe = probe
        self.tally = tally
        self.attributor = attributor
        self.metrics = metrics
        self.resolver = resolver
        self.health = health
        self._devices = devices
        self.usage = usage
        self._usage_interval = usage_interval
        self.telemetry = telemetry
        self._clock = clock
        self.stop = threading.Event()
        self._answered = answered or threading.Event()  # set by the resolver's on_answer
        self._last_counts = self._last_reap = self._last_usage = -float("inf")
        self._reads = _Streak("reading the kernel's counters")
        self._steps = {
            "poll": _Streak("poll"),
            "attribution": _Streak("attribution"),
            "fdinfo": _Streak("reading fdinfo"),
            "telemetry": _Streak("reading device telemetry"),
        }

    def run(self) -> int:
        """Attach, count until `stop`, then count a last time. Stopping the probe, resolver and
        exporters is the Services group's (build() registered them)."""
        self.attach()
        workers = [
            threading.Thread(target=self._poll_loop, name="poll", daemon=True),
            threading.Thread(target=self._attribute_loop, name="attribution", daemon=True),
        ]
        for worker in workers:
            self.health.watch(worker)
            worker.start()
        # After the workers start: a slow or unreachable runtime must not delay counting.
        log.info("container runtime: %s", self.resolver.runtime_version() or "unreachable")
        while not self.stop.wait(1.0):  # a timeout keeps signal handlers running promptly
            pass
        self._answered.set()  # the attribution thread stops waiting for answers
        stuck = _join(workers, _JOIN_SECONDS)
        if "attribution" in stuck:  # a last cycle would race the wedged one
            log.error(
                "%s did not stop within %g s of the stop signal: exiting without the last "
                "count; the exporters still make their final push",
                ", ".join(stuck),
                _JOIN_SECONDS,
            )
        else:
            self._guarded("attribution", self._last_cycle)
        return 0

    def attach(self) -> None:
        """Load and attach the probe. Raises ProbeError."""
        attach = self.probe.start()
        self.health.attached()
        log.info(
            "probe attached: %s, probe.mode %s; counting %d device(s)",
            attach,
            self.probe.mode,
            self._devices,
        )

    def _poll_loop(self) -> None:
        while not self.stop.is_set():
            if not self._guarded("poll", self.probe.poll, _POLL_MS):
                self.stop.wait(_POLL_MS / 1000)  # a poll that fails at once must not spin
            self.health.polled()

    def _attribute_loop(self) -> None:
        # The first cycle at once: an adopted probe's totals are exported without a wait, and
        # the counts held for a CRI answer as soon as it comes.
        while True:
            self._guarded("attribution", self.cycle)
            self._answered.wait(_FLUSH_SECONDS - _ANSWERS_EVERY_SECONDS)
            self._answered.clear()
            if self.stop.wait(_ANSWERS_EVERY_SECONDS):
                return

    def _guarded(self, worker: str, step: Callable[..., object], *args: object) -> bool:
        try:
            step(*args)
        except Exception as exc:  # no exception may stop counting; it is logged instead
            self._steps[worker].failed(exc)
            return False
        self._steps[worker].ok()
        return True

    def cycle(self) -> None:
        """One attribution step: read the kernel (the counts map every _READ_SECONDS), count
        what the Tally holds, read fdinfo every usage_interval and reap dead cgroups every
        _REAP_SECONDS."""
        now = self._clock()
        counts_due = now - self._last_counts >= _READ_SECONDS
        if self._read(counts_due) and counts_due:
            self._last_counts = now
        self._flush()
        if now - self._last_usage >= self._usage_interval:
            self._last_usage = now
            if self.usage is not None:
                self._guarded("fdinfo", self.usage.read)
            if self.telemetry is not None:  # right after fdinfo: energy splits by its busy time
                busy = self.usage.interval_busy() if self.usage is not None else {}
                self._guarded("telemetry", self.telemetry.read, busy)
        if now - self._last_reap >= _REAP_SECONDS:
            self._reap()
            self._last_reap = now

    def _last_cycle(self) -> None:
        """The calls made since the last cycle, and every held one, before exit."""
        self._read(counts=True)
        self._flush()
        self.attributor.settle_all()

    def _read(self, counts: bool) -> bool:
        try:
            self.probe.read(counts)
        except (ProbeError, OSError) as exc:
            self.metrics.read_error()
            self._reads.failed(exc)
            return False
        self._reads.ok()
        self.health.kernel_read()
        return True

    def _reap(self) -> None:
        dead = self.attributor.dead_cgroups()
        # A removed cgroup has no process left, so after this read its counts are final and
        # forgetting it (here and in the kernel map) loses no call. No read, no forgetting.
        if not dead or not self._read(counts=True):
            return
        self._flush()
        self.probe.forget(self.attributor.forget(dead))

    def _flush(self) -> None:
        batch = self.tally.drain()
        if self.usage is not None:
            self.usage.saw(batch.tgids, {key.cgroup_id for key in batch.counts})
        try:
            self.attributor.flush(batch)
        finally:  # what an exception left uncounted is counted at the next flush
            self.tally.put_back(batch.counts)


def raise_nofile() -> int:
    """Raise the soft descriptor limit to the hard one (a container's soft limit is often
    1,024); the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        log.info("descriptor limit raised from %d to %d", soft, hard)
    return hard


def _join(workers: list[threading.Thread], seconds: float) -> list[str]:
    """Join the workers within `seconds` in all; the names of those still running."""
    deadline = time.monotonic() + seconds
    for worker in workers:
        worker.join(max(0.0, deadline - time.monotonic()))
    return [w.name for w in workers if w.is_alive()]


def build(
    cfg: config.Config, services: Services, debug: bool = False, trace: bool = False
) -> Agent:
    """The agent with its real collaborators: the kernel side, the CRI resolver, the exporters.
    Each is registered with `services` as it starts, so a later one that fails stops them."""
    found = discover(cfg.discovery.root)
    devices = select_devices(found, cfg.discovery.ignore_devices)
    _log_tables(devices)
    health = Health(_STALE_READS * _READ_SECONDS)
    metrics = Metrics(cfg.node_name, cfg.metrics.series_ttl_seconds, cfg.metrics.max_series)
    metrics.set_devices(
        DeviceRow(d.id, d.vendor or "", d.driver or "", d.pci_id or "", _numa(d)) for d in devices
    )
    exporters = export.start(cfg, metrics, health)
    services.add("exporters", exporters.shutdown)
    cri = cfg.attribution.cri
    answered = threading.Event()
    resolver = Resolver(
        cgroup_root=cfg.attribution.cgroup_root,
        cri_endpoint=cri.endpoint,
        cri_timeout=cri.timeout_seconds,
        cri_retry_after=cri.retry_after_seconds,
        on_rebuild=metrics.index_rebuilt,
        on_cri_request=metrics.cri_request,
        on_answer=answered.set,
        on_exhausted=metrics.descriptors_exhausted,
        concurrency=cri.concurrency,
    )
    services.add("resolver", resolver.close)
    tally = Tally(cfg.probe.queue_size, keep_events=trace)
    pending = cfg.attribution.pending_seconds
    attributor = Attributor(
        devices, resolver, metrics, sys.stdout if trace else None, pending_seconds=pending
    )
    usage = None
    if cfg.fdinfo.enabled:
        readable = fdinfo_devices(found, cfg.discovery.ignore_devices)
        usage = Usage(
            FdinfoReader(readable, cfg.discovery.root),
            resolver,
            metrics,
            readable,
            cfg.attribution.cgroup_root,
            pending_seconds=pending,
            on_cgroup=attributor.watch,
            on_exhausted=metrics.descriptors_exhausted,
            clock=time.monotonic,
        )
    telemetry = None
    if cfg.telemetry.enabled:
        telemetry = Telemetry(
            fdinfo_devices(found, cfg.discovery.ignore_devices), metrics, cfg.discovery.root
        )
    if cfg.attribution.pod_resources.enabled:
        _start_allocations(cfg, found, metrics, services)
    p = cfg.probe
    kernel = open_kernel(
        devices,
        pin_dir=p.pin_dir,
        loader=p.loader,
        mode=p.mode,
        hook=p.hook,
        attach=p.attach,
        ringbuf_pages=p.ringbuf_pages,
        debug=debug,
    )
    # A new cgroup is indexed on the polling thread at once: it may be gone by the next flush.
    probe = Probe(kernel, tally, on_births=resolver.cgroups_born)
    services.add("probe", probe.close)
    return Agent(
        probe=probe,
        tally=tally,
        attributor=attributor,
        usage=usage,
        usage_interval=cfg.fdinfo.interval_seconds,
        telemetry=telemetry,
        answered=answered,
        metrics=metrics,
        resolver=resolver,
        health=health,
        devices=len(devices),
    )


def _start_allocations(
    cfg: config.Config, found: list[Device], metrics: Metrics, services: Services
) -> None:
    """The kubelet's allocations, refreshed on their own thread: a dead kubelet never stalls
    counting. Imported here: only an agent with pod_resources enabled needs the module."""
    from kubenpu.allocations import Allocations
    from kubenpu.resolve.podresources.client import PodResourcesClient
    from kubenpu.resolve.podresources.mapping import Mapper

    pr = cfg.attribution.pod_resources
    allocations = Allocations(
        PodResourcesClient(pr.socket, pr.timeout_seconds),
        Mapper(fdinfo_devices(found, cfg.discovery.ignore_devices), cfg.discovery.root),
        metrics,
        pr.interval_seconds,
    )
    services.add("allocations", allocations.close)
    allocations.start()


def _uninstall(root: Path) -> int:
    try:
        n = uninstall(root)
    except OSError as err:
        print(f"kubenpu-agent: cannot remove {root}: {err}", file=sys.stderr)
        return 1
    print(f"kubenpu-agent: removed {n} pinned probe(s) from {root}")
    return 0


def main(argv: list[str] | None = None) -> int:
    if _MISSING_EXTRAS is not None:
        print("kubenpu-agent needs the agent extras: pip install 'kubenpu[agent]'", file=sys.stderr)
        return 2
    parser = argparse.ArgumentParser(prog="kubenpu-agent", description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="/etc/kubenpu/config.yaml", help="YAML config file")
    parser.add_argument(
        "--check-config", metavar="FILE", help="validate FILE, print the effective config"
    )
    parser.add_argument("--debug", action="store_true", help="debug logs and BCC's verifier log")
    parser.add_argument(
        "--trace",
        action="store_true",
        help="print every counted call as a JSON line (switches the probe to events mode)",
    )
    parser.add_argument(
        "--uninstall",
        action="store_true",
        help="remove the probe pinned in probe.pin_dir (detaching it) and exit",
    )
    parser.add_argument("--version", action="version", version=__version__)
    args = parser.parse_args(argv)
    if args.check_config:
        return config.check_config(args.check_config, export.certs.problems)
    try:
        cfg = config.load(args.config)
    except config.ConfigError as err:
        for problem in err.problems:
            print(f"kubenpu-agent: {problem}", file=sys.stderr)
        return 2
    if args.uninstall:
        return _uninstall(Path(cfg.probe.pin_dir)) if cfg.probe.pin_dir else 0
    level = logging.DEBUG if args.debug else getattr(logging, cfg.log_level.upper())
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if args.trace:
            cfg.probe.mode = "events"
        raise_nofile()  # before the metrics server sizes its connection cap from it
        with Services(_STOP_SECONDS) as services:
            agent = build(cfg, services, args.debug, args.trace)
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda *_: agent.stop.set())
            return agent.run()
    except (ProbeError, export.ExportError) as err:
        log.error("%s", err)
        return 2


if __name__ == "__main__":
    sys.exit(main())
