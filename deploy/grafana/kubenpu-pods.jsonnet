// KubeNPU / Pods: what each pod uses of its devices (time, memory, power, idle allocations),
// then how it calls their drivers.
local g = import 'kubenpu.libsonnet';

// `node` is on every series: from the ServiceMonitor's relabeling when Prometheus scrapes the
// agents, from the k8s.node.name resource attribute when they push through the Collector.
local sel = 'node=~"$node", namespace=~"$namespace", pod!=""';

// The p99 of a kernel-bucketed histogram: classic `_bucket` series when Prometheus scrapes the
// agents, a native histogram when the Collector writes their push (OTLP's exponential
// histograms); each path finds one arm of the `or`.
// Both halves of a pod's queue wait (behind pods, on an idle ring): their sum is the wait.
local waits = 'kubenpu_job_wait_behind_seconds_total|kubenpu_job_wait_idle_seconds_total';

local p99(metric, by) =
  'histogram_quantile(0.99, sum by (%s, le) (rate(%s_bucket{%s}[$__rate_interval])) or sum by (%s) (rate(%s{%s}[$__rate_interval])))'
  % [by, metric, sel, by, metric, sel];

g.dashboard(
  'kubenpu-pods',
  'KubeNPU / Pods',
  'Per-pod device time, memory, power and idle allocations, and the submit, alloc and wait calls pods make to GPU and NPU drivers.',
  // Namespaces whose pods call or hold an allocation: a pod that holds a device idle calls nothing.
  g.variables(['node', 'namespace'], '{__name__=~"kubenpu_ioctl_total|kubenpu_device_allocated"}'),
  [
    g.timeseries(
      'Device busy % by pod',
      [
        g.target('100 * sum by (namespace, pod, device, engine) (rate(kubenpu_engine_busy_seconds_total{%s}[$__rate_interval])) / max by (namespace, pod, device, engine) (kubenpu_engine_capacity{%s})' % [sel, sel],
                 '{{namespace}}/{{pod}} {{device}} {{engine}}'),
        g.target('100 * sum by (namespace, pod, device, engine) (rate(kubenpu_engine_cycles_total{%s}[$__rate_interval])) / sum by (namespace, pod, device, engine) (rate(kubenpu_engine_cycles_elapsed_total{%s}[$__rate_interval]))' % [sel, sel],
                 '{{namespace}}/{{pod}} {{device}} {{engine}} (cycles)', refId='B'),
      ],
      'percent',
      g.pos(0, 0, 12, 10),
      'Device time from DRM fdinfo (drivers that print usage stats): A, busy seconds per second over the engine class capacity; B, for drivers that count cycles instead of time (xe), busy cycles over elapsed cycles.',
    ),
    g.timeseries(
      'Device memory by pod',
      [g.target('sum by (namespace, pod, device, region, state) (kubenpu_memory_bytes{%s})' % sel,
                '{{namespace}}/{{pod}} {{device}} {{region}} {{state}}')],
      'bytes',
      g.pos(12, 0, 12, 10),
      'Memory the pod\'s DRM clients hold, per region and state, from DRM fdinfo.',
    ),
    g.timeseries(
      'Power by pod (energy split)',
      [g.target('sum by (namespace, pod, device) (rate(kubenpu_energy_joules_total{%s}[$__rate_interval]))' % sel,
                '{{namespace}}/{{pod}} {{device}}'),
       g.target('sum by (node, device) (rate(kubenpu_device_energy_idle_joules_total{node=~"$node"}[$__rate_interval]))',
                '{{node}} {{device}} idle', refId='B'),
       g.target('sum by (node, device) (rate(kubenpu_device_energy_unattributed_joules_total{node=~"$node"}[$__rate_interval]))',
                '{{node}} {{device}} unattributed', refId='C')],
      'watt',
      g.pos(0, 10, 12, 10),
      "Each pod's share of its device's measured energy, split by engine busy time every fdinfo interval (docs/metrics.md#energy-per-pod); J/s is W. Pods, idle and unattributed add up to the device's power.",
    ),
    g.table(
      'Energy by pod over the time range',
      [g.target('sum by (node, namespace, pod, device) (increase(kubenpu_energy_joules_total{%s}[$__range]))' % sel,
                instant=true)],
      g.pos(12, 10, 12, 10),
      columns={ A: ['energy', 'joule'] },
      description="The pod's share of its devices' energy over the dashboard's time range.",
    ),
    g.table(
      'Allocated vs used by pod and device',
      [
        g.target('sum by (node, namespace, pod, container, device, resource) (kubenpu_device_allocated{%s})' % sel,
                 instant=true, refId='A'),
        g.target('sum by (node, namespace, pod, container, device) (rate(kubenpu_ioctl_total{%s, kind="submit"}[$__rate_interval]))' % sel,
                 instant=true, refId='B'),
        g.target('sum by (node, namespace, pod, container, device, resource) (rate(kubenpu_device_allocated_idle_seconds_total{%s}[$__rate_interval]))' % sel,
                 instant=true, refId='C'),
        g.target('max by (node, namespace, pod, container, device, resource) (kubenpu_device_allocated_idle_for_seconds{%s})' % sel,
                 instant=true, refId='D'),
      ],
      g.pos(0, 20, 24, 10),
      columns={
        A: ['shares allocated', 'short'],
        B: ['submit calls/s', 'reqps'],
        C: ['idle', 'percentunit'],
        D: ['idle for', 's'],
      },
      description='From the kubelet (attribution.pod_resources): shares allocated, submit calls per second, the fraction of the time idle (100%: held and unused, docs/metrics.md) and the time idle without a break. A row with calls but no shares: calls on a device not allocated to the pod.',
    ),
    g.timeseries(
      'Calls per second by pod and kind',
      [g.target('sum by (namespace, pod, kind) (rate(kubenpu_ioctl_total{%s}[$__rate_interval]))' % sel,
                '{{namespace}}/{{pod}} {{kind}}')],
      'reqps',
      g.pos(0, 30, 24, 10),
      'submit: work queued to the device; alloc: buffer objects created; wait: waits on fences.',
    ),
    g.table(
      'Top pods per device',
      [g.target('topk by (node, device) (5, sum by (node, device, namespace, pod) (rate(kubenpu_ioctl_total{%s}[$__rate_interval])))' % sel,
                instant=true)],
      g.pos(0, 40, 12, 10),
      columns={ A: ['calls/s', 'reqps'] },
      description='The five pods calling each device most, in calls per second.',
    ),
    g.timeseries(
      'Calls per second by device and kind',
      [g.target('sum by (node, device, kind) (rate(kubenpu_ioctl_total{%s}[$__rate_interval]))' % sel,
                '{{node}} {{device}} {{kind}}')],
      'reqps',
      g.pos(12, 40, 12, 10),
    ),
    g.table(
      'Calls on devices not allocated',
      [g.target('sum by (node, namespace, pod, container, device) (kubenpu_device_unallocated_calls_total{%s})' % sel,
                instant=true)],
      g.pos(0, 50, 8, 8),
      columns={ A: ['submit calls', 'short'] },
      description='Submit calls of containers on a device some allocation on the node names, made without being allocated it (counted in the call series all the same).',
    ),
    g.table(
      'Device access denied by the guard',
      [g.target('sum by (node, namespace, pod, device, operation, mode) (increase(kubenpu_device_access_denied_total{%s}[$__range]))' % sel,
                instant=true)],
      g.pos(8, 50, 8, 8),
      columns={ A: ['accesses', 'short'] },
      description='Opens, fd receipts and ioctls of a device the access guard denied a pod over the range (mode enforce: EPERM), or would have denied (mode audit: allowed): the kubelet did not allocate the device to the pod and no allow rule names it (docs/guard.md). Empty while the guard is off.',
    ),
    g.table(
      'Guard policy',
      [g.target('sum by (node, namespace, pod, device, mode, access) (kubenpu_device_access_policy{%s})' % sel,
                instant=true)],
      g.pos(16, 50, 8, 8),
      columns={ A: ['pods', 'short'] },
      description='The access guard policy at its last refresh, per guarded pod and device: allocated (the kubelet allocated it), allow_rule (guard.allow names it) or denied (EPERM in enforce, counted in audit). Empty while the guard is off; kubenpuctl guard shows the same per node.',
    ),
    g.timeseries(
      'Calls without a pod, by reason',
      [g.target('sum by (node, reason) (rate(kubenpu_unattributed_calls_total{node=~"$node"}[$__rate_interval]))',
                '{{node}} {{reason}}')],
      'reqps',
      g.pos(0, 58, 24, 8),
      'not_pod: host processes (expected). not_indexed, container_not_found, cri_error: attribution failing.',
    ),
    // GPU jobs from the DRM GPU scheduler (docs/jobs.md): the queue wait against the run time
    // says whether a pod is slow behind others' jobs or on the device itself.
    g.timeseries(
      'GPU job queue wait p99 by pod',
      [g.target(p99('kubenpu_job_wait_duration_seconds', 'namespace, pod, device, ring'),
                '{{namespace}}/{{pod}} {{device}} {{ring}}')],
      's',
      g.pos(0, 66, 12, 8),
      'From queued to running on the ring: the time a pod\'s jobs wait behind other jobs (and on their dependencies). High here with a low run time: contention.',
    ),
    g.timeseries(
      'GPU job run time p99 by pod',
      [g.target(p99('kubenpu_job_run_duration_seconds', 'namespace, pod, device, ring'),
                '{{namespace}}/{{pod}} {{device}} {{ring}}')],
      's',
      g.pos(12, 66, 12, 8),
      'From the scheduler handing a job to the driver to its fence signalling done: the time on the device.',
    ),
    g.timeseries(
      'GPU jobs per second by pod',
      [g.target('sum by (namespace, pod, device) (rate(kubenpu_jobs_total{%s}[$__rate_interval]))' % sel,
                '{{namespace}}/{{pod}} {{device}}')],
      'ops',
      g.pos(0, 74, 12, 8),
    ),
    g.timeseries(
      'GPU jobs in flight by pod',
      [g.target('sum by (namespace, pod, device) (kubenpu_jobs_in_flight{%s})' % sel,
                '{{namespace}}/{{pod}} {{device}}')],
      'short',
      g.pos(12, 74, 12, 8),
      'Queued and not done at the last read.',
    ),
    g.timeseries(
      'GPU device resets by pod: hung, and work lost',
      [
        g.target('sum by (namespace, pod, device) (increase(kubenpu_pod_device_hangs_total{%s}[$__rate_interval]))' % sel,
                 '{{namespace}}/{{pod}} hung {{device}}'),
        g.target('sum by (namespace, pod, device) (increase(kubenpu_pod_device_reset_victim_total{%s}[$__rate_interval]))' % sel,
                 '{{namespace}}/{{pod}} lost work on {{device}}', refId='B'),
      ],
      'short',
      g.pos(0, 82, 24, 8),
      'hung: the reset whose guilty task (the kernel names it) was the pod\'s. lost work: the pod had jobs in flight on the device at a reset (docs/jobs.md#hangs).',
    ),
    // Who is in my way (docs/jobs.md#who-is-in-my-way): each pod's queue wait on a ring split
    // over the pods whose jobs ran there meanwhile, and the wait on an idle ring. Per pod and
    // ring the two counters sum to the wait histogram's sum; dividing by them, not by `_sum`,
    // reads the same on both paths (the Collector writes the histogram as a native one).
    g.row('Who is in my way', 90),
    g.timeseries(
      'Share of queue wait behind each pod, per device and ring',
      [g.target('sum by (namespace, pod, device, ring, behind_namespace, behind_pod) (rate(kubenpu_job_wait_behind_seconds_total{%s}[$__rate_interval])) / on (namespace, pod, device, ring) group_left () sum by (namespace, pod, device, ring) (rate({__name__=~"%s", %s}[$__rate_interval]))' % [sel, waits, sel],
                '{{namespace}}/{{pod}} behind {{behind_namespace}}/{{behind_pod}} {{device}} {{ring}}')],
      'percentunit',
      g.pos(0, 91, 24, 8),
      'Of each pod\'s GPU job queue wait on a ring, the share spent while another pod\'s jobs (or its own) ran there, split evenly over the jobs running at once. behind /other: the pods past the agent\'s cap of pairs per ring. kubenpuctl contention DEVICE lists the pairs of one device.',
    ),
    g.timeseries(
      'Share of queue wait on an idle ring',
      [g.target('sum by (namespace, pod, device, ring) (rate(kubenpu_job_wait_idle_seconds_total{%s}[$__rate_interval])) / sum by (namespace, pod, device, ring) (rate({__name__=~"%s", %s}[$__rate_interval]))' % [sel, waits, sel],
                '{{namespace}}/{{pod}} {{device}} {{ring}}')],
      'percentunit',
      g.pos(0, 99, 24, 8),
      'Of each pod\'s queue wait, the share while no job ran on the ring: the jobs waited on their dependencies, not behind anyone.',
    ),
    g.timeseries(
      'Queue wait behind each pod, seconds per second',
      [g.target('sum by (namespace, pod, device, ring, behind_namespace, behind_pod) (rate(kubenpu_job_wait_behind_seconds_total{%s}[$__rate_interval]))' % sel,
                '{{namespace}}/{{pod}} behind {{behind_namespace}}/{{behind_pod}} {{device}} {{ring}}')],
      'percentunit',
      g.pos(0, 107, 24, 8),
      'Seconds per second each pod\'s jobs waited behind each pod (100%: one job of the pod waiting the whole time, or two half of it): how much the shares above weigh.',
    ),
    // Placement (docs/placement.md): the calls made from a CPU on another NUMA node than the
    // device's. Devices without a NUMA node have no remote series, so no line here.
    g.row('Placement', 115),
    g.timeseries(
      'Share of calls from another NUMA node, by pod and device',
      [g.target('sum by (node, namespace, pod, device) (rate(kubenpu_ioctl_remote_node_total{%s}[$__rate_interval])) / sum by (node, namespace, pod, device) (rate(kubenpu_ioctl_total{%s}[$__rate_interval]))' % [sel, sel],
                '{{node}} {{namespace}}/{{pod}} {{device}}')],
      'percentunit',
      g.pos(0, 116, 24, 8),
      'Of each pod\'s calls on a device, the share made from CPUs on another NUMA node than the device\'s: each pays the interconnect. Near 100% for 15 minutes fires KubeNPUPodCallsRemote; kubenpuctl placement names the pod\'s CPUs, the device\'s and the fix.',
    ),
  ],
)
