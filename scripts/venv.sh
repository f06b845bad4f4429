#!/usr/bin/env bash
# Create (or refresh) the host development venv at .venv with the project and its dev tools.
set -euo pipefail
cd "$(dirname "$0")/.."
stamp=.venv/.stamp
if [[ -e $stamp && $stamp -nt pyproject.toml ]]; then exit 0; fi
[[ -x .venv/bin/python ]] || python3 -m venv .venv
.venv/bin/pip install -q -e '.[dev]'
touch "$stamp"
