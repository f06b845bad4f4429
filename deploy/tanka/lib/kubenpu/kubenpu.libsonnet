// The KubeNPU agent for Tanka: the Helm chart itself (deploy/helm/kubenpu), rendered by Tanka's
// Helm support (`tk` runs `helm template`; helm must be on PATH), so the chart stays the one
// source of the objects. `_config` is the chart's values: any key of values.yaml, with the same
// meaning; what is not set keeps the chart's default (Helm merges the two).
{
  _config:: {},
  _namespace:: 'kubenpu',  // the environment's spec.namespace

  kubenpu: std.native('helmTemplate')('kubenpu', '../../../helm/kubenpu', {
    calledFrom: std.thisFile,
    namespace: $._namespace,
    values: $._config,
  }),
}
