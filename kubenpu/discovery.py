"""Device discovery: the DRM and accel nodes of a machine, grouped by the device that owns them.

Sources, all under ``root`` (``/`` or a copy of a machine's tree):
- ``sys/class/{drm,accel}``: the nodes (cardN, renderDN, accelN) and their ``dev`` major:minor.
  sysfs is the only source of numbers: the probe keys on dev_t, which needs no /dev node.
- ``dev/{dri,accel}``: only checked for presence; a node sysfs lists but /dev lacks is kept with
  a warning (pods may still open it through their own /dev). Test fixtures therefore carry
  empty regular files there, as git cannot store character devices.
- the node's ``device`` link: the owning device, its ``driver`` link and, for PCI functions,
  ``vendor``, ``device`` and ``numa_node``.

Oddities are logged as one-line warnings and read as None; nothing here raises on bad sysfs.
"""

from __future__ import annotations

import logging
import os
import re
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from kubenpu.files import read_regular
from kubenpu.text import ascii_int
from kubenpu.vendors import for_driver

log = logging.getLogger(__name__)

_T = TypeVar("_T")
_MAX_FILE = 4096  # a sysfs attribute is at most a page

# sysfs class -> the /dev directory the kernel names its nodes in (drm_devnode, accel_devnode).
_CLASSES = {"drm": "dri", "accel": "accel"}
# Connector entries (card0-HDMI-A-1), `version` and legacy controlD nodes are not nodes we count.
_NODE_NAME = re.compile(r"(card|renderD|accel)\d+", re.ASCII)
PCI_ADDRESS = re.compile(r"[0-9a-f]{4,}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
_VIRTIO_DEVICE = re.compile(r"virtio\d+", re.ASCII)
_VIRTIO_TRANSPORT = "virtio-pci"
# Platform devices a driver registers without binding to them, by name pattern, with the driver
# whose plug-in counts their calls:
# - amdgpu_xcp_N, an MI300 compute partition's DRM device (drivers/gpu/drm/amd/amdxcp/
#   amdgpu_xcp_drv.c, amdgpu_xcp_drm_dev_alloc()); amdgpu_xcp.c amdgpu_xcp_dev_register() sends
#   its ioctls to amdgpu's driver.
_UNBOUND = ((re.compile(r"amdgpu_xcp_\d+", re.ASCII), "amdgpu"),)


@dataclass(frozen=True)
class Node:
    path: str  # e.g. /dev/dri/card0, without the discovery root
    name: str  # e.g. card0
    major: int
    minor: int

    @property
    def accel(self) -> bool:
        """An accel node (/dev/accel/accelN), not a DRM one."""
        return self.path.startswith(f"/dev/{_CLASSES['accel']}/")

    def sysfs(self, root: str | Path = "/") -> Path:
        """The node's class directory, e.g. ROOT/sys/class/drm/card0; its `device` link is the
        device's sysfs directory."""
        return Path(root) / "sys/class" / ("accel" if self.accel else "drm") / self.name


@dataclass(frozen=True)
class Device:
    id: str  # PCI address (0000:00:02.0), else platform:<device name>
    driver: str | None  # sysfs driver name, e.g. i915
    pci_id: str | None  # vendor:device, e.g. 8086:5917
    numa_node: int | None
    nodes: tuple[Node, ...]
    vendor: str | None  # the vendor plug-in's name, None when no plug-in handles the driver


def not_ignored(devices: Iterable[Device], ignore: Iterable[str]) -> list[Device]:
    """The devices `discovery.ignore_devices` does not name: those whose DRM clients, telemetry
    and allocations the sources watch. A driver without a vendor plug-in has no ioctl table to
    count, but may still print usage stats."""
    ignored = set(ignore)
    return [d for d in devices if d.id not in ignored]


def discover(root: str | Path = "/") -> list[Device]:
    """Every device with at least one usable DRM or accel node, ordered by id."""
    root = Path(root)
    nodes: defaultdict[Path, list[Node]] = defaultdict(list)
    for cls, devdir in _CLASSES.items():
        for entry in _entries(root / "sys/class" / cls):
            if found := _node(root, entry, devdir):
                nodes[found[0]].append(found[1])
    devices = [_device(dev, found) for dev, found in nodes.items()]
    return sorted(devices, key=lambda d: d.id)


def _entries(class_dir: Path) -> list[Path]:
    try:
        names = sorted(os.listdir(class_dir))
    except FileNotFoundError:  # no driver of this class loaded (or a kernel without accel)
        return []
    except OSError as e:
        log.warning("cannot list %s: %s", class_dir, e.strerror)
        return []
    return [class_dir / n for n in names if _NODE_NAME.fullmatch(n)]


def _node(root: Path, entry: Path, devdir: str) -> tuple[Path, Node] | None:
    """The owning device's directory and the node, or None (warned) when either is unusable."""
    device = _resolve(entry / "device")
    numbers = _parsed(entry / "dev", _major_minor) if device else None
    if device is None or numbers is None:
        log.warning("skipping node %s", entry.name)
        return None
    path = f"/dev/{devdir}/{entry.name}"
    if not os.path.lexists(root / path.lstrip("/")):
        log.warning("%s has no %s under %s; listing it from sysfs anyway", entry.name, path, root)
    return device, Node(path, entry.name, *numbers)


def platform_id(name: str) -> str:
    """The device id of a device on no PCI bus, from its sysfs (dev_name) name."""
    return f"platform:{name}"


def _device(dev: Path, nodes: list[Node]) -> Device:
    driver = _driver(dev)
    pci = _pci_function(dev)
    if pci is None:
        # Before the faux bus, vgem was a bare platform device with no driver bound (6.1 is
        # like that); such modules name their device after themselves, so the name stands in.
        plugin = for_driver(driver or _owner(dev.name))
        ident, pci_id, numa = platform_id(dev.name), None, None
    else:
        plugin = for_driver(driver)
        ident, pci_id = pci.name, _pci_id(pci)
        # numa_node only exists on CONFIG_NUMA kernels; -1 means "no affinity".
        numa = _parsed(pci / "numa_node", ascii_int, missing_ok=True)
        numa = None if numa is None or numa < 0 else numa
    return Device(
        id=ident,
        driver=driver,
        pci_id=pci_id,
        numa_node=numa,
        nodes=tuple(sorted(nodes, key=lambda n: (n.major, n.minor, n.name))),
        vendor=plugin.name if plugin else None,
    )


def _owner(name: str) -> str:
    """The driver that registered an unbound platform device: by _UNBOUND, else its name."""
    return next((driver for pattern, driver in _UNBOUND if pattern.fullmatch(name)), name)


def _pci_function(dev: Path) -> Path | None:
    """The PCI function that is dev, or that carries dev as its virtio device (virtio-gpu on
    older kernels). Other ancestors are not searched: a USB display adapter also sits below a
    PCI function, its host controller, which is not the device."""
    candidate = dev.parent if _VIRTIO_DEVICE.fullmatch(dev.name) else dev
    return candidate if PCI_ADDRESS.fullmatch(candidate.name) else None


def _driver(dev: Path) -> str | None:
    driver = _link_name(dev / "driver")
    if driver == _VIRTIO_TRANSPORT:
        # Newer kernels (6.1 is one) register virtio-gpu's DRM device on the PCI function, whose
        # driver is the virtio transport; the DRM driver is bound to the virtio child device.
        children = sorted(c for c in dev.glob("virtio*") if _VIRTIO_DEVICE.fullmatch(c.name))
        return next((name for c in children if (name := _link_name(c / "driver"))), driver)
    return driver


def _pci_id(pci: Path) -> str | None:
    vendor = _parsed(pci / "vendor", _hex16)
    device = _parsed(pci / "device", _hex16)
    return f"{vendor}:{device}" if vendor and device else None


def _link_name(link: Path) -> str | None:
    """The last component of a link's target. The target need not exist: a sysfs copy without
    /sys/bus still names the driver correctly."""
    try:
        return Path(os.readlink(link)).name
    except FileNotFoundError:
        return None  # no driver bound
    except OSError as e:
        log.warning("%s: not a readable link: %s", link, e.strerror)
        return None


def _resolve(link: Path) -> Path | None:
    try:
        return link.resolve(strict=True)
    except (OSError, RuntimeError) as e:  # RuntimeError: a symlink loop (Python < 3.13)
        log.warning("%s: cannot resolve: %s", link, getattr(e, "strerror", None) or e)
        return None


def _parsed(path: Path, parse: Callable[[str], _T], missing_ok: bool = False) -> _T | None:
    """parse(the file's stripped text), or None with a warning when missing or malformed."""
    try:  # regular files only: a FIFO in the tree would block the read for good
        text = read_regular(path, _MAX_FILE).decode().strip()
    except FileNotFoundError:
        if not missing_ok:
            log.warning("%s: missing", path)
        return None
    except (OSError, UnicodeDecodeError) as e:
        log.warning("%s: unreadable: %s", path, getattr(e, "strerror", None) or e)
        return None
    try:
        return parse(text)
    except ValueError:
        log.warning("%s: unexpected content %r", path, text[:40])
        return None


def _major_minor(text: str) -> tuple[int, int]:
    major, minor = (ascii_int(n) for n in text.split(":"))
    if major < 0 or minor < 0:
        raise ValueError(text)
    return major, minor


def _hex16(text: str) -> str:
    value = int(text, 16)
    if not 0 <= value <= 0xFFFF:
        raise ValueError(text)
    return f"{value:04x}"
