"""PodResources v1 client: List and GetAllocatableResources over the kubelet's unix socket.

A failed List closes the channel, so the next one dials again: a restarted kubelet makes a new
socket file, and gRPC's own reconnect back-off could outlast the caller's schedule.
GetAllocatableResources is asked once per connection (a redial asks again: the restarted kubelet
may have other gates or devices); any error means "not available" on that connection, never a
failed List. close() ends a request in flight at once (a kubelet that accepts and never
answers must not hold the agent's stop).
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, replace

import grpc

from kubenpu.resolve.cri import dial
from kubenpu.resolve.podresources import DEFAULT_SOCKET, api_pb2, api_pb2_grpc

log = logging.getLogger(__name__)


class PodResourcesError(Exception):
    """The kubelet did not answer (down, restarting, no socket, deadline, UNIMPLEMENTED)."""


@dataclass(frozen=True)
class Allocated:
    """One allocated device id of one container. Device plugins: `resource` is the extended
    resource name, `id` the plugin's id. DRA: `resource` the driver name, `id` the device name,
    `pool` and `claim` ("namespace/name") set, `cdi` the CDI device names. `numa`: the NUMA
    nodes the plugin reported for the device (its Topology), sorted."""

    namespace: str
    pod: str
    container: str
    resource: str
    id: str
    pool: str = ""
    claim: str = ""
    cdi: tuple[str, ...] = ()
    numa: tuple[int, ...] = ()


class PodResourcesClient:
    """Thread safe; one channel, redialled after a failed List."""

    def __init__(self, socket: str = DEFAULT_SOCKET, timeout: float = 5.0) -> None:
        self._socket = socket
        self._timeout = timeout
        self._lock = threading.Lock()
        self._channel: grpc.Channel | None = None
        self._closed = False
        # GetAllocatableResources' answer on the current channel: None until asked.
        self._allocatable: list[Allocated] | _NotAvailable | None = None

    def list(self) -> tuple[list[Allocated], Counter[str]]:
        """Every allocated id, once per container (the kubelet repeats an id once per NUMA
        node), and the entries skipped by reason (empty_pod: a pod or container without a
        name). Raises PodResourcesError."""
        channel = self._dial()
        try:
            response = self._call(channel, "List", api_pb2.ListPodResourcesRequest())
        except PodResourcesError:
            self._drop(channel)
            raise
        return allocations(response)

    def allocatable(self) -> list[Allocated] | None:
        """Every device the kubelet can allocate (namespace, pod and container empty), asked
        once per connection; None where it is not available (an old kubelet, the
        KubeletPodResourcesGetAllocatable gate off, an answer over the size limit). Raises
        PodResourcesError only on the first ask of a connection that fails, with the reason."""
        channel = self._dial()
        with self._lock:
            known = self._allocatable
        if known is not None:
            return None if isinstance(known, _NotAvailable) else known
        try:
            response = self._call(
                channel, "GetAllocatableResources", api_pb2.AllocatableResourcesRequest()
            )
        except PodResourcesError:
            self._learned(channel, _NotAvailable())
            raise
        found = _merged(
            Allocated("", "", "", d.resource_name, i, numa=_numa(d))
            for d in response.devices  # type: ignore[attr-defined]
            for i in d.device_ids
        )
        self._learned(channel, found)
        return found

    def close(self) -> None:
        """Closes the channel; a request in flight, and every later one, ends at once with
        PodResourcesError."""
        with self._lock:
            self._closed = True
            channel, self._channel = self._channel, None
        if channel is not None:
            channel.close()

    def _dial(self) -> grpc.Channel:
        with self._lock:
            if self._closed:
                raise PodResourcesError(f"{self._socket}: closed")
            if self._channel is None:
                self._channel = dial(self._socket)
                self._allocatable = None  # a new connection learns it again
            return self._channel

    def _learned(self, channel: grpc.Channel, answer: list[Allocated] | _NotAvailable) -> None:
        with self._lock:
            if self._channel is channel:
                self._allocatable = answer

    def _call(self, channel: grpc.Channel, method: str, request: object) -> object:
        stub = api_pb2_grpc.PodResourcesListerStub(channel)
        try:
            return getattr(stub, method)(request, timeout=self._timeout)
        except grpc.RpcError as e:
            raise PodResourcesError(
                f"{self._socket}: {method}: {e.code().name}: {e.details()}"
            ) from e
        except ValueError as e:  # closed channel: close() ran meanwhile
            raise PodResourcesError(f"{self._socket}: closed") from e

    def _drop(self, channel: grpc.Channel) -> None:
        with self._lock:
            stale = self._channel is channel
            if stale:
                self._channel = None
        if stale:
            channel.close()


class _NotAvailable:
    """GetAllocatableResources failed on this connection: not asked again on it."""


def _numa(devices: object) -> tuple[int, ...]:
    topology = devices.topology  # type: ignore[attr-defined]
    return tuple(sorted({n.ID for n in topology.nodes}))


def _merged(found: Iterable[Allocated]) -> list[Allocated]:
    """One entry per container and id, with the NUMA nodes of its repeats together: the kubelet
    sends a device once per NUMA node of its topology (containerDevicesFromResourceDeviceInstances
    in pkg/kubelet/cm), and a repeat is not another share."""
    merged: dict[tuple[object, ...], Allocated] = {}
    for a in found:
        key = (a.namespace, a.pod, a.container, a.resource, a.id, a.pool, a.claim)
        if (seen := merged.get(key)) is not None:
            a = replace(seen, numa=tuple(sorted({*seen.numa, *a.numa})))
        merged[key] = a
    return list(merged.values())


def allocations(response: object) -> tuple[list[Allocated], Counter[str]]:
    """The ids of a ListPodResourcesResponse, device plugins' and DRA's, once each, and the
    skips."""
    found: list[Allocated] = []
    skipped: Counter[str] = Counter()
    for pod in response.pod_resources:  # type: ignore[attr-defined]
        for c in pod.containers:
            if not (pod.name and pod.namespace and c.name):
                skipped["empty_pod"] += 1
                continue
            where = (pod.namespace, pod.name, c.name)
            found += [
                Allocated(*where, d.resource_name, i, numa=_numa(d))
                for d in c.devices
                for i in d.device_ids
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
    return _merged(found), skipped
