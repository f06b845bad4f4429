#!/usr/bin/env bash
# Fetch the test tools from Debian sid, unpacked into the cache, not installed: Prometheus 3.x and
# promtool, and VictoriaMetrics, whose OTLP receiver stands in for Prometheus' own (Debian builds
# Prometheus without it, #1080354). openssl goes on the host, for test certificates.
# Prints the directory of the binaries.
# Idempotent and cached: a second run downloads nothing.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/env.sh"
dest=$KUBENPU_CACHE/tools
install_lock
"$here/debfetch.sh" "$dest" prometheus promtool victoria-metrics >&2
host_install openssl >&2
bin=$dest/usr/bin
version=$("$bin/prometheus" --version | head -n1)
[[ $version == "prometheus, version 3."* ]] || { echo "tools.sh: need Prometheus 3.x, got: $version" >&2; exit 1; }
"$bin/promtool" --version >/dev/null
"$bin/victoria-metrics" -version >/dev/null
echo "$bin"
