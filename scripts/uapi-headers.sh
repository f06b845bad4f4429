#!/usr/bin/env bash
# Fetch the kernel uapi headers (linux-libc-dev) that the vendor ioctl tables are checked against
# into the cache, plus the C compiler that reads them. Idempotent and cached.
#   scripts/uapi-headers.sh      -> prints the include directory
set -euo pipefail
# Bumping this re-fetches; tests/test_vendor_headers.py then checks every table against it.
VERSION=7.3.4-1~bpo13+1
here=$(cd "$(dirname "$0")" && pwd)
. "$here/env.sh"
dest=$KUBENPU_CACHE/uapi
host_install gcc libc6-dev >&2
if [[ $(cat "$dest/.version" 2>/dev/null) != "$VERSION" ]]; then
  # debfetch.sh keys its cache on the package name only, so drop other versions first.
  rm -rf "$dest"
  for deb in "$KUBENPU_CACHE"/debs/linux-libc-dev_*.deb; do
    if [[ -e $deb && $(dpkg-deb -f "$deb" Version) != "$VERSION" ]]; then rm -f "$deb"; fi
  done
  "$here/debfetch.sh" "$dest" "linux-libc-dev=$VERSION" >&2
  echo "$VERSION" >"$dest/.version"
fi
echo "$dest/usr/include"
