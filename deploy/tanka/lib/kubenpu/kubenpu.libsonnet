// The KubeNPU agent for Tanka: the same objects as the Helm chart (deploy/helm/kubenpu).
// `_config` has exactly the keys and defaults of the chart's values.yaml, so a values
// override translates one to one; tests/test_deploy.py renders both and compares them.
local rules = import 'rules.libsonnet';

{
  _config:: {
    image: {
      repository: 'kubenpu/kubenpu-agent',
      tag: '0.1.0',
      pullPolicy: 'IfNotPresent',
    },
    imagePullSecrets: [],
    criSocketDir: '/run/containerd',
    config: {
      node_name: '',
      log_level: 'info',
      probe: { mode: 'aggregate', attach: 'auto', ringbuf_pages: 256, queue_size: 65536 },
      discovery: { root: '/host', ignore_devices: [] },
      attribution: {
        cgroup_root: '/host/sys/fs/cgroup',
        cri: {
          endpoint: 'unix:///run/containerd/containerd.sock',
          timeout_seconds: 2,
          retry_after_seconds: 30,
        },
      },
      metrics: { series_ttl_seconds: 300, max_series: 10000 },
      export: {
        prometheus: { enabled: true, host: '0.0.0.0', port: 8080 },
        otlp: {
          enabled: false,
          endpoint: 'http://kubenpu-otel-collector:4317',
          protocol: 'grpc',
          headers: {},
          insecure: null,
          certificate: '',
          client_certificate: '',
          client_key: '',
          interval_seconds: 15,
          timeout_seconds: 10,
        },
      },
    },
    extraEnv: [],
    resources: {
      requests: { cpu: '100m', memory: '256Mi' },
      limits: { memory: '512Mi' },
    },
    seccompProfile: { type: 'RuntimeDefault' },
    nodeSelector: { 'kubernetes.io/os': 'linux' },
    tolerations: [{ operator: 'Exists' }],
    affinity: {},
    priorityClassName: '',
    podAnnotations: {},
    serviceMonitor: { enabled: false, interval: '30s', labels: {} },
    prometheusRule: { enabled: false, labels: {} },
  },

  local c = $._config,
  local name = 'kubenpu',
  local labels = { 'app.kubernetes.io/name': 'kubenpu', 'app.kubernetes.io/instance': name },
  local metrics = c.config.export.prometheus.enabled,
  // Read-only hostPath volumes, with the reason for each in the chart's daemonset.yaml.
  local hostMounts = [
    { name: 'sys', path: '/sys', mountPath: '/host/sys' },
    { name: 'cgroup', path: '/sys/fs/cgroup', mountPath: '/host/sys/fs/cgroup' },
    { name: 'dev', path: '/dev', mountPath: '/host/dev' },
    { name: 'cri', path: c.criSocketDir, mountPath: c.criSocketDir },
    { name: 'modules', path: '/lib/modules', mountPath: '/lib/modules' },
    { name: 'usr-src', path: '/usr/src', mountPath: '/usr/src' },
  ],
  local probe(period) = { httpGet: { path: '/metrics', port: 'metrics' }, periodSeconds: period },

  kubenpu: {
    configMap: {
      apiVersion: 'v1',
      kind: 'ConfigMap',
      metadata: { name: name + '-config', labels: labels },
      data: { 'config.yaml': std.manifestYamlDoc(c.config) },
    },

    daemonSet: {
      apiVersion: 'apps/v1',
      kind: 'DaemonSet',
      metadata: { name: name, labels: labels },
      spec: {
        selector: { matchLabels: labels },
        updateStrategy: { type: 'RollingUpdate' },
        template: {
          metadata: { labels: labels }
                    + (if c.podAnnotations != {} then { annotations: c.podAnnotations } else {}),
          spec: {
            automountServiceAccountToken: false,
            hostPID: false,
            containers: [self.container],
            volumes: [
              { name: 'config', configMap: { name: name + '-config' } },
              { name: 'tmp', emptyDir: { sizeLimit: '256Mi' } },
            ] + [
              { name: m.name, hostPath: { path: m.path, type: 'Directory' } }
              for m in hostMounts
            ],
            container:: {
              name: 'agent',
              image: c.image.repository + ':' + c.image.tag,
              imagePullPolicy: c.image.pullPolicy,
              args: ['--config', '/etc/kubenpu/config.yaml'],
              env: [
                { name: 'K8S_NODE_NAME', valueFrom: { fieldRef: { fieldPath: 'spec.nodeName' } } },
                { name: 'OTEL_RESOURCE_ATTRIBUTES', value: 'k8s.node.name=$(K8S_NODE_NAME)' },
              ] + c.extraEnv,
              resources: c.resources,
              securityContext: {
                privileged: false,
                allowPrivilegeEscalation: false,
                readOnlyRootFilesystem: true,
                runAsUser: 0,
                runAsNonRoot: false,
                // Why SYS_ADMIN alone: see the Helm chart's daemonset.yaml.
                capabilities: { drop: ['ALL'], add: ['SYS_ADMIN'] },
                seccompProfile: c.seccompProfile,
              },
              volumeMounts: [
                { name: 'config', mountPath: '/etc/kubenpu', readOnly: true },
                { name: 'tmp', mountPath: '/tmp' },
              ] + [
                { name: m.name, mountPath: m.mountPath, readOnly: true }
                for m in hostMounts
              ],
            } + (if metrics then {
                   ports: [{ name: 'metrics', containerPort: c.config.export.prometheus.port, protocol: 'TCP' }],
                   startupProbe: probe(5) { failureThreshold: 60 },
                   livenessProbe: probe(30) { timeoutSeconds: 5 },
                 } else {}),
          }
          + (if c.priorityClassName != '' then { priorityClassName: c.priorityClassName } else {})
          + (if c.imagePullSecrets != [] then { imagePullSecrets: c.imagePullSecrets } else {})
          + (if c.nodeSelector != {} then { nodeSelector: c.nodeSelector } else {})
          + (if c.tolerations != [] then { tolerations: c.tolerations } else {})
          + (if c.affinity != {} then { affinity: c.affinity } else {}),
        },
      },
    },

    service: {
      apiVersion: 'v1',
      kind: 'Service',
      metadata: { name: name, labels: labels },
      spec: {
        clusterIP: 'None',
        selector: labels,
        ports: [{
          name: 'metrics',
          port: c.config.export.prometheus.port,
          targetPort: 'metrics',
          protocol: 'TCP',
        }],
      },
    },

    [if c.serviceMonitor.enabled then 'serviceMonitor']: {
      apiVersion: 'monitoring.coreos.com/v1',
      kind: 'ServiceMonitor',
      metadata: { name: name, labels: labels + c.serviceMonitor.labels },
      spec: {
        jobLabel: 'app.kubernetes.io/name',
        selector: { matchLabels: labels },
        endpoints: [{
          port: 'metrics',
          interval: c.serviceMonitor.interval,
          honorLabels: true,
          relabelings: [
            { action: 'labeldrop', regex: 'namespace|pod|container' },
            { sourceLabels: ['__meta_kubernetes_pod_node_name'], targetLabel: 'node' },
          ],
        }],
      },
    },

    [if c.prometheusRule.enabled then 'prometheusRule']: {
      apiVersion: 'monitoring.coreos.com/v1',
      kind: 'PrometheusRule',
      metadata: { name: name, labels: labels + c.prometheusRule.labels },
      spec: rules,
    },
  },
}
