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

    def files(self, folder: str, values: dict[str, object]) -> None:
        """sysfs attributes: one value a file, newline-terminated as sysfs_emit writes them."""
        for name, value in values.items():
            self.file(f"{folder}/{name}", f"{value}\n")

    def hwmon(self, dev: str, number: int, name: str, values: dict[str, object]) -> None:
        """A hwmon device whose parent is dev (hwmon_device_register_with_info(dev, ...)):
        dev/hwmon/hwmonN with `name`, its attributes, a `device` link, and its class link."""
        hw = f"{dev}/hwmon/hwmon{number}"
        self.files(hw, {"name": name, **values})
        self.link(f"{hw}/device", dev)
        self.link(f"sys/class/hwmon/hwmon{number}", hw)

    def connector(self, dev: str, card: str, connector: str) -> None:
        name = f"{card}-{connector}"
        conn = f"{dev}/drm/{card}/{name}"
        self.file(f"{conn}/status", "connected\n")
        self.link(f"sys/class/drm/{name}", conn)


# i915's GT files on the card node (gt/intel_gt_sysfs_pm.c): an integrated GPU has no hwmon
# (i915_hwmon_register returns early unless IS_DGFX).
I915_GT = {
    "rps_act_freq_mhz": 300,
    "rps_cur_freq_mhz": 350,
    "rps_max_freq_mhz": 1100,
    "rps_min_freq_mhz": 300,
    "rps_RP0_freq_mhz": 1100,
    "throttle_reason_status": 1,
    "throttle_reason_pl1": 1,
    "throttle_reason_pl2": 0,
    "throttle_reason_pl4": 0,
    "throttle_reason_thermal": 0,
    "throttle_reason_prochot": 0,
    "throttle_reason_ratl": 0,
    "throttle_reason_vr_thermalert": 0,
    "throttle_reason_vr_tdc": 0,
}


def intel_i915(m: Machine) -> None:
    gpu = m.pci("pci0000:00/0000:00:02.0", "8086", "5917", "i915")
    m.node(gpu, "card1", 1)
    m.node(gpu, "renderD128", 128)
    m.connector(gpu, "card1", "eDP-1")
    m.connector(gpu, "card1", "HDMI-A-1")
    m.files(f"{gpu}/drm/card1/gt/gt0", I915_GT)
    m.files(f"{gpu}/drm/card1", {"gt_act_freq_mhz": 300, "gt_cur_freq_mhz": 350})


def intel_arc_xe(m: Machine) -> None:
    bridges = "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0"
    gpu = m.pci(f"{bridges}/0000:03:00.0", "8086", "e20b", "xe")
    m.node(gpu, "card0", 0)
    m.node(gpu, "renderD128", 128)
    m.connector(gpu, "card0", "DP-1")
    # xe_hwmon.c (Documentation/ABI/testing/sysfs-driver-intel-xe-hwmon): channel 1 is the
    # card, 2 the package; no power input, energy in µJ.
    hwmon = {"power1_max": 0, "power1_rated_max": 190000000, "power1_crit": 400000000}
    hwmon |= {"power1_cap": 0, "energy1_input": 123456789012, "power2_max": 150000000}
    hwmon |= {"power2_rated_max": 150000000, "energy2_input": 98765432109, "in1_input": 850}
    hwmon |= {"temp2_input": 45000, "temp3_input": 52000, "fan1_input": 1200}
    m.hwmon(gpu, 2, "xe", hwmon)
    # xe_gt_freq.c and xe_gt_throttle.c: MHz, and 0/1 throttle reasons.
    freq = f"{gpu}/tile0/gt0/freq0"
    m.files(freq, {"act_freq": 2850, "cur_freq": 2850, "max_freq": 2850, "min_freq": 400})
    m.files(freq, {"rp0_freq": 2850, "rpe_freq": 1700, "rpn_freq": 400})
    reasons = ("pl1", "pl2", "pl4", "thermal", "prochot", "ratl", "vr_thermalert", "vr_tdc")
    m.files(f"{freq}/throttle", {"status": 0, **{f"reason_{r}": 0 for r in reasons}})


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
    # amdgpu_pm.c (Documentation/gpu/amdgpu/thermal.rst): power in µW (power1_average: no
    # energy counter, so energy is integrated), temperatures labelled, clocks in Hz.
    hwmon = {"power1_average": 63000000, "power1_cap": 327000000, "power1_label": "PPT"}
    hwmon |= {"temp1_input": 41000, "temp1_label": "edge", "temp1_crit": 100000}
    hwmon |= {"temp1_emergency": 105000}
    hwmon |= {"temp2_input": 47000, "temp2_label": "junction", "temp3_input": 56000}
    hwmon |= {"temp3_label": "mem", "freq1_input": 1200000000, "freq1_label": "sclk"}
    hwmon |= {"freq2_input": 456000000, "freq2_label": "mclk", "in0_input": 736}
    hwmon |= {"in0_label": "vddgfx", "fan1_input": 0}
    m.hwmon(gpu, 4, "amdgpu", hwmon)
    m.files(gpu, {"gpu_busy_percent": 37, "mem_busy_percent": 5})
    m.files(gpu, {"mem_info_vram_used": 1073741824, "mem_info_vram_total": 25753026560})
    # amdgpu_fru_eeprom.c (the board's FRU) and amdgpu_atombios.c: hw.model and friends.
    m.files(gpu, {"product_name": "AMD Instinct MI210", "serial_number": "692221000312"})
    m.files(gpu, {"vbios_version": "113-D67301-063"})
    # amdgpu_ras.c: a RAS-capable board's counters per block, since the driver loaded
    # (amdgpu_ras_sysfs_read; de: on UMC since 6.10), and amdgpu_ras_sysfs_features_read.
    m.file(f"{gpu}/ras/umc_err_count", "ue: 0\nce: 3\nde: 0\n")
    m.file(f"{gpu}/ras/gfx_err_count", "ue: 0\nce: 0\n")
    m.file(f"{gpu}/ras/features", "feature mask: 0x3fbf\n")


def mi300_partitions(m: Machine) -> None:
    # An MI300X in CPX mode, partitions 0-2 of its 8 shown: partition 0 is the PCI function's
    # own DRM device; each further one is a platform device amdgpu_xcp_N with no driver bound
    # and its own card and render node (amdxcp/amdgpu_xcp_drv.c amdgpu_xcp_drm_dev_alloc(),
    # amdgpu/amdgpu_xcp.c amdgpu_xcp_dev_register() sends their ioctls to the parent's driver).
    gpu = m.pci("pci0000:00/0000:00:01.1/0000:05:00.0", "1002", "74a1", "amdgpu", numa=0)
    m.node(gpu, "card1", 1)
    m.node(gpu, "renderD128", 128)
    m.files(gpu, {"current_compute_partition": "CPX", "current_memory_partition": "NPS1"})
    for n in range(2):
        xcp = m.platform(f"platform/amdgpu_xcp_{n}", None)
        m.node(xcp, f"card{n + 2}", n + 2)
        m.node(xcp, f"renderD{n + 129}", n + 129)


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
    m.files(f"{gpu}/drm/card0/gt/gt0", I915_GT)
    # ivpu_sysfs.c: busy time in µs, frequencies in MHz, memory in bytes.
    m.files(npu, {"npu_busy_time_us": 81234567, "npu_current_frequency_mhz": 1850})
    m.files(npu, {"npu_max_frequency_mhz": 1850, "npu_memory_utilization": 67108864})


def gaudi(m: Machine) -> None:
    # Gaudi2 cards sit behind PCIe switches; discovery must take the card, not a bridge. One
    # card per NUMA node: the plugin's Topology (hlml NumaNode) tells them apart, since no
    # file names a card's serial (common/sysfs.c prints pci_addr, module_id, device_type, ...
    # and a binary `eeprom` in the firmware's layout; no serial_number).
    switch = "pci0000:b0/0000:b0:02.0/0000:b1:00.0/0000:b2:00.0"
    second = m.pci(f"{switch}/0000:b3:00.0", "1da3", "1020", "habanalabs", numa=1)
    m.node(second, "accel1", 1)
    switch = "pci0000:30/0000:30:02.0/0000:31:00.0/0000:32:00.0"
    first = m.pci(f"{switch}/0000:33:00.0", "1da3", "1020", "habanalabs", numa=0)
    m.node(first, "accel0", 0)
    # common/sysfs.c (clk_*_freq_mhz in MHz, max_power in mW, pci_addr_show, module_id_show,
    # device_type_show) and common/hwmon.c (channels the firmware reports, standard units).
    for number, dev in enumerate((first, second)):
        m.files(dev, {"clk_cur_freq_mhz": 1600, "clk_max_freq_mhz": 1800, "max_power": 600000})
        m.files(dev, {"pci_addr": dev.rpartition("/")[2], "module_id": number})
        m.files(dev, {"device_type": "GAUDI2"})
        hwmon = {"temp1_input": 38000 + number * 1000, "power1_input": 95000000 + number}
        m.hwmon(dev, number, "habanalabs", {**hwmon, "in1_input": 800, "curr1_input": 110})


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
    "mi300-partitions": mi300_partitions,
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
