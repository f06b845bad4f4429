"""A real kubelet PodResources v1 gRPC server on a unix socket, for tests and the VM node test.

It answers List and Get from a state (pods, their containers' device-plugin ids and DRA
devices), GetAllocatableResources from the state's `allocatable` list, or UNIMPLEMENTED when the
state has none (a kubelet older than 1.23). A device entry's "numa" list is sent as the kubelet
sends it: the id once per NUMA node (containerDevicesFromResourceDeviceInstances). "fail" maps a
method to the status code it answers with instead, e.g. {"List": "UNIMPLEMENTED"}, or
{"GetAllocatableResources": "UNKNOWN"} (the KubeletPodResourcesGetAllocatable gate off). Knobs:
stop() and start() again (a kubelet restart: a new socket file), and requests counts per method.

As a script:  python tests/podresources_server.py --socket PATH --state FILE.json
FILE.json is re-read on every call, so a test changes allocations by rewriting it (write a new
file and rename it over the old one). Its format:
  {"pods": [{"namespace": "ns", "name": "pod", "containers": [{"name": "c",
      "devices": [{"resource": "gpu.intel.com/i915", "ids": ["card0-0"], "numa": [0]}],
      "dynamic": [{"claim": "claim", "claim_namespace": "ns",
          "devices": [{"driver": "gpu.example.com", "pool": "node", "device": "gpu-0",
                       "cdi": ["example.com/gpu=gpu-0"]}]}]}]}],
   "allocatable": [{"resource": "gpu.intel.com/i915", "ids": ["card0-0", "card0-1"]}]}
"allocatable" absent: GetAllocatableResources answers UNIMPLEMENTED. The server prints
"listening on unix:PATH" when ready and stops on SIGTERM or SIGINT. It needs the kubenpu package
importable (installed or PYTHONPATH).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from collections import Counter
from concurrent import futures
from typing import Any

import grpc

from kubenpu.resolve.podresources import api_pb2, api_pb2_grpc

State = dict[str, Any]


def pod(namespace: str, name: str, containers: list[dict[str, Any]]) -> dict[str, Any]:
    return {"namespace": namespace, "name": name, "containers": containers}


def container(
    name: str, devices: dict[str, list[str]] | None = None, dynamic: list[dict] | None = None
) -> dict[str, Any]:
    """A container with device-plugin ids by resource, and DRA claims as in the file format."""
    return {
        "name": name,
        "devices": [{"resource": r, "ids": ids} for r, ids in (devices or {}).items()],
        "dynamic": dynamic or [],
    }


class PodResourcesTestServer(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, state: State | None = None) -> None:
        self._lock = threading.Lock()
        self._state: State = state or {"pods": []}
        self._file: str | None = None
        self.requests: Counter[str] = Counter()
        self._server: grpc.Server | None = None
        self._socket = ""
        self._starts = 0

    def set_state(self, state: State) -> None:
        with self._lock:
            self._state = state

    def watch_file(self, path: str) -> None:
        self._file = path

    def start(self, socket_path: str) -> None:
        """Listen on socket_path; binds its own name, then renames it into place (see
        tests/cri_server.py: a late unlink of an earlier server's name must not hit ours)."""
        os.makedirs(os.path.dirname(os.path.abspath(socket_path)), exist_ok=True)
        self._starts += 1
        bound = f"{socket_path}.{self._starts}"
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(self, self._server)
        if not self._server.add_insecure_port(f"unix:{bound}"):
            raise RuntimeError(f"cannot listen on unix:{bound}")
        self._server.start()
        os.replace(bound, socket_path)
        self._socket = socket_path

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None).wait()
            self._server = None
        if self._socket and os.path.exists(self._socket):
            os.unlink(self._socket)

    def _current(self) -> State:
        if self._file is not None:
            with open(self._file) as f:
                return json.load(f)
        with self._lock:
            return self._state

    # PodResourcesLister

    def _answer(self, method: str, context: grpc.ServicerContext) -> State:
        """The state, after counting the request and failing it where the state says so."""
        self.requests[method] += 1
        state = self._current()
        if code := state.get("fail", {}).get(method):
            context.abort(grpc.StatusCode[code], "... failed as asked")
        return state

    def List(self, request: Any, context: grpc.ServicerContext) -> Any:
        pods = [_pod(p) for p in self._answer("List", context).get("pods", [])]
        return api_pb2.ListPodResourcesResponse(pod_resources=pods)

    def Get(self, request: Any, context: grpc.ServicerContext) -> Any:
        for p in self._answer("Get", context).get("pods", []):
            if (p["namespace"], p["name"]) == (request.pod_namespace, request.pod_name):
                return api_pb2.GetPodResourcesResponse(pod_resources=_pod(p))
        context.abort(grpc.StatusCode.NOT_FOUND, "pod not found")

    def GetAllocatableResources(self, request: Any, context: grpc.ServicerContext) -> Any:
        allocatable = self._answer("GetAllocatableResources", context).get("allocatable")
        if allocatable is None:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "unknown method GetAllocatableResources")
        return api_pb2.AllocatableResourcesResponse(devices=_devices(allocatable))


def _devices(entries: list[dict[str, Any]]) -> list[Any]:
    """As the kubelet sends them: one ContainerDevices per id, or per id and NUMA node."""
    return [
        api_pb2.ContainerDevices(
            resource_name=d["resource"],
            device_ids=[i],
            topology=api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=n)])
            if n is not None
            else None,
        )
        for d in entries
        for i in d["ids"]
        for n in d.get("numa") or [None]
    ]


def _pod(p: dict[str, Any]) -> Any:
    return api_pb2.PodResources(
        name=p["name"],
        namespace=p["namespace"],
        containers=[
            api_pb2.ContainerResources(
                name=c["name"],
                devices=_devices(c.get("devices", [])),
                dynamic_resources=[_claim(d) for d in c.get("dynamic", [])],
            )
            for c in p.get("containers", [])
        ],
    )


def _claim(d: dict[str, Any]) -> Any:
    return api_pb2.DynamicResource(
        claim_name=d["claim"],
        claim_namespace=d["claim_namespace"],
        claim_resources=[
            api_pb2.ClaimResource(
                driver_name=r["driver"],
                pool_name=r.get("pool", ""),
                device_name=r["device"],
                cdi_devices=[api_pb2.CDIDevice(name=n) for n in r.get("cdi", [])],
            )
            for r in d.get("devices", [])
        ],
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--socket", required=True)
    parser.add_argument("--state", required=True, help="JSON state file, re-read on every call")
    args = parser.parse_args()
    server = PodResourcesTestServer()
    server.watch_file(args.state)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    server.start(args.socket)
    print(f"listening on unix:{args.socket}", flush=True)
    while not done.wait(1.0):  # a timeout keeps the signal handlers running promptly
        pass
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
