// The KubeNPU agent for Tanka: the Helm chart itself (deploy/helm/kubenpu), rendered by Tanka's
// Helm support (`tk` runs `helm template`; helm must be on PATH), so the chart stays the one
// source of the objects. `_config` is the chart's values: any key of values.yaml, with the same
// meaning; what is not set keeps the chart's default (Helm merges the two).
// The chart's Helm hooks (its uninstall hook) are left out: tk would apply them as plain objects
// at once. To remove the pinned probe after `tk delete`, apply deploy/kustomize/uninstall
// (docs/upgrade.md).
local isHook(object) = std.objectHas(std.get(object.metadata, 'annotations', {}), 'helm.sh/hook');

{
  _config:: {},
  _namespace:: 'kubenpu',  // the environment's spec.namespace

  local rendered = std.native('helmTemplate')('kubenpu', '../../../helm/kubenpu', {
    calledFrom: std.thisFile,
    namespace: $._namespace,
    values: $._config,
  }),
  kubenpu: { [name]: rendered[name] for name in std.objectFields(rendered) if !isHook(rendered[name]) },
}
