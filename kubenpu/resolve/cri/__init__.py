"""Pod and container names of a container id, from the CRI v1 RuntimeService over a unix socket.

api.proto is a hand-written subset of k8s.io/cri-api runtime/v1 (same names and field numbers);
api_pb2*.py are generated from it by scripts/gen-cri.sh.
"""

import logging
import os
import time
from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf.message import Message

from kubenpu.resolve.attribution import CONTAINER_NOT_FOUND, CRI_ERROR, NOT_POD, Attribution
from kubenpu.resolve.cri import api_pb2, api_pb2_grpc

log = logging.getLogger(__name__)

DEFAULT_ENDPOINT = "unix:///run/containerd/containerd.sock"

# Labels kubelet puts on every container it creates.
LABEL_NAMESPACE = "io.kubernetes.pod.namespace"
LABEL_POD = "io.kubernetes.pod.name"
LABEL_POD_UID = "io.kubernetes.pod.uid"
LABEL_CONTAINER = "io.kubernetes.container.name"

# Called once per RPC sent: its duration and whether the runtime answered. NOT_FOUND is an
# answer (ok=True); UNAVAILABLE, deadline and other failures are not (ok=False).
RequestObserver = Callable[[float, bool], None]


def grpc_target(endpoint: str) -> str:
    """gRPC target for "unix:///path" or a bare "/path"."""
    return endpoint if endpoint.startswith("unix:") else f"unix://{endpoint}"


def socket_path(endpoint: str) -> str:
    return endpoint.removeprefix("unix://").removeprefix("unix:")


class CriClient:
    """Looks containers up and caches the answers per container id. Not thread-safe.

    After a failed request no request is sent for `retry_after` seconds: a runtime that is down
    must not be asked once per event. Failures are not cached, so lookups recover on their own.
    """

    def __init__(
        self,
        endpoint: str = DEFAULT_ENDPOINT,
        timeout: float = 2.0,
        retry_after: float = 30.0,
        on_request: RequestObserver | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._endpoint = endpoint
        self._timeout = timeout
        self._retry_after = retry_after
        self._on_request = on_request
        self._clock = clock
        self._channel: grpc.Channel | None = None
        self._stub: api_pb2_grpc.RuntimeServiceStub | None = None
        self._cache: dict[str, Attribution] = {}
        self._down_until: float | None = None  # set while backing off after a failure

    def version(self) -> str | None:
        """ "<runtime> <version> (CRI <api version>)" for a startup log line, or None (logged)."""
        try:
            v = self._call(self._runtime().Version, api_pb2.VersionRequest(version="v1"))
        except grpc.RpcError as e:
            self._failed(e)
            return None
        return f"{v.runtime_name} {v.runtime_version} (CRI {v.runtime_api_version})"

    def lookup(self, container_id: str) -> Attribution:
        if cached := self._cache.get(container_id):
            return cached
        if self._down_until is not None and self._clock() < self._down_until:
            return Attribution(reason=CRI_ERROR)
        request = api_pb2.ContainerStatusRequest(container_id=container_id)
        try:
            response = self._call(self._runtime().ContainerStatus, request)
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.NOT_FOUND:
                self._failed(e)
                return Attribution(reason=CRI_ERROR)
            result = Attribution(reason=CONTAINER_NOT_FOUND)
        else:
            result = _attribution(response.status)
        self._cache[container_id] = result
        return result

    def forget(self, container_id: str) -> None:
        self._cache.pop(container_id, None)

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = self._stub = None

    def _runtime(self) -> api_pb2_grpc.RuntimeServiceStub:
        if self._stub is None:
            self._channel = grpc.insecure_channel(grpc_target(self._endpoint))
            self._stub = api_pb2_grpc.RuntimeServiceStub(self._channel)
        return self._stub

    def _call(self, method: Callable[..., Any], request: Message) -> Any:
        start = time.monotonic()
        ok = False
        try:
            response = method(request, timeout=self._timeout)
            ok = True
            return response
        except grpc.RpcError as e:
            ok = e.code() == grpc.StatusCode.NOT_FOUND
            raise
        finally:
            if self._on_request is not None:
                self._on_request(time.monotonic() - start, ok)
            if ok and self._down_until is not None:
                log.info("CRI endpoint %s answers again", self._endpoint)
                self._down_until = None

    def _failed(self, error: grpc.RpcError) -> None:
        if self._down_until is None:
            log.warning(
                "CRI endpoint %s: %s; pods get empty labels, retrying every %gs",
                self._endpoint,
                _describe(self._endpoint, error),
                self._retry_after,
            )
        self._down_until = self._clock() + self._retry_after
        # A fresh channel on retry: gRPC's own reconnect back-off could outlast ours.
        self.close()


def _attribution(status: api_pb2.ContainerStatus) -> Attribution:
    labels = status.labels
    container = labels.get(LABEL_CONTAINER) or status.metadata.name
    if not (labels.get(LABEL_NAMESPACE) and labels.get(LABEL_POD)):
        # A container kubelet did not create (e.g. started with ctr or nerdctl).
        return Attribution(container=container, reason=NOT_POD)
    return Attribution(labels[LABEL_NAMESPACE], labels[LABEL_POD], container)


def _describe(endpoint: str, error: grpc.RpcError) -> str:
    path = socket_path(endpoint)
    if error.code() == grpc.StatusCode.UNAVAILABLE and not os.path.exists(path):
        return f"socket {path} does not exist"
    return f"{error.code().name}: {error.details()}"
