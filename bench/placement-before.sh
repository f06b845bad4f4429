#!/usr/bin/env bash
# Build the CO-RE aggregate object as it was before the placement count (REV, default the
# commit before it) into OUT/kubenpu-aggregate-NAME.bpf.o (NAME: before, or main for the guest's
# main arms: an earlier count, at REV), for bench/placement.sh's arms.
#   bench/placement-before.sh OUT [REV [NAME]]
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
out=$(realpath "$1")
rev=${2:-540bd6f}
name=${3:-before}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/bpf" "$tmp/scripts" "$out"
git -C "$repo" archive "$rev" bpf scripts | tar -x -C "$tmp"
"$tmp/scripts/bpf.sh" "$tmp/objects"
cp "$tmp/objects/kubenpu-aggregate.bpf.o" "$out/kubenpu-aggregate-$name.bpf.o"
