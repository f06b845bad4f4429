"""PodResources v1 client: List and GetAllocatableResources over the kubelet's unix socket.

A failed request closes the channel, so the next one dials again: a restarted kubelet makes a
new socket file, and gRPC's own reconnect back-off could outlast the caller's schedule.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from dataclasses import dataclass

import grpc

from kubenpu.resolve.cri import grpc_target
from kubenpu.resolve.podresources import DEFAULT_SOCKET, api_pb2, api_pb2_grpc

log = logging.getLogger(__name__)

# A List of every pod on a busy node fits (the kubelet's own limit for the API is 16 MiB).
_MAX_MESSAGE_BYTES = 16 << 20


class PodResourcesError(Exception):
    """The kubelet did not answer (down, restarting, no socket, deadline)."""


@dataclass(frozen=True)
class Allocated:
    """One allocated device id of one container. Device plugins: `resource` is the extended
    resource name, `id` the plugin's id. DRA: `resource` the driver name, `id` the device name,
    `pool` and `claim` ("namespace/name") set, `cdi` the CDI device names."""

    namespace: str
    pod: str
    container: str
    resource: str
    id: str
    pool: str = ""
    claim: str = ""
    cdi: tuple[str, ...] = ()


class PodResourcesClient:
    """Thread safe; one channel, redialled after a failure."""

    def __init__(self, socket: str = DEFAULT_SOCKET, timeout: float = 5.0) -> None:
        self._socket = socket
        self._timeout = timeout
        self._lock = threading.Lock()
        self._channel: grpc.Channel | None = None
        self._allocatable_unimplemented = False  # an old kubelet: asked once, not every refresh

    def list(self) -> tuple[list[Allocated], Counter[str]]:
        """Every allocated id, and the entries skipped by reason (empty_pod: a pod or container
        without a name). Raises PodResourcesError."""
        response = self._call("List", api_pb2.ListPodResourcesRequest())
        return allocations(response)

    def allocatable(self) -> list[tuple[str, str]] | None:
        """(resource, id) of every device the kubelet can allocate; None on a kubelet without
        GetAllocatableResources (remembered). Raises PodResourcesError."""
        if self._allocatable_unimplemented:
            return None
        try:
            response = self._call("GetAllocatableResources", api_pb2.AllocatableResourcesRequest())
        except _Unimplemented:
            self._allocatable_unimplemented = True
            log.info("kubelet %s has no GetAllocatableResources; not asked again", self._socket)
            return None
        return [(d.resource_name, i) for d in response.devices for i in d.device_ids]

    def close(self) -> None:
        with self._lock:
            channel, self._channel = self._channel, None
        if channel is not None:
            channel.close()

    def _call(self, method: str, request: object) -> object:
        with self._lock:
            if self._channel is None:
                self._channel = grpc.insecure_channel(
                    grpc_target(self._socket),
                    options=[("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES)],
                )
            channel = self._channel
        stub = api_pb2_grpc.PodResourcesListerStub(channel)
        try:
            return getattr(stub, method)(request, timeout=self._timeout)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                raise _Unimplemented() from e
            self._drop(channel)
            raise PodResourcesError(f"{self._socket}: {e.code().name}: {e.details()}") from e
        except ValueError as e:  # closed channel: close() ran meanwhile
            raise PodResourcesError(f"{self._socket}: closed") from e

    def _drop(self, channel: grpc.Channel) -> None:
        with self._lock:
            stale = self._channel is channel
            if stale:
                self._channel = None
        if stale:
            channel.close()


class _Unimplemented(Exception):
    pass


def allocations(response: object) -> tuple[list[Allocated], Counter[str]]:
    """The ids of a ListPodResourcesResponse, device plugins' and DRA's, and the skips."""
    found: list[Allocated] = []
    skipped: Counter[str] = Counter()
    for pod in response.pod_resources:  # type: ignore[attr-defined]
        for c in pod.containers:
            if not (pod.name and pod.namespace and c.name):
                skipped["empty_pod"] += 1
                continue
            where = (pod.namespace, pod.name, c.name)
            found += [
                Allocated(*where, d.resource_name, i) for d in c.devices for i in d.device_ids
            ]
            found += [
                Allocated(
                    *where,
                    r.driver_name,
                    r.device_name,
                    pool=r.pool_name,
                    claim=f"{dra.claim_namespace}/{dra.claim_name}",
                    cdi=tuple(d.name for d in r.cdi_devices),
                )
                for dra in c.dynamic_resources
                for r in dra.claim_resources
            ]
    return found, skipped
