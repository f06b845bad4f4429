#!/usr/bin/env bash
# Fetch the tools the deploy tests run (kustomize, jsonnet, promtool) into the cache,
# without installing anything on the host. Idempotent: debfetch.sh skips what is unpacked.
#   scripts/deploy-tools.sh      -> prints the bin directory
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/env.sh"
dest=$KUBENPU_CACHE/tools
install_lock
# kustomize 5.8 and promtool 3.x from sid are static Go binaries (libc6 >= 2.34 only).
# jsonnet comes from bookworm: sid's build needs glibc 2.38 and libstdc++ 13, which the
# bookworm host lacks; 0.18 covers everything deploy/ uses.
"$here/debfetch.sh" "$dest" kustomize=5.8.1+ds-1 promtool jsonnet=0.18.0+ds-3+b2 >&2
echo "$dest/usr/bin"
