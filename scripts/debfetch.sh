#!/usr/bin/env bash
# Download Debian packages from any suite and unpack them into the cache,
# without installing anything on the host.
#   scripts/debfetch.sh DEST PKG[=VERSION]...
# DEST gets each package unpacked (dpkg-deb -x). Downloads are cached.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/env.sh"
dest=$1; shift
install_lock
apt_private_update
mkdir -p "$dest" "$KUBENPU_CACHE/debs"
for pkg in "$@"; do
  name=${pkg%%=*}
  version=${pkg#"$name"}; version=${version#=}
  # A pinned version must match the cached file exactly (apt escapes ':' in epochs as %3a).
  pattern="${name}_${version:+${version//:/%3a}_}*.deb"
  stamp="$dest/.unpacked.$name${version:+=$version}"
  [[ -e $stamp ]] && continue
  deb=$(ls "$KUBENPU_CACHE/debs/"$pattern 2>/dev/null | head -n1 || true)
  if [[ -z $deb ]]; then
    (cd "$KUBENPU_CACHE/debs" && APT_CONFIG=$KUBENPU_APT_CONFIG apt-get download -q "$pkg" >/dev/null)
    deb=$(ls "$KUBENPU_CACHE/debs/"$pattern | head -n1)
  fi
  dpkg-deb -x "$deb" "$dest"
  touch "$stamp"
done
