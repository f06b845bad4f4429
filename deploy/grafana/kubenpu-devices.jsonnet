// KubeNPU / Devices and agents: what each node has, what it served, and how the agents fare.
local g = import 'kubenpu.libsonnet';

local node = 'node=~"$node"';

g.dashboard(
  'kubenpu-devices',
  'KubeNPU / Devices and agents',
  'GPU and NPU devices per node, their call totals, and the health of the KubeNPU agents.',
  g.variables(['node'], 'kubenpu_device_info'),
  [
    g.table(
      'Devices',
      [g.target('max by (node, device, vendor, driver, pci_id, numa_node) (kubenpu_device_info{%s})' % node,
                instant=true)],
      g.pos(0, 0, 24, 8),
      hide=['Time', 'Value'],
      description='Every device the agents count, with its driver and NUMA node.',
    ),
    g.timeseries(
      'Calls per second per device',
      [g.target('sum by (node, device) (rate(kubenpu_ioctl_total{%s}[$__rate_interval]))' % node,
                '{{node}} {{device}}')],
      'reqps',
      g.pos(0, 8, 12, 9),
    ),
    g.table(
      'Calls per device over the time range, by kind',
      [g.target('sum by (node, device, kind) (increase(kubenpu_ioctl_total{%s}[$__range]))' % node,
                instant=true)],
      g.pos(12, 8, 12, 9),
    ),
    g.timeseries(
      'Dropped events by reason',
      [g.target('sum by (node, reason) (rate(kubenpu_events_dropped_total{%s}[$__rate_interval]))' % node,
                '{{node}} {{reason}}')],
      'reqps',
      g.pos(0, 17, 8, 8),
      'Calls that were lost: ringbuf_full (kernel ring buffer), map_full (kernel counts map), queue_full (keys per batch), device_unknown, bad_record (undecodable record).',
    ),
    g.timeseries(
      'CRI errors per second',
      [g.target('sum by (node) (rate(kubenpu_cri_errors_total{%s}[$__rate_interval]))' % node,
                '{{node}}')],
      'reqps',
      g.pos(8, 17, 8, 8),
    ),
    g.timeseries(
      'Cgroup index rebuilds',
      [g.target('sum by (node) (increase(kubenpu_cgroup_index_rebuilds_total{%s}[$__rate_interval]))' % node,
                '{{node}}')],
      'short',
      g.pos(16, 17, 8, 8),
    ),
    g.timeseries(
      'CRI request latency (p50, p99)',
      [
        g.target('histogram_quantile(0.5, sum by (node, le) (rate(kubenpu_cri_request_duration_seconds_bucket{%s}[$__rate_interval])))' % node,
                 '{{node}} p50'),
        g.target('histogram_quantile(0.99, sum by (node, le) (rate(kubenpu_cri_request_duration_seconds_bucket{%s}[$__rate_interval])))' % node,
                 '{{node}} p99', refId='B'),
      ],
      's',
      g.pos(0, 25, 12, 8),
    ),
    g.timeseries(
      'Events received per second',
      [g.target('sum by (node) (rate(kubenpu_events_received_total{%s}[$__rate_interval]))' % node,
                '{{node}}')],
      'reqps',
      g.pos(12, 25, 12, 8),
    ),
    g.timeseries(
      'Series held and overflow',
      [
        g.target('sum by (node) (kubenpu_ioctl_series{%s})' % node, '{{node}} series'),
        g.target('sum by (node) (rate(kubenpu_overflow_calls_total{%s}[$__rate_interval]))' % node,
                 '{{node}} overflowed calls/s', refId='B'),
      ],
      'short',
      g.pos(0, 33, 12, 8),
      'Series over metrics.max_series fold into one otel.metric.overflow="true" series.',
    ),
    g.timeseries(
      'OTLP export errors',
      [g.target('sum by (node) (increase(kubenpu_otlp_export_errors_total{%s}[$__rate_interval]))' % node,
                '{{node}}')],
      'short',
      g.pos(12, 33, 12, 8),
    ),
    g.timeseries(
      'Agent faults and delays',
      [
        g.target('sum by (node) (increase(kubenpu_probe_read_errors_total{%s}[$__rate_interval]))' % node,
                 '{{node}} failed kernel reads'),
        g.target('sum by (node) (increase(kubenpu_sightings_late_total{%s}[$__rate_interval]))' % node,
                 '{{node}} late first sightings', refId='B'),
        g.target('sum by (node) (increase(kubenpu_pending_expired_calls_total{%s}[$__rate_interval]))' % node,
                 '{{node}} calls unattributed after pending_seconds', refId='C'),
      ],
      'short',
      g.pos(0, 41, 24, 8),
      'Nothing here loses a call: failed reads are retried, late sightings resolve at the next map read, expired pending calls are counted without pod labels.',
    ),
    g.timeseries(
      'Allocations: unmapped ids and kubelet errors',
      [
        g.target('sum by (node, resource, reason) (kubenpu_allocations_unmapped{%s})' % node,
                 '{{node}} {{resource}} {{reason}}'),
        g.target('sum by (node) (increase(kubenpu_podresources_errors_total{%s}[$__rate_interval]))' % node,
                 '{{node}} PodResources errors', refId='B'),
      ],
      'short',
      g.pos(0, 49, 24, 8),
      'Allocated ids that map to no device, by reason (kubenpuctl allocations lists them), and failed requests to the kubelet (attribution.pod_resources; docs/allocations.md).',
    ),
  ],
)
