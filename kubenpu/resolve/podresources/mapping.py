"""Allocated ids to `device` labels, per device plugin and DRA driver, as data.

`PLUGINS` holds one row per id format, each naming the plugin's source file and function the
format comes from (tests/test_allocations.py checks every row with an id of that form). Any
other id, and a DRA device or CDI name no row takes: a PCI address in it (also written with
dashes, as DRA drivers name devices), else a card/renderD/accel node name in it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from kubenpu.discovery import PCI_ADDRESS, Device


class Unmapped(StrEnum):
    """Why an allocated id has no `device` label."""

    EMPTY_ID = "empty_id"
    UNKNOWN_FORMAT = "unknown_format"  # no pattern found a device reference in it
    NO_DEVICE = "no_device"  # it names a device discovery did not find
    # A Gaudi board serial: no unprivileged file or ioctl names a card's serial, and the
    # plugin's NUMA node left more than one card (docs/allocations.md).
    SERIAL_UNRESOLVABLE = "serial_unresolvable"
    MONITORING = "monitoring"  # access to every GPU's telemetry, not an allocation


@dataclass(frozen=True)
class IdFormat:
    plugin: str
    source: str  # repository, file and function the id format is taken from
    resource: re.Pattern[str]  # the extended resource, or the DRA driver name
    # Named groups: `node` (a DRM/accel node name), `card` and `render` (a card's and its
    # render node's numbers, which must name one device), `pci` (an address), `platform` (a
    # platform device's name), `serial` (a board serial); none: `state` applies.
    id: re.Pattern[str]
    drivers: tuple[
        str, ...
    ] = ()  # the sysfs drivers of the devices it advertises (docs/drivers.md)
    state: Unmapped | None = None


_INTEL = "intel/intel-device-plugins-for-kubernetes"
_AMD_DP = "ROCm/k8s-device-plugin internal/pkg/amdgpu/amdgpu.go GetAMDGPUs()"
_AMD_DRA = "ROCm/k8s-gpu-dra-driver cmd/gpu-kubeletplugin"

PLUGINS = (
    IdFormat(
        "intel-gpu",
        f"{_INTEL} cmd/gpu_plugin/gpu_plugin.go scan(): <card>-<share below -shared-dev-num>",
        re.compile(r"gpu\.intel\.com/(i915|xe)"),
        re.compile(r"(?P<node>card\d+)-\d+"),
        drivers=("i915", "xe"),
    ),
    IdFormat(
        "intel-gpu-monitoring",
        f"{_INTEL} cmd/gpu_plugin/gpu_plugin.go scan(): monitorID, <driver>_monitoring",
        re.compile(r"gpu\.intel\.com/(i915|xe)_monitoring"),
        re.compile(r"all"),
        state=Unmapped.MONITORING,
    ),
    IdFormat(
        "intel-npu",
        f"{_INTEL} cmd/npu_plugin/npu_plugin.go scan(): <accelN>-<share>",
        re.compile(r"npu\.intel\.com/accel"),
        re.compile(r"(?P<node>accel\d+)-\d+"),
        drivers=("intel_vpu",),
    ),
    # amd.com/gpu, or amd.com/<compute>_<memory partition> (cpx_nps1) in the mixed strategy.
    IdFormat(
        "amd-gpu",
        f"{_AMD_DP}: the PCI address of the amdgpu driver's device link",
        re.compile(r"amd\.com/.+"),
        re.compile(rf"(?P<pci>{PCI_ADDRESS.pattern})", re.I),
        drivers=("amdgpu",),
    ),
    IdFormat(
        "amd-gpu-partition",
        f"{_AMD_DP}: an MI300 partition, /sys/devices/platform/amdgpu_xcp_N",
        re.compile(r"amd\.com/.+"),
        re.compile(r"(?P<platform>amdgpu_xcp_\d+)"),
        drivers=("amdgpu",),
    ),
    IdFormat(
        "amd-dra",
        f"{_AMD_DRA}/deviceinfo.go CanonicalName(): gpu-<card>-<renderD minor>",
        re.compile(r"gpu\.amd\.com"),
        re.compile(r"gpu-(?P<card>\d+)-(?P<render>\d+)"),
        drivers=("amdgpu",),
    ),
    IdFormat(
        "amd-dra-cdi",
        f"{_AMD_DRA}/cdi.go GetClaimDevices(): k8s.gpu.amd.com/gpu=<claim uid>-<device name>",
        re.compile(r"gpu\.amd\.com"),
        re.compile(r"k8s\.gpu\.amd\.com/gpu=[0-9a-f-]+-gpu-(?P<card>\d+)-(?P<render>\d+)"),
        drivers=("amdgpu",),
    ),
    IdFormat(
        "habana",
        "HabanaAI/habanalabs-k8s-device-plugin habanalabs.go Devices(): hlml SerialNumber()",
        re.compile(r"habana\.ai/.+"),
        re.compile(r"(?P<serial>.+)"),
        drivers=("habanalabs",),
    ),
)
_FALLBACK_PCI = re.compile(
    r"([0-9a-f]{4,})[:-]([0-9a-f]{2})[:-]([0-9a-f]{2})[.-]([0-7])(?![0-9a-f])", re.I
)
_FALLBACK_NODE = re.compile(r"(?<![0-9a-z])((?:card|renderD|accel)\d+)(?!\d)")
_HABANA = "habanalabs"  # the vendor whose cards a serial names


class Mapper:
    """Maps (resource, id) to a discovered device's id. Built once per device list."""

    def __init__(self, devices: Iterable[Device]) -> None:
        devices = list(devices)
        self._ids = {d.id for d in devices}
        self._nodes = {n.name: d.id for d in devices for n in d.nodes}
        self._gaudis = [d for d in devices if d.vendor == _HABANA]

    def device(
        self, resource: str, ident: str, cdi: Iterable[str] = (), numa: Iterable[int] = ()
    ) -> str | Unmapped:
        """The device id, or why there is none. `cdi`: a DRA device's CDI names, tried when
        its name maps to none; `numa`: the NUMA nodes the plugin reported for it."""
        found = self._device(resource, ident, tuple(numa))
        for name in cdi if isinstance(found, Unmapped) else ():
            if not isinstance(by_cdi := self._device(resource, name, ()), Unmapped):
                return by_cdi
        return found

    def _device(self, resource: str, ident: str, numa: tuple[int, ...]) -> str | Unmapped:
        if not ident:
            return Unmapped.EMPTY_ID
        for fmt in PLUGINS:
            if fmt.resource.fullmatch(resource) and (m := fmt.id.fullmatch(ident)):
                return fmt.state or self._lookup(m.groupdict(), numa)
        return self._fallback(ident)

    def _fallback(self, text: str) -> str | Unmapped:
        """A PCI address or a node name found in an id, a DRA device name or a CDI name."""
        if m := _FALLBACK_PCI.search(text):
            return self._lookup({"pci": "{}:{}:{}.{}".format(*m.groups())})
        if m := _FALLBACK_NODE.search(text):
            return self._lookup({"node": m.group(1)})
        return Unmapped.UNKNOWN_FORMAT

    def _lookup(self, groups: dict[str, str], numa: tuple[int, ...] = ()) -> str | Unmapped:
        if pci := groups.get("pci"):
            found = pci.lower() if pci.lower() in self._ids else None
        elif platform := groups.get("platform"):
            found = f"platform:{platform}" if f"platform:{platform}" in self._ids else None
        elif "serial" in groups:
            return self._gaudi(numa)
        else:
            names = [groups["node"]] if "node" in groups else []
            names += [f"card{groups['card']}"] if "card" in groups else []
            names += [f"renderD{groups['render']}"] if "render" in groups else []
            owners = {self._nodes.get(n) for n in names}
            found = owners.pop() if len(owners) == 1 else None
        return found or Unmapped.NO_DEVICE

    def _gaudi(self, numa: tuple[int, ...]) -> str | Unmapped:
        """The one Gaudi the serial can be: the only card, or the only one on the plugin's NUMA
        node (Devices() reports hlml's NumaNode as the device's Topology)."""
        if not self._gaudis:
            return Unmapped.NO_DEVICE
        cards = [d for d in self._gaudis if not numa or d.numa_node in numa]
        return cards[0].id if len(cards) == 1 else Unmapped.SERIAL_UNRESOLVABLE
