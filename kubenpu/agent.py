"""kubenpu-agent: discover devices, attach the probe, attribute calls to pods, export counts."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import time
from collections.abc import Iterable
from typing import TextIO

from kubenpu import __version__, config, export
from kubenpu.discovery import Device, discover
from kubenpu.events import Batch, Birth, Deltas, Key, Tally, route
from kubenpu.metrics import DeviceRow, Metrics
from kubenpu.probe import Probe, ProbeError
from kubenpu.resolve import Resolver
from kubenpu.vendors import Kind, by_name, core

log = logging.getLogger("kubenpu")

_POLL_MS = 100
_FLUSH_SECONDS = 0.5  # first sightings and per-event tallies: new pods resolved at once
# Aggregate mode reads the kernel's counts this often: its cost grows with the number of keys,
# not with the call rate, and scrapes and pushes (15 s by default) see counts at most this old.
_READ_SECONDS = 5.0
_REAP_SECONDS = 5.0


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


def _log_tables(devices: list[Device]) -> None:
    for name in sorted({core().name, *(d.vendor for d in devices if d.vendor)}):
        vendor = by_name(name)
        kinds = ", ".join(f"{k.label}={sum(i.kind == k for i in vendor.ioctls)}" for k in Kind)
        log.info("vendor table %s (%s): %s", name, vendor.header, kinds)


def _numa(dev: Device) -> str:
    return "" if dev.numa_node is None else str(dev.numa_node)


class Attributor:
    """Turns (cgroup id, device, kind) tallies into labelled counts, off the polling thread."""

    def __init__(
        self,
        devices: list[Device],
        resolver: Resolver,
        metrics: Metrics,
        trace: TextIO | None = None,
    ) -> None:
        self._by_node = {(n.major, n.minor): d for d in devices for n in d.nodes}
        self._resolver = resolver
        self._metrics = metrics
        self._trace = trace
        self._seen: dict[int, set[Key]] = {}  # cgroup id -> its keys, until the cgroup is gone

    def flush(self, batch: Batch) -> None:
        # A first sighting is resolved at once, while a short-lived container still exists.
        for cgroup_id in batch.sighted:
            self._resolver.resolve(cgroup_id)
        if batch.received:
            self._metrics.events_received(batch.received)
        if batch.overflow:
            self._metrics.dropped("queue_full", batch.overflow)
        for key, n in batch.counts.items():
            self._count(key, n)
        if self._trace:
            self._print_trace(batch)

    def _print_trace(self, batch: Batch) -> None:
        for ev in batch.events:
            dev = self._by_node.get((ev.major, ev.minor))
            who = self._resolver.resolve(ev.cgroup_id)
            line = {
                "ts_ns": ev.ts_ns,
                "tgid": ev.tgid,
                "cgroup_id": ev.cgroup_id,
                "namespace": who.namespace,
                "pod": who.pod,
                "container": who.container,
                "device": dev.id if dev else f"{ev.major}:{ev.minor}",
                "vendor": dev.vendor if dev else "",
                "nr": f"0x{ev.cmd & 0xFF:02X}",
                "kind": Kind(ev.kind).label,
            }
            print(json.dumps(line), file=self._trace)
        if batch.untraced:
            print(f"# {batch.untraced} events not shown: trace backlog full", file=self._trace)
        self._trace.flush()

    def _count(self, key: Key, n: int) -> None:
        dev = self._by_node.get((key.major, key.minor))
        if dev is None:
            self._metrics.dropped("device_unknown", n)
            return
        who = self._resolver.resolve(key.cgroup_id)
        self._seen.setdefault(key.cgroup_id, set()).add(key)
        if who.reason:
            self._metrics.unattributed(who.reason, n)
        self._metrics.add_calls(
            namespace=who.namespace,
            pod=who.pod,
            container=who.container,
            device=dev.id,
            vendor=dev.vendor or "",
            kind=Kind(key.kind).label,
            n=n,
        )

    def dead_cgroups(self) -> list[int]:
        """Cgroups seen here whose directory is gone."""
        return [c for c in self._seen if not self._resolver.alive(c)]

    def forget(self, cgroup_ids: list[int]) -> list[Key]:
        """Retire dead cgroups' containers and forget them; returns their keys."""
        keys: list[Key] = []
        for cgroup_id in cgroup_ids:
            who = self._resolver.resolve(cgroup_id)
            if who.pod:
                self._metrics.container_gone(who.namespace, who.pod, who.container)
            self._resolver.forget(cgroup_id)
            keys.extend(self._seen.pop(cgroup_id))
        return keys


class Agent:
    """The running agent: one thread polls the kernel, another attributes and counts."""

    def __init__(self, cfg: config.Config, debug: bool = False, trace: bool = False) -> None:
        self.cfg = cfg
        self.devices = select_devices(discover(cfg.discovery.root), cfg.discovery.ignore_devices)
        _log_tables(self.devices)
        self.telemetry = export.start(cfg)
        self.metrics = self.telemetry.metrics
        self.metrics.set_devices(
            DeviceRow(d.id, d.vendor or "", d.driver or "", d.pci_id or "", _numa(d))
            for d in self.devices
        )
        cri = cfg.attribution.cri
        self.resolver = Resolver(
            cgroup_root=cfg.attribution.cgroup_root,
            cri_endpoint=cri.endpoint,
            cri_timeout=cri.timeout_seconds,
            cri_retry_after=cri.retry_after_seconds,
            on_rebuild=self.metrics.index_rebuilt,
            on_cri_request=self.metrics.cri_request,
        )
        self.aggregate = cfg.probe.mode == "aggregate"
        self.tally = Tally(cfg.probe.queue_size, keep_events=trace)
        self.deltas = Deltas()
        self.probe = Probe(
            self.devices,
            mode=cfg.probe.mode,
            attach=cfg.probe.attach,
            ringbuf_pages=cfg.probe.ringbuf_pages,
            debug=debug,
        )
        self.attributor = Attributor(
            self.devices, self.resolver, self.metrics, sys.stdout if trace else None
        )
        self.stop = threading.Event()
        self._reported_drops: dict[str, int] = {}

    def run(self) -> int:
        log.info("container runtime: %s", self.resolver.runtime_version() or "unreachable")
        on_call = self.tally.add_sighting if self.aggregate else self.tally.add_event
        mode = self.probe.start(route(on_call, self._born))
        log.info(
            "attached to drm_ioctl (mode %s, %s); counting %d device(s)",
            mode,
            self.cfg.probe.mode,
            len(self.devices),
        )
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stop.set())
        worker = threading.Thread(target=self._attribute_loop, daemon=True)
        worker.start()
        while not self.stop.is_set():
            self.probe.poll(_POLL_MS)
        worker.join()
        self._collect()  # the last calls before exit
        self.probe.close()
        self.telemetry.shutdown()
        return 0

    def _born(self, birth: Birth) -> None:
        # On the polling thread, at once: the cgroup may be removed before the next flush.
        self.resolver.cgroup_born(birth.cgroup_id, birth.parent_id)

    def _attribute_loop(self) -> None:
        last_read = last_reap = time.monotonic()
        while not self.stop.wait(_FLUSH_SECONDS):
            now = time.monotonic()
            read = self.aggregate and now - last_read >= _READ_SECONDS
            self._collect(read_counts=read)
            last_read = now if read else last_read
            if now - last_reap >= _REAP_SECONDS:
                self._reap()
                last_reap = now

    def _reap(self) -> None:
        dead = self.attributor.dead_cgroups()
        if not dead:
            return
        # A removed cgroup has no process left, so after this read its counts are final and
        # forgetting it (here and in the kernel map) loses no call.
        self._collect(read_counts=True)
        gone = self.attributor.forget(dead)
        if self.aggregate:
            self.probe.forget_counts(gone)
            self.deltas.forget(gone)

    def _collect(self, read_counts: bool = True) -> None:
        if self.aggregate and read_counts:
            self.deltas.feed(self.probe.read_counts(), self.tally)
        for reason, total in self.probe.kernel_drops().items():
            new = total - self._reported_drops.get(reason, 0)
            if new > 0:
                self.metrics.dropped(reason, new)
                self._reported_drops[reason] = total
        self.attributor.flush(self.tally.drain())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kubenpu-agent", description=__doc__)
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
    parser.add_argument("--version", action="version", version=__version__)
    args = parser.parse_args(argv)
    if args.check_config:
        return config.check_config(args.check_config)
    try:
        cfg = config.load(args.config)
    except config.ConfigError as err:
        for problem in err.problems:
            print(f"kubenpu-agent: {problem}", file=sys.stderr)
        return 2
    level = logging.DEBUG if args.debug else getattr(logging, cfg.log_level.upper())
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if args.trace:
            cfg.probe.mode = "events"
        return Agent(cfg, args.debug, args.trace).run()
    except (ProbeError, export.ExportError) as err:
        log.error("%s", err)
        return 2


if __name__ == "__main__":
    sys.exit(main())
