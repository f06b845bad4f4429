#!/usr/bin/env bash
# Build (once, then from cache) what tests/vm/run.sh boots:
#   - one Debian trixie root shared by all kernels, with BCC 0.31 and a venv that has this repo
#     installed editable from /src (the guest mounts the live repo there, so edits need no rebuild);
#   - per kernel: its image, headers and modules unpacked into that root, the uncompressed vmlinux
#     (QEMU boots it through PVH and skips the slow decompressor under TCG) and a small initramfs.
#   tests/vm/build.sh [KERNEL...]      KERNEL is a name from the table below; default: all of them.
# Every step leaves a stamp, so a second run does nothing. Needs root (chroot, mknod, mounts).
set -euo pipefail

# Kernels under test: name -> `uname -r`, and the Debian packages that carry it (image, headers,
# kbuild). The name is what run.sh takes. Add a kernel by adding a row to both tables.
declare -A KERNEL_RELEASE=(
  [6.1]=6.1.0-50-amd64
  [6.12]=6.12.117+deb13-amd64
  [7.3]=7.3.4+deb13-amd64
)
declare -A KERNEL_PACKAGES=(
  [6.1]="linux-image-6.1.0-50-amd64 linux-headers-6.1.0-50-amd64
         linux-headers-6.1.0-50-common linux-kbuild-6.1"
  [6.12]="linux-image-6.12.117+deb13-amd64 linux-headers-6.12.117+deb13-amd64
          linux-headers-6.12.117+deb13-common linux-kbuild-6.12.117+deb13"
  # trixie-backports. From 7.x Debian splits the image: linux-image-* is only a metapackage over
  # linux-base-* (System.map, config), linux-binary-* (vmlinuz) and linux-modules-*.
  [7.3]="linux-base-7.3.4+deb13-amd64 linux-binary-7.3.4+deb13-amd64
         linux-modules-7.3.4+deb13-amd64 linux-headers-7.3.4+deb13-amd64
         linux-headers-7.3.4+deb13-common linux-kbuild-7.3.4+deb13"
)
KERNEL_ORDER=(6.1 6.12 7.3)

# The guest root. mount: not Essential in trixie; util-linux: unshare, setpriv; libcap2-bin: capsh;
# iproute2: brings up lo for the CRI and OTLP test servers; kmod: modprobe, and depmod at build.
ROOT_SUITE=trixie
ROOT_PACKAGES=python3,python3-venv,python3-bpfcc,kmod,ca-certificates,iproute2,mount
ROOT_PACKAGES+=,util-linux,libcap2-bin,procps
# Installed into /opt/kubenpu/venv besides the project itself (the guest runs OTLP/CRI servers).
PIP_EXTRA=(opentelemetry-proto grpcio)
# Modules the initramfs needs to mount the 9p root with an overlay; modprobe adds dependencies
# and skips built-in ones, so this list fits every kernel.
INITRAMFS_MODULES=(virtio_pci 9pnet_virtio 9p overlay)

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
. "$repo/scripts/env.sh"
ROOT_MIRROR=$(debian_mirror)   # the host's own mirror (or KUBENPU_DEBIAN_MIRROR)
vm=$KUBENPU_CACHE/vm
root=$vm/root
stamps=$root/var/lib/kubenpu-vm   # inside the root: a rebuilt root drops its stamps with it

log() { printf 'build.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
hash_of() { printf '%s\n' "$@" | sha256sum | cut -c1-16; }

# --- host tools --------------------------------------------------------------------------------

host_tools() {
  # gcc-multilib: drmcall32, a 32-bit build of drmcall whose ioctls enter as compat calls.
  host_install qemu-system-x86 busybox-static mmdebstrap cpio zstd xz-utils gcc libc6-dev gcc-multilib
}

# --- the guest root ----------------------------------------------------------------------------

build_root() {
  local want
  want=base.$(hash_of "$ROOT_SUITE" "$ROOT_MIRROR" "$ROOT_PACKAGES")
  [[ -e $stamps/$want ]] && return 0
  log "building the $ROOT_SUITE root (mmdebstrap)"
  # mmdebstrap wants an empty target; build aside and swap, so an interrupted run leaves no half
  # root behind.
  rm -rf "$root.new"
  mmdebstrap --quiet --variant=apt --include="$ROOT_PACKAGES" \
    "$ROOT_SUITE" "$root.new" "$ROOT_MIRROR"
  mkdir -p "$root.new/src" "$root.new/out" "$root.new/var/lib/kubenpu-vm"
  rm -rf "$root" && mv "$root.new" "$root"
  touch "$stamps/$want"
}

# Run a command in the root with the repo at /src, host DNS and /dev, in a private mount namespace
# so nothing stays mounted if the command fails.
in_root() {
  touch "$root/etc/resolv.conf"
  unshare --mount --fork -- bash -euc '
    root=$1 repo=$2; shift 2
    mount --bind -o ro "$repo" "$root/src"
    mount --bind /etc/resolv.conf "$root/etc/resolv.conf"
    mount --bind /dev "$root/dev"
    mount -t proc proc "$root/proc"
    exec chroot "$root" "$@"' _ "$root" "$repo" "$@"
}

# The project's venv, made with the guest's python (3.13) so it sees the system's bcc module.
build_venv() {
  local want
  want=pip.$(hash_of "$(sha256sum <"$repo/pyproject.toml")" "${PIP_EXTRA[@]}")
  [[ -e $stamps/$want ]] && return 0
  log "installing the project into /opt/kubenpu/venv (pip, editable from /src)"
  [[ -x $root/opt/kubenpu/venv/bin/python ]] ||
    chroot "$root" python3 -m venv --system-site-packages /opt/kubenpu/venv
  # The network goes through a proxy with its own CA, which only the host's bundle trusts.
  mkdir -p "$root/etc/kubenpu"
  cp /etc/ssl/certs/ca-certificates.crt "$root/etc/kubenpu/host-ca.crt"
  # env -i: the host's PIP_* settings point at cp311-only wheel dirs that the guest cannot use.
  in_root env -i HOME=/root PATH=/usr/sbin:/usr/bin:/sbin:/bin \
    PIP_CERT=/etc/kubenpu/host-ca.crt PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 \
    /opt/kubenpu/venv/bin/pip install --quiet -e '/src[agent]' "${PIP_EXTRA[@]}"
  rm -f "$stamps"/pip.*
  touch "$stamps/$want"
}

# --- kernels -----------------------------------------------------------------------------------

# Download into the shared deb cache (as scripts/debfetch.sh does) and unpack into the root.
# Not debfetch.sh itself: dpkg-deb -x replaces the root's /lib -> usr/lib symlink with a directory
# when a package (the bookworm kernel) ships files under /lib, which breaks the merged-/usr root.
fetch_unpack() {
  local pkg=$1 deb
  mkdir -p "$KUBENPU_CACHE/debs"
  deb=$(ls "$KUBENPU_CACHE/debs/${pkg}"_*.deb 2>/dev/null | head -n1 || true)
  if [[ -z $deb ]]; then
    (cd "$KUBENPU_CACHE/debs" && APT_CONFIG=$KUBENPU_APT_CONFIG apt-get download -q \
      -o APT::Sandbox::User=root "$pkg" >/dev/null)
    deb=$(ls "$KUBENPU_CACHE/debs/${pkg}"_*.deb | head -n1)
  fi
  dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$root" --keep-directory-symlink --warning=no-timestamp
}

# BCC finds headers through /usr/lib/modules/<release>/build; the bookworm packages link there
# (and within the headers) with absolute paths, which only resolve inside the guest. Make every
# absolute link relative so the tree is valid from the host (chroot, tests) too.
relativize_links() {
  local link target
  while IFS= read -r link; do
    target=$(readlink "$link")
    ln -sfn "$(realpath -m --relative-to="$(dirname "$link")" "$root$target")" "$link"
  done < <(find "$@" -type l -lname '/*')
}

install_kernel() {
  local name=$1 rel=${KERNEL_RELEASE[$1]} pkg want
  want=kernel.$(hash_of "$rel" "${KERNEL_PACKAGES[$name]}")
  [[ -e $stamps/$want ]] && return 0
  log "unpacking kernel $rel into the root"
  apt_private_update
  for pkg in ${KERNEL_PACKAGES[$name]}; do fetch_unpack "$pkg"; done
  relativize_links "$root/usr/lib/modules/$rel" "$root"/usr/src/linux-headers-"${rel%-amd64}"*
  [[ -e $root/usr/lib/modules/$rel/build/include ]] ||
    die "no headers at /usr/lib/modules/$rel/build"
  chroot "$root" depmod -a "$rel"
  touch "$stamps/$want"
}

# read_bytes FILE OFFSET COUNT TYPE: od's view of COUNT bytes (u1, u4 little-endian, x1...).
read_bytes() { od -An -t "$4" -j "$2" -N "$3" "$1" | tr -d ' '; }

# bzImage = setup code + compressed payload. The setup header says where the payload starts
# (after setup_sects+1 sectors, at payload_offset) and how long it is. The build appends the
# uncompressed size as 4 bytes, which zstd refuses as trailing garbage, so cut it off.
extract_vmlinux() {
  local vmlinuz=$1 out=$2 sects off len start magic unpack
  sects=$(read_bytes "$vmlinuz" $((0x1f1)) 1 u1)
  ((sects)) || sects=4
  off=$(read_bytes "$vmlinuz" $((0x248)) 4 u4)
  len=$(read_bytes "$vmlinuz" $((0x24c)) 4 u4)
  start=$(((sects + 1) * 512 + off))
  magic=$(read_bytes "$vmlinuz" "$start" 4 x1)
  case $magic in
    fd377a58) unpack="xz -dc" ;;  # xz (6.1)
    28b52ffd) unpack="zstd -dcq" ;; # zstd (6.12)
    *) die "unknown kernel payload magic $magic in $vmlinuz" ;;
  esac
  dd if="$vmlinuz" iflag=skip_bytes,count_bytes skip="$start" count=$((len - 4)) status=none |
    $unpack >"$out.tmp"
  [[ $(read_bytes "$out.tmp" 1 3 c) == ELF ]] || die "payload of $vmlinuz is not ELF"
  mv "$out.tmp" "$out"
}

# Module files to insmod, dependencies first and without duplicates, as the root's modprobe
# resolves them (it skips built-in modules), relative to /usr/lib/modules/<release>.
module_closure() {
  local rel=$1 mod
  for mod in "${INITRAMFS_MODULES[@]}"; do
    chroot "$root" modprobe --show-depends --set-version="$rel" "$mod" ||
      die "$rel has no module $mod"
  done | awk -v pre="/lib/modules/$rel/" \
    '$1 == "insmod" && !seen[$2]++ { print substr($2, length(pre) + 1) }'
}

# busybox-static + plain .ko files (busybox insmod reads no compressed modules) + our /init.
build_initramfs() {
  local rel=$1 out=$2 stage path n=0 ko mods
  mods=$(module_closure "$rel")
  stage=$(mktemp -d "$vm/initramfs.XXXXXX")
  mkdir -p "$stage"/{bin,dev,proc,sys,lower,rw,newroot,modules}
  cp /bin/busybox "$stage/bin/busybox"
  cp "$here/initramfs-init" "$stage/init"
  chmod 755 "$stage/init"
  mknod "$stage/dev/console" c 5 1   # so the kernel can give /init its stdio
  while IFS= read -r path; do
    ko=${path##*/}
    ko=$stage/modules/$(printf '%02d' "$n")-${ko%%.ko*}.ko
    n=$((n + 1))
    case $path in
      *.xz) xz -dc "$root/usr/lib/modules/$rel/$path" >"$ko" ;;
      *.zst) zstd -dcq "$root/usr/lib/modules/$rel/$path" >"$ko" ;;
      *.gz) gzip -dc "$root/usr/lib/modules/$rel/$path" >"$ko" ;;
      *) cp "$root/usr/lib/modules/$rel/$path" "$ko" ;;
    esac
  done <<<"$mods"
  (cd "$stage" && find . | LC_ALL=C sort | cpio --quiet -o -H newc) >"$out.tmp"
  rm -rf "$stage"
  mv "$out.tmp" "$out"
}

# Up to 6.x the image is /boot/vmlinuz-<release>; Debian's 7.x packages ship only the
# /usr/lib/modules/<release>/vmlinuz that kernel-install expects.
vmlinuz_of() {
  local f
  for f in "$root/boot/vmlinuz-$1" "$root/usr/lib/modules/$1/vmlinuz"; do
    [[ -e $f ]] && echo "$f" && return 0
  done
  die "no vmlinuz for $1 in the root"
}

# vmlinux and initramfs live outside the root, one directory per kernel name (run.sh reads them).
build_boot() {
  local name=$1 rel=${KERNEL_RELEASE[$1]} dir=$vm/boot/$1 want
  want=$(hash_of "$rel" "${KERNEL_PACKAGES[$name]}" "${INITRAMFS_MODULES[@]}" \
    "$(sha256sum <"$here/initramfs-init")" "$(sha256sum </bin/busybox)")
  [[ $(cat "$dir/stamp" 2>/dev/null) == "$want" ]] && return 0
  log "building boot files for $rel"
  mkdir -p "$dir"
  rm -f "$dir/stamp"
  extract_vmlinux "$(vmlinuz_of "$rel")" "$dir/vmlinux"
  build_initramfs "$rel" "$dir/initramfs.cpio"
  echo "$rel" >"$dir/release"
  echo "$want" >"$dir/stamp"
}

# Static C programs the guest runs (tests/vm/src/*.c -> /usr/local/bin in the root): static so
# they also run in bare container images and tight benchmark loops. drmcall is also built for
# i386 (drmcall32): its ioctls reach the kernel as 32-bit compat calls.
build_tools() {
  local src
  for src in "$repo/tests/vm/src/"*.c; do
    build_tool "$src" "$(basename "$src" .c)"
  done
  build_tool "$repo/tests/vm/src/drmcall.c" drmcall32 -m32
}

build_tool() {
  local src=$1 name=$2 want
  shift 2
  want=cc.$name.$(sha256sum "$src" | cut -c1-16)
  [[ -e $stamps/$want ]] && return 0
  log "compiling $name"
  gcc -O2 -static -Wall -Wextra "$@" -o "$root/usr/local/bin/$name" "$src"
  rm -f "$stamps/cc.$name".*
  touch "$stamps/$want"
}

# Packages apt installs into the finished root rather than ROOT_PACKAGES, so adding them does not
# rebuild the root under guests that may be running. One stamp per set (NAME.hash).
#   NODE: a real container runtime for tests/vm/node_guest.py: containerd (CRI plugin built in),
#     runc, and busybox-static for the test images; bpftrace for the benchmark's floor
#     (bench/bench_guest.py); docker-registry and skopeo, the registry the image test's containerd
#     pulls the agent's image from (tests/vm/image_guest.py).
#   KBUILD: trixie's gcc 14 (what Debian built the 6.12 and 7.3 kernels with) and make, for the
#     fdinfo test driver (build_testdrm).
NODE_PACKAGES=(containerd runc busybox-static bpftrace docker-registry skopeo)
KBUILD_PACKAGES=(gcc make libc6-dev)
apt_into_root() {
  local name=$1 want
  shift
  want=$name.$(hash_of "$@")
  [[ -e $stamps/$want ]] && return 0
  log "installing $* into the root (apt)"
  in_root env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive \
    sh -ec 'apt-get update -q >/dev/null
      apt-get install -y -q --no-install-recommends "$@" >/dev/null
      apt-get clean' _ "$@"
  rm -f "$stamps/$name".*
  touch "$stamps/$want"
}

# tests/vm/kmod (kubenpu_testdrm, a DRM driver whose fdinfo prints known usage stats), built in
# the root against a kernel's headers and installed as an out-of-tree module (updates/, depmod),
# so the guest can modprobe it. Only for kernels built with the root's gcc (14): not 6.1 (gcc 12).
TESTDRM_KERNELS=(6.12 7.3)
build_testdrm() {
  local name=$1 rel=${KERNEL_RELEASE[$1]} want
  [[ " ${TESTDRM_KERNELS[*]} " == *" $name "* ]] || return 0
  want=testdrm.$name.$(cat "$here"/kmod/Kbuild "$here"/kmod/*.c | sha256sum | cut -c1-16)
  [[ -e $stamps/$want ]] && return 0
  log "building the fdinfo test driver for $rel"
  in_root env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin sh -ec '
    rel=$1 work=/var/tmp/kubenpu-testdrm-$1
    rm -rf "$work" && cp -r /src/tests/vm/kmod "$work"
    # No BTF for it (no pahole in the root): nothing traces the test driver.
    make -s -C "/usr/lib/modules/$rel/build" M="$work" CONFIG_DEBUG_INFO_BTF_MODULES= modules
    mkdir -p "/usr/lib/modules/$rel/updates"
    cp "$work/kubenpu_testdrm.ko" "/usr/lib/modules/$rel/updates/"
    rm -rf "$work"
    depmod -a "$rel"' _ "$rel"
  rm -f "$stamps/testdrm.$name".*
  touch "$stamps/$want"
}

main() {
  [[ $(id -u) == 0 ]] || die "run as root (mmdebstrap, chroot, mknod)"
  local kernels=("$@") k
  ((${#kernels[@]})) || kernels=("${KERNEL_ORDER[@]}")
  for k in "${kernels[@]}"; do
    [[ -n ${KERNEL_RELEASE[$k]:-} ]] || die "unknown kernel '$k' (known: ${KERNEL_ORDER[*]})"
  done
  mkdir -p "$vm"
  # One build at a time: parallel test runs share the cache.
  exec 9>"$vm/lock"
  flock 9
  install_lock # and no fetch script's APT update meanwhile (env.sh)
  host_tools
  build_root
  build_venv
  build_tools
  apt_into_root node "${NODE_PACKAGES[@]}"
  apt_into_root kbuild "${KBUILD_PACKAGES[@]}"
  for k in "${kernels[@]}"; do
    install_kernel "$k"
    build_boot "$k"
    build_testdrm "$k"
  done
}

main "$@"
