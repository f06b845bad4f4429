"""Write docs/drivers.md: the driver x feature matrix, from the code's own tables.

- calls: the vendor plug-ins (kubenpu/vendors), their counted ioctls per kind;
- allocation mapping: the device plugins' id formats (PLUGINS in
  kubenpu/resolve/podresources/mapping.py), else the PCI address / node name fallback;
- fdinfo time and memory, power, energy, temperature and clocks: what the agent's own readers
  (kubenpu.sources.fdinfo, kubenpu.sources.sysfs) return on the recorded sysfs and /proc trees of
  tests/testdata, copied from each driver's kernel source (each tree's README cites it).
tests/test_drivers_doc.py fails when the committed page differs from what this writes.

usage: scripts/drivers.py [OUT]   (default docs/drivers.md)
"""

from __future__ import annotations

import logging
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kubenpu import discovery, vendors  # noqa: E402
from kubenpu.resolve.podresources.mapping import PLUGINS  # noqa: E402
from kubenpu.sources import fdinfo, sysfs  # noqa: E402

TESTDATA = ROOT / "tests" / "testdata"
SKIP_MACHINES = {"broken"}  # malformed on purpose
NOT_RECORDED = "?"
FEATURES = ("fdinfo time", "fdinfo memory", "power", "energy", "temperature", "clocks")


def recorded() -> tuple[dict[str, dict[str, str]], dict[str, set[str]]]:
    """Per sysfs driver: each feature's value as the agent reads it from a recorded tree, and
    the trees it was read from."""
    found: dict[str, dict[str, str]] = defaultdict(dict)
    machines: dict[str, set[str]] = defaultdict(set)
    for machine in sorted(p for p in TESTDATA.iterdir() if (p / "sys").is_dir()):
        if machine.name in SKIP_MACHINES:
            continue
        for device in discovery.discover(machine):
            if device.driver:
                machines[device.driver].add(machine.name)
                merge(found[device.driver], telemetry_features(device, machine))
    for machine in sorted(p for p in (TESTDATA / "proc").iterdir() if (p / "proc").is_dir()):
        devices = {d.id: d for d in discovery.discover(machine)}
        for client in fdinfo.FdinfoReader(devices.values(), machine).scan().clients:
            driver = devices[client.device].driver if client.device in devices else None
            if driver:
                machines[driver].add(f"proc/{machine.name}")
                merge(found[driver], fdinfo_features(client))
    return found, machines


def merge(into: dict[str, str], new: dict[str, str]) -> None:
    """One tree that has a feature is enough: another may hold an idle client, a display-only
    device or a sensor-less board of the same driver."""
    for feature, value in new.items():
        if into.get(feature, "-") == "-":
            into[feature] = value


def telemetry_features(device: discovery.Device, root: Path) -> dict[str, str]:
    reading = sysfs.read_device(device, root)
    specs = {spec.name for spec, _, _ in reading.values}
    power = "hw.power" in specs
    energy = reading.energy_uj is not None
    return {
        "power": "hwmon" if power else ("from energy" if energy else "-"),
        "energy": "counter" if energy else ("integrated power" if power else "-"),
        "temperature": "yes" if "hw.temperature" in specs else "-",
        "clocks": "yes" if "kubenpu.device.frequency" in specs else "-",
    }


def fdinfo_features(client: fdinfo.Client) -> dict[str, str]:
    fields = {f for stats in client.engines.values() for f in stats}
    time = "ns" if "busy_ns" in fields else ("cycles" if "cycles" in fields else "-")
    return {"fdinfo time": time, "fdinfo memory": "yes" if client.memory else "-"}


def calls(vendor: vendors.Vendor) -> str:
    kinds = [i.kind for i in vendor.ioctls]
    return " / ".join(str(kinds.count(k)) for k in vendors.Kind)


def allocation(drivers: tuple[str, ...]) -> str:
    plugins = [p.plugin for p in PLUGINS if set(p.drivers) & set(drivers)]
    return ", ".join(plugins) if plugins else "fallback"


def rows() -> list[list[str]]:
    found, machines = recorded()
    out = []
    listed: set[str] = set()
    for vendor in vendors.all_vendors():
        listed.update(vendor.drivers)
        out.append(row(f"`{vendor.name}`", vendor.drivers, calls(vendor), found, machines))
    for driver in sorted(set(machines) - listed):
        out.append(row("-", (driver,), "not counted", found, machines))
    return out


def row(name: str, drivers: tuple[str, ...], counted: str, found, machines) -> list[str]:
    values = {f: NOT_RECORDED for f in FEATURES}
    trees: set[str] = set()
    for driver in drivers:
        values.update(found.get(driver, {}))
        trees |= machines.get(driver, set())
    return [
        name,
        ", ".join(f"`{d}`" for d in drivers),
        counted,
        *(values[f] for f in FEATURES),
        allocation(drivers),
        ", ".join(f"`{t}`" for t in sorted(trees)) or "-",
    ]


HEADER = """# Drivers and features

Generated by `scripts/drivers.py` from the code's own tables; `tests/test_drivers_doc.py` fails
when this page and the code disagree. Do not edit it: change the code or the recorded trees and
re-run the script.

- **calls**: the ioctls the vendor plug-in counts, `submit / alloc / wait`
  ([vendors.md](vendors.md)); a driver without a plug-in is not counted (its devices are still
  listed, and its fdinfo and sysfs are still read).
- **fdinfo time, fdinfo memory**: what the agent's fdinfo reader gets from the driver's
  `/proc/PID/fdinfo` ([fdinfo.md](fdinfo.md)): `ns` (`drm-engine-*`), `cycles`
  (`drm-cycles-*`, shares from the driver's clock), `yes` (`drm-resident-*` and the other
  memory keys).
- **power, energy, temperature, clocks**: what its telemetry reader gets from the driver's hwmon
  device and own sysfs files ([metrics.md](metrics.md#device-telemetry-sysfs-hwmon)): power from
  `hwmon` or derived `from energy`; energy from the driver's `counter` or `integrated power`.
- **allocation mapping**: the device plugin whose id format maps an allocation to the device
  ([allocations.md](allocations.md)); `fallback`: a PCI address or node name found in the id.
- **recorded from**: the trees under `tests/testdata` these columns were read from, each copied
  from the driver's kernel source (the tree's README cites it). `-`: none of those trees has it
  (the readers are generic: a board that has it, such as a discrete i915 card with a hwmon
  device, is read the same way); `?`: there is no recorded tree of that kind for the driver, so
  nothing is claimed.

"""


def render() -> str:
    head = ["vendor", "sysfs drivers", "calls", *FEATURES, "allocation mapping", "recorded from"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows()]
    return HEADER + "\n".join(lines) + "\n"


def main() -> None:
    logging.disable(logging.WARNING)  # the recorded trees' own oddities, logged by discovery
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "drivers.md"
    out.write_text(render())


if __name__ == "__main__":
    main()
