// KubeNPU / Agents: how the agents themselves fare (losses, errors, delays, what they skip).
local g = import 'kubenpu.libsonnet';

local node = 'node=~"$node"';

g.dashboard(
  'kubenpu-agents',
  'KubeNPU / Agents',
  'The health of the KubeNPU agents: events received and dropped, CRI and kubelet errors, series, exports, and what they skipped.',
  g.variables(['node'], 'kubenpu_device_info'),
  [
    g.timeseries(
      'Events received per second',
      [g.target('sum by (node) (rate(kubenpu_events_received_total{%s}[$__rate_interval]))' % node,
                '{{node}}')],
      'reqps',
      g.pos(0, 0, 12, 8),
    ),
    g.timeseries(
      'Dropped events by reason',
      [g.target('sum by (node, reason) (rate(kubenpu_events_dropped_total{%s}[$__rate_interval]))' % node,
                '{{node}} {{reason}}')],
      'reqps',
      g.pos(12, 0, 12, 8),
      'Calls that were lost: ringbuf_full (kernel ring buffer), map_full (kernel counts map), queue_full (keys per batch), device_unknown, bad_record (undecodable record).',
    ),
    g.timeseries(
      'CRI errors per second',
      [g.target('sum by (node) (rate(kubenpu_cri_errors_total{%s}[$__rate_interval]))' % node,
                '{{node}}')],
      'reqps',
      g.pos(0, 8, 8, 8),
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
      g.pos(8, 8, 8, 8),
    ),
    g.timeseries(
      'Cgroup index rebuilds',
      [g.target('sum by (node) (increase(kubenpu_cgroup_index_rebuilds_total{%s}[$__rate_interval]))' % node,
                '{{node}}')],
      'short',
      g.pos(16, 8, 8, 8),
    ),
    g.timeseries(
      'Series held and overflow',
      [
        g.target('sum by (node) (kubenpu_ioctl_series{%s})' % node, '{{node}} series'),
        g.target('sum by (node) (rate(kubenpu_overflow_calls_total{%s}[$__rate_interval]))' % node,
                 '{{node}} overflowed calls/s', refId='B'),
      ],
      'short',
      g.pos(0, 16, 12, 8),
      'Series over metrics.max_series fold into one otel.metric.overflow="true" series.',
      units={ B: 'reqps' },
    ),
    g.timeseries(
      'OTLP export errors',
      [g.target('sum by (node) (increase(kubenpu_otlp_export_errors_total{%s}[$__rate_interval]))' % node,
                '{{node}}')],
      'short',
      g.pos(12, 16, 12, 8),
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
      g.pos(0, 24, 24, 8),
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
      g.pos(0, 32, 24, 8),
      'Allocated ids that map to no device, by reason (kubenpuctl allocations lists them), and failed requests to the kubelet (attribution.pod_resources; docs/allocations.md).',
    ),
    g.timeseries(
      'Telemetry files skipped, by reason',
      [g.target('sum by (node, reason) (increase(kubenpu_telemetry_skipped_total{%s}[$__rate_interval]))' % node,
                '{{node}} {{reason}}')],
      'short',
      g.pos(0, 40, 12, 8),
      'missing: a driver file this kernel lacks; unreadable: hwmon answered an error (sensor off); counter_reset: the energy counter went down to a value a restart explains; counter_implausible: it stepped further than the device power allows (no energy counted).',
    ),
    g.timeseries(
      'fdinfo items skipped, by reason',
      [g.target('sum by (node, reason) (rate(kubenpu_fdinfo_skipped_total{node=~"$node"}[$__rate_interval]))',
                '{{node}} {{reason}}')],
      'ops',
      g.pos(12, 40, 12, 8),
      'unreadable: no ptrace-read access (see the chart value fdinfo.enabled). no_client_id: drivers without usage stats (vgem, virtio_gpu).',
    ),
    g.timeseries(
      'GPU job events lost, by reason',
      [g.target('sum by (node, reason) (rate(kubenpu_jobs_lost_total{node=~"$node"}[$__rate_interval]))',
                '{{node}} {{reason}}')],
      'ops',
      g.pos(0, 48, 24, 8),
      'unmatched: a job queued before the jobs probe attached (expected after a start). keys_full: the kernel table of {cgroup, ring} is full, jobs not timed.',
    ),
  ],
)
