#!/usr/bin/env bash
# make release: the versioned artifacts a user installs, under out/release/<version>/:
#   kubenpu-<version>-py3-none-any.whl  the Python package with both CO-RE objects (make bpf), so
#                                       `pip install 'kubenpu-<version>-py3-none-any.whl[agent]'`
#                                       gives an agent that loads without a build
#   kubenpu-<chart version>.tgz         the Helm chart, by `helm package`
#   kubenpu-agent-<version>.oci.tar     the agent's image (scripts/image.sh), an OCI archive named
#                                       docker.io/<image.repository>:<image.tag>; push it with
#                                       skopeo or buildah (docs/upgrade.md)
#   SHA256SUMS
# One version: pyproject.toml, kubenpu/__init__.py, the chart's appVersion and image.tag must
# agree, or nothing is built. Prints the directory on stdout (sizes on stderr).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
die() { printf 'release.sh: error: %s\n' "$*" >&2; exit 1; }

"$here/venv.sh"
py=$repo/.venv/bin/python
chart=$repo/deploy/helm/kubenpu
read -r version app_version image_tag chart_version < <("$py" - "$repo" <<'PY'
import sys, tomllib
from pathlib import Path

import yaml

repo = Path(sys.argv[1])
chart = repo / "deploy" / "helm" / "kubenpu"
meta = yaml.safe_load((chart / "Chart.yaml").read_text())
values = yaml.safe_load((chart / "values.yaml").read_text())
pyproject = tomllib.loads((repo / "pyproject.toml").read_text())
print(pyproject["project"]["version"], meta["appVersion"], values["image"]["tag"], meta["version"])
PY
)
package_version=$("$py" -c 'import kubenpu; print(kubenpu.__version__)')
for v in "$app_version" "$image_tag" "$package_version"; do
  [[ $v == "$version" ]] || die "versions disagree: pyproject $version, kubenpu $package_version, appVersion $app_version, image.tag $image_tag"
done

out=$repo/out/release/$version
rm -rf "$out" && mkdir -p "$out"

# The wheel, with the objects make bpf compiled (pyproject's wheel artifacts); checked, not assumed.
"$here/bpf.sh" >&2
"$repo/.venv/bin/pip" wheel -q --no-deps -w "$out" "$repo" >&2
wheel=$out/kubenpu-$version-py3-none-any.whl
"$py" - "$wheel" <<'PY'
import sys, zipfile

names = set(zipfile.ZipFile(sys.argv[1]).namelist())
want = {f"kubenpu/kernel/objects/kubenpu-{mode}.bpf.o" for mode in ("aggregate", "events")}
if missing := sorted(want - names):
    sys.exit(f"release.sh: error: the wheel lacks {', '.join(missing)}")
PY

"$("$here/k8s-tools.sh")/helm" package "$chart" -d "$out" >&2
[[ -e $out/kubenpu-$chart_version.tgz ]] || die "helm package wrote no kubenpu-$chart_version.tgz"

archive=$("$here/image.sh" | tail -n1)  # its last line: buildah may print ids before it
cp "$archive" "$out/kubenpu-agent-$version.oci.tar"

(cd "$out" && sha256sum -- * >SHA256SUMS)
(cd "$out" && du -h -- *.whl *.tgz *.oci.tar | sed 's/^/release.sh: /' >&2)
echo "$out"
