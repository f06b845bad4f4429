#!/usr/bin/env bash
# Regenerate the vendored gRPC APIs' api_pb2.py and api_pb2_grpc.py from their api.proto: the
# CRI (kubenpu/resolve/cri) and the kubelet's PodResources (kubenpu/resolve/podresources).
# grpcio-tools is pinned to 1.62.x on purpose: newer releases emit runtime version checks that
# would force protobuf>=<their own version> and grpcio>=<their own version>; 1.62 emits code that
# imports cleanly with protobuf 4.25 up to the current major and any grpcio>=1.60.
# The tools live in a cached venv so the project's own venv keeps its versions.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
tools=$KUBENPU_CACHE/venvs/grpcio-tools-1.62.3
if [[ ! -x $tools/bin/python ]] || ! "$tools/bin/python" -c 'import grpc_tools' 2>/dev/null; then
  python3 -m venv "$tools"
  "$tools/bin/pip" install -q 'grpcio-tools==1.62.3'
fi
# -I . makes the generated grpc module import api_pb2 by its package path.
"$tools/bin/python" -m grpc_tools.protoc -I . --python_out=. --grpc_python_out=. \
  kubenpu/resolve/cri/api.proto kubenpu/resolve/podresources/api.proto
