"""A real CRI v1 RuntimeService gRPC server on a unix socket, for tests and the VM end-to-end test.

It answers Version and ContainerStatus (with the labels kubelet sets) from a table of containers,
ListContainers, and ListPodSandbox: the sandboxes added (add_sandbox: a pod's labels and
annotations, ready or not), and one for each other pod uid its containers name, with kubelet's
io.kubernetes.pod.* labels, ready while one of them has not exited (kubelet stops a finished
pod's sandbox). It has knobs for faults: unavailable (UNAVAILABLE status), slow (answers after a
delay) and hold (ContainerStatus answers only once released, so a test can see requests in
flight).

As a script:  python tests/cri_server.py --socket PATH [--containers FILE.json]
FILE.json is a list of {"id", "namespace", "pod", "container", "pod_uid" (optional)}; it is
re-read on a request when it changed, so containers can be added while the server runs (write a
new file and rename it over the old one). The server prints "listening on unix:PATH" when ready
and stops on SIGTERM or SIGINT. It needs the kubenpu package importable (installed or PYTHONPATH).
"""

import argparse
import json
import os
import signal
import sys
import threading
from collections import Counter
from concurrent import futures

import grpc

from kubenpu.resolve.cri import (
    LABEL_CONTAINER,
    LABEL_NAMESPACE,
    LABEL_POD,
    LABEL_POD_UID,
    api_pb2,
    api_pb2_grpc,
)

RUNTIME_NAME = "kubenpu-cri-test"


class CriTestServer(api_pb2_grpc.RuntimeServiceServicer):
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._containers: dict[str, dict[str, str]] = {}
        self._exited: set[str] = set()  # listed as CONTAINER_EXITED, as a runtime keeps them
        self._sandboxes: dict[str, api_pb2.PodSandbox] = {}  # added, by pod uid
        self.requests: Counter[str] = Counter()  # ContainerStatus requests per container id
        self.lists = 0  # ListContainers requests
        self.sandbox_lists = 0  # ListPodSandbox requests
        self.listed = True  # False: ListContainers answers UNIMPLEMENTED
        self.version = "0.1.0"  # the runtime_version Version answers
        self._unavailable = False
        self._delay = 0.0
        self._release = threading.Event()  # ends slow answers early on stop()
        self._gate = threading.Event()  # cleared while held
        self._gate.set()
        self._flight = threading.Condition(self._lock)
        self.in_flight = 0  # ContainerStatus requests being answered now
        self.max_in_flight = 0
        self._server: grpc.Server | None = None
        self._socket = ""
        self._starts = 0
        self._file: str | None = None
        self._file_stamp: tuple[int, int, int] | None = None

    def start(self, socket_path: str) -> None:
        """Listen on socket_path. Each start binds a name of its own and renames it into place:
        gRPC unlinks the name a server bound when it destroys the server, which may come after
        stop() returns, and would then remove a restarted server's socket (a flaky test)."""
        os.makedirs(os.path.dirname(os.path.abspath(socket_path)), exist_ok=True)
        self._starts += 1
        bound = f"{socket_path}.{self._starts}"
        self._release.clear()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        api_pb2_grpc.add_RuntimeServiceServicer_to_server(self, self._server)
        if not self._server.add_insecure_port(f"unix:{bound}"):
            raise RuntimeError(f"cannot listen on unix:{bound}")
        self._server.start()
        os.replace(bound, socket_path)  # a bound socket answers under its new name
        self._socket = socket_path

    def stop(self) -> None:
        self._release.set()
        self._gate.set()
        if self._server is not None:
            self._server.stop(grace=None).wait()
            self._server = None
        if self._socket and os.path.exists(self._socket):
            os.unlink(self._socket)

    def add_container(
        self,
        container_id: str,
        namespace: str,
        pod: str,
        container: str,
        pod_uid: str = "",
        exited: bool = False,
    ) -> None:
        with self._lock:
            self._containers[container_id] = _labels(namespace, pod, container, pod_uid)
            if exited:
                self._exited.add(container_id)

    def add_sandbox(
        self,
        uid: str,
        namespace: str,
        pod: str,
        labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None,
        ready: bool = True,
    ) -> None:
        """A pod's sandbox, with its pod's labels (kubelet adds its io.kubernetes.pod.* ones)
        and annotations, as kubelet's RunPodSandbox creates it."""
        with self._lock:
            pod_labels = {**(labels or {}), **_labels(namespace, pod, "", uid)}
            self._sandboxes[uid] = _sandbox(uid, namespace, pod, ready, pod_labels, annotations)

    def remove_container(self, container_id: str) -> None:
        with self._lock:
            self._containers.pop(container_id, None)

    def set_unavailable(self, unavailable: bool = True) -> None:
        self._unavailable = unavailable

    def set_slow(self, seconds: float) -> None:
        """Delay every answer by `seconds` (0 to answer at once)."""
        self._delay = seconds

    def hold(self) -> None:
        """ContainerStatus requests wait (in flight) until release() or stop()."""
        self._gate.clear()

    def release(self) -> None:
        self._gate.set()

    def wait_in_flight(self, n: int, timeout: float = 30.0) -> bool:
        """Whether n ContainerStatus requests are in flight at once within `timeout` seconds."""
        with self._flight:
            return self._flight.wait_for(lambda: self.in_flight >= n, timeout)

    def watch_file(self, path: str) -> None:
        """Take the containers from a JSON file, re-read whenever it changes."""
        self._file = path
        self._reload()

    # RuntimeService

    def Version(
        self, request: api_pb2.VersionRequest, context: grpc.ServicerContext
    ) -> api_pb2.VersionResponse:
        self._fault(context)
        return api_pb2.VersionResponse(
            version="0.1.0",
            runtime_name=RUNTIME_NAME,
            runtime_version=self.version,
            runtime_api_version="v1",
        )

    def ContainerStatus(
        self, request: api_pb2.ContainerStatusRequest, context: grpc.ServicerContext
    ) -> api_pb2.ContainerStatusResponse:
        container_id = request.container_id
        with self._flight:
            self.requests[container_id] += 1
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            self._flight.notify_all()
        try:
            self._gate.wait()
            return self._status(container_id, context)
        finally:
            with self._flight:
                self.in_flight -= 1

    def ListContainers(
        self, request: api_pb2.ListContainersRequest, context: grpc.ServicerContext
    ) -> api_pb2.ListContainersResponse:
        """Every container (not held by hold(): that holds single lookups)."""
        self.lists += 1
        if not self.listed:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "ListContainers not served")
        self._fault(context)
        self._reload()
        with self._lock:
            containers = list(self._containers.items())
            exited = set(self._exited)
        return api_pb2.ListContainersResponse(
            containers=[
                api_pb2.Container(
                    id=container_id,
                    metadata=api_pb2.ContainerMetadata(name=labels[LABEL_CONTAINER]),
                    state=api_pb2.CONTAINER_EXITED
                    if container_id in exited
                    else api_pb2.CONTAINER_RUNNING,
                    labels=labels,
                )
                for container_id, labels in containers
            ]
        )

    def ListPodSandbox(
        self, request: api_pb2.ListPodSandboxRequest, context: grpc.ServicerContext
    ) -> api_pb2.ListPodSandboxResponse:
        """The sandboxes added, and one for each other pod uid the containers name."""
        self.sandbox_lists += 1
        self._fault(context)
        self._reload()
        with self._lock:
            added = dict(self._sandboxes)
            pods: dict[str, tuple[dict[str, str], bool]] = {}  # uid -> labels, ready
            for container_id, labels in self._containers.items():
                uid = labels.get(LABEL_POD_UID, "")
                if uid and uid not in added:
                    ready = pods.get(uid, (labels, False))[1] or container_id not in self._exited
                    pods[uid] = (labels, ready)
        derived = [
            _sandbox(uid, labels[LABEL_NAMESPACE], labels[LABEL_POD], ready, labels)
            for uid, (labels, ready) in pods.items()
        ]
        return api_pb2.ListPodSandboxResponse(items=[*added.values(), *derived])

    def _status(
        self, container_id: str, context: grpc.ServicerContext
    ) -> api_pb2.ContainerStatusResponse:
        self._fault(context)
        self._reload()
        with self._lock:
            labels = self._containers.get(container_id)
        if labels is None:
            # The status and wording containerd uses for an unknown id.
            context.abort(
                grpc.StatusCode.NOT_FOUND,
                f'an error occurred when try to find container "{container_id}": not found',
            )
        status = api_pb2.ContainerStatus(
            id=container_id,
            metadata=api_pb2.ContainerMetadata(name=labels[LABEL_CONTAINER]),
            state=api_pb2.CONTAINER_RUNNING,
            labels=labels,
        )
        return api_pb2.ContainerStatusResponse(status=status)

    def _fault(self, context: grpc.ServicerContext) -> None:
        if self._delay:
            self._release.wait(self._delay)
        if self._unavailable:
            context.abort(grpc.StatusCode.UNAVAILABLE, "test server set unavailable")

    def _reload(self) -> None:
        if self._file is None:
            return
        try:
            st = os.stat(self._file)
            stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
            if stamp == self._file_stamp:
                return
            with open(self._file) as f:
                entries = json.load(f)
            containers = {
                c["id"]: _labels(c["namespace"], c["pod"], c["container"], c.get("pod_uid", ""))
                for c in entries
            }
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(f"cri_server: cannot read {self._file}: {e!r}", file=sys.stderr, flush=True)
            return
        with self._lock:  # swapped whole, so no request sees a half-loaded table
            self._containers = containers
            self._file_stamp = stamp


def _labels(namespace: str, pod: str, container: str, pod_uid: str) -> dict[str, str]:
    labels = {LABEL_NAMESPACE: namespace, LABEL_POD: pod, LABEL_CONTAINER: container}
    if pod_uid:
        labels[LABEL_POD_UID] = pod_uid
    return labels


def _sandbox(
    uid: str,
    namespace: str,
    pod: str,
    ready: bool,
    labels: dict[str, str],
    annotations: dict[str, str] | None = None,
) -> api_pb2.PodSandbox:
    """A sandbox with the pod labels of `labels` (not a container's name)."""
    return api_pb2.PodSandbox(
        id=f"sandbox-{uid}",
        metadata=api_pb2.PodSandboxMetadata(name=pod, uid=uid, namespace=namespace),
        state=api_pb2.SANDBOX_READY if ready else api_pb2.SANDBOX_NOTREADY,
        labels={k: v for k, v in labels.items() if k != LABEL_CONTAINER},
        annotations=annotations,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--socket", required=True)
    parser.add_argument("--containers", help="JSON file of containers, re-read when it changes")
    args = parser.parse_args()
    server = CriTestServer()
    if args.containers:
        server.watch_file(args.containers)
    server.start(args.socket)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    print(f"listening on unix:{args.socket}", flush=True)
    done.wait()
    server.stop()


if __name__ == "__main__":
    main()
