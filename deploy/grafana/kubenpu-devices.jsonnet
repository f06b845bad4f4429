// KubeNPU / Devices: what each node has, how hot, busy and power-hungry it runs, and what it served.
local g = import 'kubenpu.libsonnet';

local node = 'node=~"$node"';

g.dashboard(
  'kubenpu-devices',
  'KubeNPU / Devices',
  'GPU and NPU devices per node: power, temperature, voltage, memory, clocks and throttling from sysfs/hwmon, and their call totals.',
  g.variables(['node'], 'kubenpu_device_info'),
  [
    g.table(
      'Devices',
      [g.target('max by (node, device, vendor, driver, pci_id, numa_node) (kubenpu_device_info{%s})' % node,
                instant=true)],
      g.pos(0, 0, 24, 6),
      hide=['Time', 'Value'],
      description='Every device the agents count, with its driver and NUMA node.',
    ),
    g.timeseries(
      'Device power and limits',
      [
        g.target('max by (node, device, sensor, source) (kubenpu_device_power_watts{%s})' % node,
                 '{{node}} {{device}} {{sensor}} ({{source}})'),
        g.target('max by (node, device, sensor, limit) (kubenpu_device_power_limit_watts{%s})' % node,
                 '{{node}} {{device}} {{sensor}} {{limit}} limit', refId='B'),
        g.target('sum by (node, device) (rate(kubenpu_device_energy_joules_total{%s}[$__rate_interval]))' % node,
                 '{{node}} {{device}} energy rate', refId='C'),
      ],
      'watt',
      g.pos(0, 6, 12, 8),
      'From sysfs/hwmon (docs/metrics.md#device-telemetry-sysfs-hwmon). source=derived: the energy counter over the last interval (i915, xe have no power file).',
    ),
    g.timeseries(
      'Device temperature',
      [g.target('max by (node, device, sensor) (kubenpu_device_temperature_celsius{%s})' % node,
                '{{node}} {{device}} {{sensor}}')],
      'celsius',
      g.pos(12, 6, 12, 8),
    ),
    g.timeseries(
      'Device memory used and busy (driver)',
      [
        g.target('max by (node, device, region) (kubenpu_device_memory_used_bytes{%s}) / max by (node, device, region) (kubenpu_device_memory_limit_bytes{%s})' % [node, node],
                 '{{node}} {{device}} {{region}} memory used'),
        g.target('max by (node, device, task) (kubenpu_device_utilization_ratio{%s})' % node,
                 '{{node}} {{device}} {{task}} busy', refId='B'),
        g.target('sum by (node, device) (rate(kubenpu_device_busy_seconds_total{%s}[$__rate_interval]))' % node,
                 '{{node}} {{device}} busy (npu_busy_time_us)', refId='C'),
        g.target('max by (node, device) (kubenpu_device_memory_busy_ratio{%s})' % node,
                 '{{node}} {{device}} memory controller busy', refId='D'),
      ],
      'percentunit',
      g.pos(0, 14, 12, 8),
      "The driver's own view of the whole device (amdgpu, intel_vpu); per pod, see the Pods dashboard.",
    ),
    g.timeseries(
      'Device voltage',
      [g.target('max by (node, device, sensor) (kubenpu_device_voltage_volts{%s})' % node,
                '{{node}} {{device}} {{sensor}}')],
      'volt',
      g.pos(12, 14, 12, 8),
    ),
    g.timeseries(
      'Device clocks',
      [g.target('max by (node, device, domain, state) (kubenpu_device_frequency_hertz{%s})' % node,
                '{{node}} {{device}} {{domain}} {{state}}')],
      'hertz',
      g.pos(0, 22, 12, 8),
    ),
    g.timeseries(
      'Device throttling',
      [g.target('max by (node, device, reason) (kubenpu_device_throttle_ratio{%s, reason!="status"}) > 0' % node,
                '{{node}} {{device}} throttled: {{reason}}')],
      'bool_on_off',
      g.pos(12, 22, 12, 8),
      'Throttle reasons (i915, xe): 1 while the driver reports them.',
    ),
    g.timeseries(
      'Calls per second per device',
      [g.target('sum by (node, device) (rate(kubenpu_ioctl_total{%s}[$__rate_interval]))' % node,
                '{{node}} {{device}}')],
      'reqps',
      g.pos(0, 30, 12, 9),
    ),
    g.table(
      'Calls per device over the time range, by kind',
      [g.target('sum by (node, device, kind) (increase(kubenpu_ioctl_total{%s}[$__range]))' % node,
                instant=true)],
      g.pos(12, 30, 12, 9),
      columns={ A: ['calls', 'short'] },
    ),
  ],
)
