"""Allocated ids to `device` labels, per device plugin, as data.

Id formats, from the plugins' sources:
- Intel GPU plugin (intel-device-plugins-for-kubernetes cmd/gpu_plugin/gpu_plugin.go, scan()):
  resource gpu.intel.com/i915 or gpu.intel.com/xe, id "<card>-<i>": the /sys/class/drm card
  name, <i> the share index below -shared-dev-num.
- Intel NPU plugin (same repository, cmd/npu_plugin/npu_plugin.go, scan()): npu.intel.com/accel,
  id "<accelN>-<i>".
- AMD (ROCm/k8s-device-plugin internal/pkg/amdgpu/amdgpu.go GetAMDGPUs(), used by
  internal/pkg/plugin/plugin.go ListAndWatch()): amd.com/gpu, id the PCI address (the name of
  the amdgpu driver's device link).
- Habana (HabanaAI/habanalabs-k8s-device-plugin habanalabs.go): habana.ai/<type>, id the
  device's serial number, matched against the device's sysfs serial_number.
Any other id, and a DRA device name: a PCI address in it (also written with dashes, as DRA
drivers name devices), else a card/renderD/accel node name in it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from kubenpu.discovery import PCI_ADDRESS, Device


class Unmapped(StrEnum):
    """Why an allocated id has no `device` label."""

    EMPTY_ID = "empty_id"
    UNKNOWN_FORMAT = "unknown_format"  # no pattern found a device reference in it
    NO_DEVICE = "no_device"  # it names a device discovery did not find


@dataclass(frozen=True)
class IdFormat:
    plugin: str
    resource: re.Pattern[str]
    # Named groups: `node` (a DRM/accel node name), `pci` (an address) or `serial`.
    id: re.Pattern[str]
    drivers: tuple[str, ...]  # the sysfs drivers of the devices it advertises (docs/drivers.md)


PLUGINS = (
    IdFormat(
        "intel-gpu",
        re.compile(r"gpu\.intel\.com/(i915|xe)"),
        re.compile(r"(?P<node>card\d+)-\d+"),
        ("i915", "xe"),
    ),
    IdFormat(
        "intel-npu",
        re.compile(r"npu\.intel\.com/accel"),
        re.compile(r"(?P<node>accel\d+)-\d+"),
        ("intel_vpu",),
    ),
    IdFormat(
        "amd-gpu",
        re.compile(r"amd\.com/gpu"),
        re.compile(rf"(?P<pci>{PCI_ADDRESS.pattern})", re.I),
        ("amdgpu",),
    ),
    IdFormat(
        "habana", re.compile(r"habana\.ai/.+"), re.compile(r"(?P<serial>.+)"), ("habanalabs",)
    ),
)
_FALLBACK_PCI = re.compile(
    r"([0-9a-f]{4,})[:-]([0-9a-f]{2})[:-]([0-9a-f]{2})[.-]([0-7])(?![0-9a-f])", re.I
)
_FALLBACK_NODE = re.compile(r"(?<![0-9a-z])((?:card|renderD|accel)\d+)(?!\d)")
_SERIAL_FILE = "serial_number"


class Mapper:
    """Maps (resource, id) to a discovered device's id. Built once per device list."""

    def __init__(self, devices: Iterable[Device], root: str | Path = "/") -> None:
        devices = list(devices)
        self._ids = {d.id for d in devices}
        self._nodes = {n.name: d.id for d in devices for n in d.nodes}
        self._serials = _serials(devices, Path(root))

    def device(self, resource: str, ident: str, cdi: Iterable[str] = ()) -> str | Unmapped:
        """The device id, or why there is none. `cdi`: a DRA device's CDI names, tried when
        its name maps to none."""
        found = self._device(resource, ident)
        for name in cdi if isinstance(found, Unmapped) else ():
            if not isinstance(by_cdi := self.fallback(name), Unmapped):
                return by_cdi
        return found

    def _device(self, resource: str, ident: str) -> str | Unmapped:
        if not ident:
            return Unmapped.EMPTY_ID
        for fmt in PLUGINS:
            if fmt.resource.fullmatch(resource) and (m := fmt.id.fullmatch(ident)):
                return self._lookup(m.groupdict())
        return self.fallback(ident)

    def fallback(self, text: str) -> str | Unmapped:
        """A PCI address or a node name found in an id, a DRA device name or a CDI name."""
        if m := _FALLBACK_PCI.search(text):
            return self._lookup({"pci": "{}:{}:{}.{}".format(*m.groups())})
        if m := _FALLBACK_NODE.search(text):
            return self._lookup({"node": m.group(1)})
        return Unmapped.UNKNOWN_FORMAT

    def _lookup(self, groups: dict[str, str]) -> str | Unmapped:
        if pci := groups.get("pci"):
            found = pci.lower() if pci.lower() in self._ids else None
        elif node := groups.get("node"):
            found = self._nodes.get(node)
        else:
            found = self._serials.get(groups.get("serial", ""))
        return found or Unmapped.NO_DEVICE


def _serials(devices: list[Device], root: Path) -> dict[str, str]:
    """serial_number (habanalabs prints one per device in sysfs) -> device id."""
    found: dict[str, str] = {}
    for dev in devices:
        for node in dev.nodes:
            try:
                serial = (node.sysfs(root) / "device" / _SERIAL_FILE).read_text()
            except (OSError, UnicodeDecodeError):
                continue  # most drivers print none
            if serial.strip():
                found[serial.strip()] = dev.id
    return found
