#!/usr/bin/env bash
# Install tmux on the host when it is missing: tests/test_top.py drives `kubenpuctl top` in it,
# as a person would see it. Idempotent: a second run installs nothing. Prints tmux's path.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/env.sh"
host_install tmux >&2
command -v tmux
