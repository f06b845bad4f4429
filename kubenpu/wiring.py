"""The agent wired: every stage built with its collaborators, in data-flow order (discovery, the
kernel side and probe, the resolver, attribution, fdinfo usage, telemetry, allocations, metrics
and the exporters), each registered with the Services group as it starts.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Iterable

from kubenpu import config, export
from kubenpu.activity import Activity
from kubenpu.attribution import Attributor
from kubenpu.discovery import Device, discover
from kubenpu.events import Tally
from kubenpu.fdinfo import FdinfoReader
from kubenpu.health import Health
from kubenpu.jobs import Jobs
from kubenpu.kernel.jobs import JobsKernel
from kubenpu.kernel.loader import loaders, open_kernel
from kubenpu.loop import STALE_AFTER, Agent
from kubenpu.metrics.inputs import DeviceRow
from kubenpu.metrics.store import Metrics
from kubenpu.probe import Probe
from kubenpu.resolve.cgroups import ProcCgroups
from kubenpu.resolve.resolver import Resolver
from kubenpu.services import Services
from kubenpu.telemetry import Telemetry
from kubenpu.uevents import Wedges
from kubenpu.usage import Usage
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


def build(
    cfg: config.Config, services: Services, debug: bool = False, trace: bool = False
) -> Agent:
    """The agent with its real collaborators: the kernel side, the CRI resolver, the exporters.
    Each is registered with `services` as it starts, so a later one that fails stops them."""
    found = discover(cfg.discovery.root)
    devices = select_devices(found, cfg.discovery.ignore_devices)
    _log_tables(devices)
    health = Health(STALE_AFTER)
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
    # Allocations' signals of use, fed by attribution and usage while allocations run.
    activity = None
    if cfg.attribution.pod_resources.enabled:
        activity = Activity(cfg.metrics.series_ttl_seconds)
    attributor = Attributor(
        devices,
        resolver,
        metrics,
        sys.stdout if trace else None,
        pending_seconds=pending,
        activity=activity,
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
            activity=activity,
            clock=time.monotonic,
        )
    jobs = _jobs(cfg, resolver, metrics, found, services) if cfg.probe.jobs else None
    telemetry = None
    if cfg.telemetry.enabled:
        watched = fdinfo_devices(found, cfg.discovery.ignore_devices)
        on_reset = jobs.reset if jobs is not None else None
        # Never started without telemetry.uevents: then no device is wedged.
        wedges = Wedges(watched, metrics, cfg.discovery.root, on_reset=on_reset)
        if cfg.telemetry.uevents:
            services.add("uevents", wedges.close)
            wedges.start()
        telemetry = Telemetry(
            watched,
            metrics,
            cfg.discovery.root,
            deadline=cfg.telemetry.deadline_seconds,
            wedged=wedges.wedged,
        )
        services.add("telemetry", telemetry.close)
        telemetry.start()
    if activity is not None:
        _start_allocations(cfg, found, metrics, activity, services)
    p = cfg.probe
    tried = loaders(
        devices,
        loader=p.loader,
        mode=p.mode,
        hook=p.hook,
        attach=p.attach,
        ringbuf_pages=p.ringbuf_pages,
        durations=p.durations,
        debug=debug,
    )
    kernel = open_kernel(tried, devices, p.pin_dir)
    if jobs is not None:  # after the probe: a start that fails stops before it, in one line
        jobs.start()
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
        jobs=jobs,
        answered=answered,
        metrics=metrics,
        resolver=resolver,
        health=health,
        devices=len(devices),
    )


def _jobs(
    cfg: config.Config,
    resolver: Resolver,
    metrics: Metrics,
    found: list[Device],
    services: Services,
) -> Jobs:
    """The GPU jobs stage; start() attaches its probe on its own thread once the DRM GPU
    scheduler is loaded."""
    cgroups = ProcCgroups(cfg.attribution.cgroup_root)  # a reset's guilty pid to its cgroup
    pending = cfg.attribution.pending_seconds
    jobs = Jobs(JobsKernel(), resolver, metrics, found, pending, cgroups=cgroups)
    services.add("jobs", jobs.close)
    return jobs


def _start_allocations(
    cfg: config.Config,
    found: list[Device],
    metrics: Metrics,
    activity: Activity,
    services: Services,
) -> None:
    """The kubelet's allocations, refreshed on their own thread: a dead kubelet never stalls
    counting. Imported here: only an agent with pod_resources enabled needs the module."""
    from kubenpu.allocations import Allocations
    from kubenpu.resolve.podresources.client import PodResourcesClient
    from kubenpu.resolve.podresources.mapping import Mapper

    pr = cfg.attribution.pod_resources
    allocations = Allocations(
        PodResourcesClient(pr.socket, pr.timeout_seconds),
        Mapper(fdinfo_devices(found, cfg.discovery.ignore_devices)),
        metrics,
        pr.interval_seconds,
        activity,
        # A device plugged in after the start maps once discovery sees it.
        lambda: fdinfo_devices(discover(cfg.discovery.root), cfg.discovery.ignore_devices),
    )
    services.add("allocations", allocations.close)
    allocations.start()
