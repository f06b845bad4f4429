// The agent's alerts: the same groups as deploy/helm/kubenpu/files/rules.yaml (a test compares).
{
  groups: [
    {
      name: 'kubenpu',
      rules: [
        {
          alert: 'KubeNPUAgentDown',
          expr: 'up{job="kubenpu"} == 0',
          'for': '5m',
          labels: { severity: 'warning' },
          annotations: {
            summary: 'KubeNPU agent on {{ $labels.node }} is down',
            description: 'Prometheus could not scrape the KubeNPU agent {{ $labels.instance }} on node'
                         + ' {{ $labels.node }} for 5 minutes: GPU and NPU calls on that node go uncounted.',
          },
        },
        {
          alert: 'KubeNPUEventsDropped',
          expr: 'sum by (node, reason) (rate(kubenpu_events_dropped_total[5m])) > 0',
          'for': '10m',
          labels: { severity: 'warning' },
          annotations: {
            summary: 'KubeNPU agent on {{ $labels.node }} drops events ({{ $labels.reason }})',
            description: 'The agent on {{ $labels.node }} lost {{ $value | humanize }} calls/s for 10 minutes'
                         + ' (reason {{ $labels.reason }}): counts undercount. ringbuf_full: raise'
                         + ' probe.ringbuf_pages; queue_full: raise probe.queue_size or the CPU limit.',
          },
        },
        {
          alert: 'KubeNPUAttributionFailing',
          expr: |||
            sum by (node) (rate(kubenpu_unattributed_calls_total{reason!="not_pod"}[10m]))
              / sum by (node) (rate(kubenpu_ioctl_total[10m]))
              > 0.1
          |||,
          'for': '15m',
          labels: { severity: 'warning' },
          annotations: {
            summary: 'KubeNPU cannot name the pod of many calls on {{ $labels.node }}',
            description: '{{ $value | humanizePercentage }} of the calls on {{ $labels.node }} are counted'
                         + ' without their pod (not_indexed, container_not_found or cri_error) for 15 minutes.'
                         + ' Check the cgroup mount and attribution.cri.endpoint.',
          },
        },
        {
          alert: 'KubeNPUCRIUnreachable',
          expr: 'sum by (node) (rate(kubenpu_cri_errors_total[5m])) > 0',
          'for': '15m',
          labels: { severity: 'warning' },
          annotations: {
            summary: 'KubeNPU agent on {{ $labels.node }} gets CRI errors',
            description: 'CRI requests from the agent on {{ $labels.node }} have failed for 15 minutes:'
                         + ' new containers stay unattributed. Check criSocketDir and'
                         + ' attribution.cri.endpoint.',
          },
        },
      ],
    },
  ],
}
