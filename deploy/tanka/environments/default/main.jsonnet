// tk apply deploy/tanka/environments/default   (set spec.apiServer in spec.json first)
local kubenpu = import 'kubenpu/kubenpu.libsonnet';

kubenpu {
  // Any key of the Helm chart's values.yaml, with the same meaning and default.
  _config+:: {
    // Push to the Collector of deploy/otel, which runs in the same namespace.
    config: { export: { otlp: { enabled: true } } },
    priorityClassName: 'system-node-critical',
  },
}
