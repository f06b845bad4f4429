#!/usr/bin/env bash
# The tools of the release test (tests/test_release.py): a real OCI registry, Debian's
# docker-registry (distribution 2.8, the distribution API), and skopeo, which copies the image's
# OCI archive into it. helm pushes the chart itself (scripts/k8s-tools.sh). Debian packages on the
# host; idempotent: host_install installs only what is missing.
#   scripts/registry-tools.sh      -> prints the docker-registry binary's path
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/env.sh"
host_install docker-registry skopeo >&2
# The package's own service (a registry on :5000 for the whole host) is not wanted: the test
# runs its own, on a free port, with its storage in a scratch directory.
if command -v systemctl >/dev/null && systemctl is-active --quiet docker-registry 2>/dev/null; then
  systemctl disable --now docker-registry >&2
fi
command -v skopeo >/dev/null
command -v docker-registry
