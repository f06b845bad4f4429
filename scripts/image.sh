#!/usr/bin/env bash
# Build the agent's image from the repository's Dockerfile, as users build it, without a daemon or
# a registry: Debian's buildah (vfs storage, chroot isolation, as root), with the Dockerfile's base
# image made here (mmdebstrap) and tagged with the exact name its FROM uses. Writes an OCI archive
# named as the chart names the image, and prints its path on stdout (progress and size on stderr).
#   scripts/image.sh [bcc]    bcc: the -bcc variant (--build-arg BCC=true: BCC and LLVM added)
# Cached and idempotent: the base image is built once per mirror/suite, buildah reuses its layers
# (--layers) while their inputs are unchanged, and the archive is rewritten only for a new image.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
. "$here/env.sh"
dir=$KUBENPU_CACHE/image

log() { printf 'image.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# The names: FROM from the Dockerfile, the image from the chart's values (image.repository:tag).
BASE=$(sed -n 's/^FROM[[:space:]]\+\([^[:space:]]\+\).*/\1/p' "$repo/Dockerfile" | head -n1)
chart_value() {
  awk -v key="$1" '/^image:/ { on = 1; next } /^[^ #]/ { on = 0 }
    on && $1 == key ":" { gsub(/"/, "", $2); print $2; exit }' "$repo/deploy/helm/kubenpu/values.yaml"
}
VARIANT=${1:-}
[[ -z $VARIANT || $VARIANT == bcc ]] || die "usage: $0 [bcc]"
IMAGE=$(chart_value repository):$(chart_value tag)${VARIANT:+-$VARIANT}
BUILD_ARGS=()
[[ $VARIANT == bcc ]] && BUILD_ARGS=(--build-arg BCC=true)
# containerd (and the kubelet) name an image by its full reference.
ARCHIVE=$dir/${IMAGE//[\/:]/_}.oci.tar
REF=docker.io/$IMAGE

# A Debian base like the official -slim images (debuerreotype): minbase; dpkg keeps no docs, man
# pages or locales, and apt keeps no downloaded packages or caches. Both configs stay in the
# image, so the Dockerfile's apt-get installs get the same treatment, as on the real base.
[[ $BASE =~ ^debian:([a-z]+)(-slim)?$ ]] || die "cannot make the base image $BASE (want debian:<suite>[-slim])"
SUITE=${BASH_REMATCH[1]}
SLIM=(--variant=minbase)
for path in doc groff info linda lintian/overrides locale man; do
  SLIM+=("--dpkgopt=path-exclude=/usr/share/$path/*")
done
SLIM+=("--dpkgopt=path-include=/usr/share/doc/*/copyright")
APT_CLEAN='rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true'
SLIM+=("--aptopt=DPkg::Post-Invoke { \"$APT_CLEAN\"; }"
  "--aptopt=APT::Update::Post-Invoke { \"$APT_CLEAN\"; }"
  '--aptopt=Dir::Cache::pkgcache ""' '--aptopt=Dir::Cache::srcpkgcache ""'
  '--aptopt=Acquire::Languages "none"' '--aptopt=Apt::AutoRemove::SuggestsImportant "false"')

bh() { buildah --root "$dir/storage" --runroot "$dir/run" --storage-driver vfs "$@"; }

build_base() {
  local mirror want stamp=$dir/base.stamp
  mirror=$(debian_mirror)
  want=$(printf '%s\n' "$BASE" "$mirror" "${SLIM[@]}" | sha256sum | cut -c1-16)
  if [[ $(cat "$stamp" 2>/dev/null) == "$want" ]] && bh inspect --type image "$BASE" >/dev/null 2>&1; then
    return 0
  fi
  log "making the base image $BASE (mmdebstrap $SUITE)"
  rm -f "$stamp" "$dir/base.tar"
  mmdebstrap --quiet "${SLIM[@]}" "$SUITE" "$dir/base.tar" "$mirror"
  local ctr
  ctr=$(bh from scratch)
  bh add "$ctr" "$dir/base.tar" / # a local tar is unpacked
  bh config --cmd bash --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$ctr"
  bh commit --quiet --rm "$ctr" "$BASE" >/dev/null
  rm -f "$dir/base.tar"
  echo "$want" >"$stamp"
}

# The build's network goes through a proxy with its own CA, which only the host's bundle trusts.
# pip in RUN reads it from a site-wide pip.conf mounted for the build only: the Dockerfile and the
# image stay as elsewhere.
build_image() {
  local pipconf=$dir/pip.conf
  printf '[global]\ncert = /etc/kubenpu-build-ca.crt\n' >"$pipconf"
  bh bud --quiet --layers --pull=never --isolation chroot "${BUILD_ARGS[@]}" \
    --volume "/etc/ssl/certs/ca-certificates.crt:/etc/kubenpu-build-ca.crt:ro" \
    --volume "$pipconf:/etc/pip.conf:ro" \
    --tag "$IMAGE" --file "$repo/Dockerfile" "$repo" >&2
}

# What the build reads: the Dockerfile, the files it COPYs (less what .dockerignore drops), the
# base image and this script. Unchanged, even buildah's own cache check (about 40 s with vfs) is
# skipped.
inputs_hash() {
  local srcs
  mapfile -t srcs < <(awk '$1 == "COPY" && $2 !~ /^--from/ { for (i = 2; i < NF; i++) print $i }' \
    "$repo/Dockerfile")
  {
    cat "$repo/Dockerfile" "$repo/.dockerignore" "${BASH_SOURCE[0]}"
    echo "${BUILD_ARGS[*]}"
    bh inspect --type image --format '{{.FromImageID}}' "$BASE"
    (cd "$repo" && find "${srcs[@]}" -type f ! -name '*.pyc' ! -path 'kubenpu/kernel/objects/*' -print0 | sort -z | xargs -0 sha256sum)
  } | sha256sum | cut -c1-16
}

# The archive is rewritten only when the image id changed.
write_archive() {
  local id
  id=$(bh inspect --type image --format '{{.FromImageID}}' "$IMAGE")
  if [[ -e $ARCHIVE && $(cat "$ARCHIVE.id" 2>/dev/null) == "$id" ]]; then
    return 0
  fi
  rm -f "$ARCHIVE" "$ARCHIVE.id"
  bh push --quiet "$IMAGE" "oci-archive:$ARCHIVE.tmp:$REF" >&2
  mv "$ARCHIVE.tmp" "$ARCHIVE"
  echo "$id" >"$ARCHIVE.id"
}

main() {
  [[ $(id -u) == 0 ]] || die "run as root (buildah with vfs storage and chroot isolation)"
  host_install buildah mmdebstrap >&2
  mkdir -p "$dir"
  # One build at a time: parallel test runs share the cache.
  exec 9>"$dir/lock"
  flock 9
  build_base
  local inputs
  inputs=$(inputs_hash)
  local stamp=$dir/inputs${VARIANT:+-$VARIANT}.stamp
  if [[ ! -e $ARCHIVE || $(cat "$stamp" 2>/dev/null) != "$inputs" ]]; then
    build_image
    write_archive
    echo "$inputs" >"$stamp"
  fi
  log "$REF: $(bh images --format '{{.Size}}' "$IMAGE" | head -n1) unpacked," \
    "$(du -h "$ARCHIVE" | cut -f1) archive ($ARCHIVE)"
  echo "$ARCHIVE"
}

main "$@"
