"""Generate the sysfs fixture machines under tests/testdata/<machine>/{sys,dev}.

Run `python tests/testdata/generate.py` after editing; the trees are committed and
tests/test_discovery.py checks they still match this script.

The trees copy the shape of real machines' sysfs: /sys/class/{drm,accel} entries are relative
symlinks into /sys/devices, node dirs hold `dev` ("226:1") and a `device` link to the owning
device, which has a `driver` link into /sys/bus and, for PCI, `vendor`, `device`, `numa_node`.
Git cannot store character devices, so /dev nodes are empty regular files: discovery takes
major:minor from sysfs and only checks that the /dev path exists.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DRM_MAJOR = 226
ACCEL_MAJOR = 261


class Machine:
    """Writes one machine's tree; all paths are relative to the machine root."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def file(self, rel: str, content: str | bytes = "") -> None:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)

    def link(self, rel: str, target: str) -> None:
        """A relative symlink at rel to target, spelled like sysfs spells them: up to the first
        common ancestor of the target's parent, then down (card1/device -> ../../../0000:00:02.0).
        """
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        up = os.path.relpath(self.root / target.rpartition("/")[0], path.parent)
        path.symlink_to(os.path.normpath(os.path.join(up, Path(target).name)))

    def driver(self, dev: str, bus: str, name: str) -> None:
        drv = f"sys/bus/{bus}/drivers/{name}"
        self.file(f"{drv}/uevent")
        self.link(f"{drv}/{Path(dev).name}", dev)
        self.link(f"{dev}/driver", drv)

    def pci(self, path: str, vendor: str, device: str, driver: str | None, numa: int = -1) -> str:
        """A PCI function at sys/devices/<path>, e.g. pci0000:00/0000:00:02.0."""
        dev = f"sys/devices/{path}"
        self.file(f"{dev}/vendor", f"0x{vendor}\n")
        self.file(f"{dev}/device", f"0x{device}\n")
        self.file(f"{dev}/numa_node", f"{numa}\n")
        if driver:
            self.driver(dev, "pci", driver)
        return dev

    def platform(self, path: str, driver: str | None, bus: str = "platform") -> str:
        dev = f"sys/devices/{path}"
        self.file(f"{dev}/uevent", f"DRIVER={driver}\n" if driver else "")
        if driver:
            self.driver(dev, bus, driver)
        return dev

    def node(self, dev: str, name: str, minor: int, dev_file: bool = True) -> None:
        """A DRM (cardN, renderDN) or accel (accelN) node of device dir dev."""
        cls = "accel" if name.startswith("accel") else "drm"
        major = ACCEL_MAJOR if cls == "accel" else DRM_MAJOR
        devname = f"{'accel' if cls == 'accel' else 'dri'}/{name}"
        node = f"{dev}/{cls}/{name}"
        self.file(f"{node}/dev", f"{major}:{minor}\n")
        self.file(f"{node}/uevent", f"MAJOR={major}\nMINOR={minor}\nDEVNAME={devname}\n")
        self.link(f"{node}/device", dev)
        self.link(f"sys/class/{cls}/{name}", node)
        if dev_file:
            self.file(f"dev/{devname}")
        if cls == "drm":
            self.file("sys/class/drm/version", "drm 1.1.0 20060810\n")

    def connector(self, dev: str, card: str, connector: str) -> None:
        name = f"{card}-{connector}"
        conn = f"{dev}/drm/{card}/{name}"
        self.file(f"{conn}/status", "connected\n")
        self.link(f"sys/class/drm/{name}", conn)


def intel_i915(m: Machine) -> None:
    gpu = m.pci("pci0000:00/0000:00:02.0", "8086", "5917", "i915")
    m.node(gpu, "card1", 1)
    m.node(gpu, "renderD128", 128)
    m.connector(gpu, "card1", "eDP-1")
    m.connector(gpu, "card1", "HDMI-A-1")


def intel_arc_xe(m: Machine) -> None:
    bridges = "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0"
    gpu = m.pci(f"{bridges}/0000:03:00.0", "8086", "e20b", "xe")
    m.node(gpu, "card0", 0)
    m.node(gpu, "renderD128", 128)
    m.connector(gpu, "card0", "DP-1")


def amd_server(m: Machine) -> None:
    # Two-socket server: the BMC's ASPEED display (card only, no render node) and an amdgpu
    # card on the second socket.
    bmc = m.pci("pci0000:00/0000:00:1c.0/0000:02:00.0", "1a03", "2000", "ast", numa=0)
    m.node(bmc, "card0", 0)
    m.connector(bmc, "card0", "VGA-1")
    gpu = m.pci("pci0000:c0/0000:c0:01.1/0000:c3:00.0", "1002", "744c", "amdgpu", numa=1)
    m.node(gpu, "card1", 1)
    m.node(gpu, "renderD128", 128)
    m.connector(gpu, "card1", "DP-1")


def hybrid_two_gpu(m: Machine) -> None:
    # The dGPU probed first: card and render numbers run opposite to PCI address order.
    dgpu = m.pci("pci0000:00/0000:00:01.0/0000:03:00.0", "1002", "73ff", "amdgpu")
    igpu = m.pci("pci0000:00/0000:00:02.0", "8086", "9a49", "i915")
    m.node(dgpu, "card0", 0)
    m.node(igpu, "card1", 1)
    m.node(dgpu, "renderD128", 128)
    m.node(igpu, "renderD129", 129)


def intel_npu(m: Machine) -> None:
    gpu = m.pci("pci0000:00/0000:00:02.0", "8086", "7d55", "i915")
    m.node(gpu, "card0", 0)
    m.node(gpu, "renderD128", 128)
    npu = m.pci("pci0000:00/0000:00:0b.0", "8086", "7d1d", "intel_vpu")
    m.node(npu, "accel0", 0)


def gaudi(m: Machine) -> None:
    # Gaudi2 cards sit behind PCIe switches; discovery must take the card, not a bridge.
    switch = "pci0000:b0/0000:b0:02.0/0000:b1:00.0/0000:b2:00.0"
    # habanalabs prints each card's serial_number (the id its device plugin allocates).
    card = m.pci(f"{switch}/0000:b3:00.0", "1da3", "1020", "habanalabs", numa=1)
    m.node(card, "accel1", 1)
    m.file(f"{card}/serial_number", "AN12345678\n")
    switch = "pci0000:30/0000:30:02.0/0000:31:00.0/0000:32:00.0"
    card = m.pci(f"{switch}/0000:33:00.0", "1da3", "1020", "habanalabs", numa=0)
    m.node(card, "accel0", 0)
    m.file(f"{card}/serial_number", "AN87654321\n")


def qualcomm_ai100(m: Machine) -> None:
    npu = m.pci("pci0000:40/0000:40:01.1/0000:41:00.0", "17cb", "a100", "qaic", numa=0)
    m.node(npu, "accel0", 0)


def amd_npu(m: Machine) -> None:
    gpu = m.pci("pci0000:00/0000:00:08.1/0000:c5:00.0", "1002", "15bf", "amdgpu")
    m.node(gpu, "card0", 0)
    m.node(gpu, "renderD128", 128)
    npu = m.pci("pci0000:00/0000:00:08.2/0000:c6:00.1", "1022", "1502", "amdxdna")
    m.node(npu, "accel0", 0)


def arm_panfrost(m: Machine) -> None:
    # RK3568: display controller and GPU are separate platform devices.
    display = m.platform("platform/display-subsystem", "rockchip-drm")
    m.node(display, "card0", 0)
    m.connector(display, "card0", "HDMI-A-1")
    gpu = m.platform("platform/fde60000.gpu", "panfrost")
    m.node(gpu, "card1", 1)
    m.node(gpu, "renderD128", 128)


def raspberry_pi4(m: Machine) -> None:
    gpu = m.platform("platform/v3dbus/fec00000.v3d", "v3d")
    m.node(gpu, "card0", 0)
    m.node(gpu, "renderD128", 128)
    display = m.platform("platform/gpu", "vc4-drm")
    m.node(display, "card1", 1)
    m.connector(display, "card1", "HDMI-A-1")


def virtio_gpu(m: Machine) -> None:
    # Newer kernels (6.1 is one) register virtio-gpu's DRM device on the PCI function, whose
    # driver is the virtio transport; virtio_gpu is bound to the virtio child device.
    gpu = m.pci("pci0000:00/0000:00:04.0", "1af4", "1050", "virtio-pci")
    m.platform("pci0000:00/0000:00:04.0/virtio1", "virtio_gpu", bus="virtio")
    m.node(gpu, "card0", 0)
    m.node(gpu, "renderD128", 128)
    m.connector(gpu, "card0", "Virtual-1")


def virtio_gpu_old(m: Machine) -> None:
    # Older kernels hung the DRM device off the virtio device below the PCI function.
    m.pci("pci0000:00/0000:00:02.0", "1af4", "1050", "virtio-pci")
    gpu = m.platform("pci0000:00/0000:00:02.0/virtio0", "virtio_gpu", bus="virtio")
    m.node(gpu, "card0", 0)
    m.node(gpu, "renderD128", 128)


def vgem_platform(m: Machine) -> None:
    # Before the faux bus (e.g. 6.1) vgem registered a bare platform device and bound no driver.
    dev = m.platform("platform/vgem", None)
    m.node(dev, "card0", 0)
    m.node(dev, "renderD128", 128)


def vgem_faux(m: Machine) -> None:
    dev = m.platform("faux/vgem", "faux_driver", bus="faux")
    m.node(dev, "card0", 0)
    m.node(dev, "renderD128", 128)


def nvidia(m: Machine) -> None:
    gpu = m.pci("pci0000:00/0000:00:01.0/0000:01:00.0", "10de", "2684", "nvidia", numa=0)
    m.node(gpu, "card0", 0)
    m.node(gpu, "renderD128", 128)


def broken(m: Machine) -> None:
    # Still listed: garbage vendor id and numa_node, a file where the driver link belongs, and
    # no /dev node for card0.
    gpu = m.pci("pci0000:00/0000:00:02.0", "zz86", "5917", None)
    m.file(f"{gpu}/numa_node", "banana\n")
    m.file(f"{gpu}/driver", "i915\n")
    m.node(gpu, "card0", 0, dev_file=False)
    m.node(gpu, "renderD128", 128)
    # Nodes dropped, one warning each: garbage, missing and unreadable `dev`, dangling links.
    bad = m.pci("pci0000:00/0000:00:03.0", "8086", "5917", "i915")
    m.node(bad, "card1", 1)
    m.file(f"{bad}/drm/card1/dev", "two-two-six\n")
    m.node(bad, "renderD129", 129)
    (m.root / f"{bad}/drm/renderD129/dev").unlink()
    m.node(bad, "card2", 2)
    (m.root / f"{bad}/drm/card2/dev").unlink()
    m.file(f"{bad}/drm/card2/dev/placeholder")  # a directory where a file belongs
    m.node(bad, "renderD130", 130)
    (m.root / f"{bad}/drm/renderD130/device").unlink()
    m.link(f"{bad}/drm/renderD130/device", "sys/devices/pci0000:00/0000:00:1f.0")
    m.link("sys/class/drm/card3", "sys/devices/pci0000:00/0000:00:05.0/drm/card3")
    # Listed with pci_id "-": a non-UTF-8 device id.
    odd = m.pci("pci0000:00/0000:00:0b.0", "8086", "7d1d", "intel_vpu", numa=0)
    m.file(f"{odd}/device", b"\xff\xfe\n")
    m.node(odd, "accel0", 0)


MACHINES = {
    "intel-i915": intel_i915,
    "intel-arc-xe": intel_arc_xe,
    "amd-server": amd_server,
    "hybrid-two-gpu": hybrid_two_gpu,
    "intel-npu": intel_npu,
    "gaudi": gaudi,
    "qualcomm-ai100": qualcomm_ai100,
    "amd-npu": amd_npu,
    "arm-panfrost": arm_panfrost,
    "raspberry-pi4": raspberry_pi4,
    "virtio-gpu": virtio_gpu,
    "virtio-gpu-old": virtio_gpu_old,
    "vgem-platform": vgem_platform,
    "vgem-faux": vgem_faux,
    "nvidia": nvidia,
    "broken": broken,
}


def generate(dest: Path) -> None:
    for name, build in MACHINES.items():
        shutil.rmtree(dest / name, ignore_errors=True)
        build(Machine(dest / name))


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE)
