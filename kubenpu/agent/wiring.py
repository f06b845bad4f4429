"""The agent wired in one place, in data-flow order: discovery, the series table and the
exporters that read it, the resolver, the calls' attribution, the sources of
kubenpu.sources.registry, the kernel side and its probe; each registered with the Services group
as it starts.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Iterable
from functools import partial

from kubenpu import config, export
from kubenpu.agent.health import Health
from kubenpu.agent.loop import STALE_AFTER, Agent
from kubenpu.discovery import Device, discover, not_ignored
from kubenpu.kernel.base import Loader
from kubenpu.kernel.loader import loaders, open_kernel
from kubenpu.metrics.inputs import DeviceRow
from kubenpu.metrics.own import CRI, DEVICES, EXHAUSTED, INDEX_REBUILT
from kubenpu.resolve.resolver import Resolver
from kubenpu.services import Services
from kubenpu.sources import registry
from kubenpu.sources.activity import Activity
from kubenpu.sources.base import Born, Closes, Node, Runs, Source
from kubenpu.sources.calls.attribution import Attributor, placed
from kubenpu.sources.calls.events import Tally
from kubenpu.sources.calls.probe import Probe
from kubenpu.sources.registry import table
from kubenpu.vendors import Kind, by_name, core

log = logging.getLogger("kubenpu")


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
    for dev in devices:
        if dev.vendor and not placed(dev):
            log.info(
                "device %s has no NUMA node (numa_node %s): its calls are not counted as remote "
                "or local, and kubenpu_ioctl_remote_node_total has no series for it",
                dev.id,
                dev.numa_node,
            )


def _numa(dev: Device) -> str:
    return "" if dev.numa_node is None else str(dev.numa_node)


def build(
    cfg: config.Config, services: Services, debug: bool = False, trace: bool = False
) -> Agent:
    """The agent with its real collaborators: the exporters, the CRI resolver, the calls'
    attribution, the registered sources, the kernel side. Each is registered with `services`
    as it starts, so a later one that fails stops them."""
    found = discover(cfg.discovery.root)
    devices = select_devices(found, cfg.discovery.ignore_devices)
    _log_tables(devices)
    health = Health(STALE_AFTER)
    metrics = table(cfg.metrics.series_ttl_seconds, cfg.metrics.max_series)
    rows = [
        DeviceRow(d.id, d.vendor or "", d.driver or "", d.pci_id or "", _numa(d)) for d in devices
    ]
    metrics.set(DEVICES, cfg.node_name, rows)
    exporters = export.start(cfg, metrics, health)
    services.add("exporters", exporters.shutdown)
    cri = cfg.attribution.cri
    answered = threading.Event()
    resolver = Resolver(
        cgroup_root=cfg.attribution.cgroup_root,
        cri_endpoint=cri.endpoint,
        cri_timeout=cri.timeout_seconds,
        cri_retry_after=cri.retry_after_seconds,
        on_rebuild=lambda: metrics.set(INDEX_REBUILT, "", 1),
        on_cri_request=lambda seconds, ok: metrics.set(CRI, "", (seconds, ok)),
        on_answer=answered.set,
        on_exhausted=partial(metrics.set, EXHAUSTED),
        concurrency=cri.concurrency,
    )
    services.add("resolver", resolver.close)
    tally = Tally(cfg.probe.queue_size, keep_events=trace)
    # Allocations' signals of use, fed by attribution and usage while allocations run.
    activity = None
    if cfg.attribution.pod_resources.enabled:
        activity = Activity(cfg.metrics.series_ttl_seconds)
    attributor = Attributor(
        devices,
        resolver,
        metrics,
        sys.stdout if trace else None,
        pending_seconds=cfg.attribution.pending_seconds,
        activity=activity,
        cri_endpoint=cri.endpoint,
    )
    watched = not_ignored(found, cfg.discovery.ignore_devices)
    node = Node(cfg, metrics, found, watched, resolver, attributor, activity)
    sources = registry.build(node)
    kernel = open_kernel(_loaders(cfg.probe, devices, debug), devices, cfg.probe.pin_dir)
    # After the probe: a start that fails stops before the sources' threads, in one line.
    start(sources, services, health)
    # A new cgroup is indexed on the polling thread at once: it may be gone by the next flush.
    probe = Probe(kernel, tally, on_births=partial(births, resolver, sources))
    services.add("probe", probe.close)
    return Agent(
        probe=probe,
        tally=tally,
        attributor=attributor,
        sources=sources,
        interval=cfg.fdinfo.interval_seconds,
        answered=answered,
        metrics=metrics,
        resolver=resolver,
        health=health,
        devices=len(devices),
    )


def _loaders(p: config.ProbeConfig, devices: list[Device], debug: bool) -> list[Loader]:
    return loaders(
        devices,
        loader=p.loader,
        mode=p.mode,
        hook=p.hook,
        attach=p.attach,
        ringbuf_pages=p.ringbuf_pages,
        durations=p.durations,
        durations_exit=p.durations_exit,
        debug=debug,
    )


def births(resolver: Resolver, sources: Iterable[Source], born: list[tuple[int, int]]) -> None:
    """New cgroups to the resolver's index, then to the sources that act on a birth (the
    access guard's look for a new pod)."""
    resolver.cgroups_born(born)
    for source in sources:
        if isinstance(source, Born):
            source.born(born)


def start(sources: Iterable[Source], services: Services, health: Health) -> None:
    """Every source's stop registered, then each source with a thread of its own started and
    watched by its name (one that did not start said why)."""
    sources = list(sources)
    for source in sources:
        if isinstance(source, Closes):
            services.add(source.name, source.close)
    for source in sources:
        if isinstance(source, Runs) and (worker := source.start()) is not None:
            health.watch(worker)
