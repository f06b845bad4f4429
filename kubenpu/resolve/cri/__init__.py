"""Pod and container names of a container id, and pods' uids, labels and annotations from their
sandboxes, from the CRI v1 RuntimeService over a unix socket.

api.proto is a hand-written subset of k8s.io/cri-api runtime/v1 (same names and field numbers);
api_pb2*.py are generated from it by scripts/gen-cri.sh.
"""

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf.message import Message

from kubenpu.resolve import DEFAULT_ENDPOINT
from kubenpu.resolve.cri import api_pb2, api_pb2_grpc
from kubenpu.resolve.result import Attribution, Unattributed

log = logging.getLogger(__name__)

# Labels kubelet puts on every container it creates.
LABEL_NAMESPACE = "io.kubernetes.pod.namespace"
LABEL_POD = "io.kubernetes.pod.name"
LABEL_POD_UID = "io.kubernetes.pod.uid"
LABEL_CONTAINER = "io.kubernetes.container.name"

# Kubernetes' own limits: a namespace and a container name are DNS labels (63), a pod name a
# DNS subdomain (253). A container kubelet did not create is named by its CRI metadata, which
# has no limit of Kubernetes': it gets the subdomain's. A pod uid is a UUID (36; a static pod's
# is kubelet's 32-digit hash). Longer: label_too_long, empty labels.
LABEL_LIMITS = {LABEL_NAMESPACE: 63, LABEL_POD: 253, LABEL_CONTAINER: 63, LABEL_POD_UID: 36}
_NAME_LIMIT = 253
# A label or annotation key: a DNS subdomain prefix, a slash, a name of 63. A pod's annotations,
# keys and values, are 256 KiB at most (Kubernetes' TotalAnnotationSizeLimitB).
_KEY_LIMIT = 253 + 1 + 63
_MAP_LIMIT = 256 << 10
# The runtime's name and version go into one log line.
_VERSION_LIMIT = 128


@dataclass(frozen=True)
class Sandbox:
    """A ready pod sandbox: its pod's uid, and the labels and annotations kubelet created it
    with (the pod's own, plus kubelet's io.kubernetes.pod.* labels)."""

    uid: str
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)


# Called once per RPC sent, from the thread that sent it: its duration and whether the runtime
# answered. NOT_FOUND is an answer (ok=True); UNAVAILABLE, deadline and other failures are not
# (ok=False).
RequestObserver = Callable[[float, bool], None]

# Kubelet's limit for CRI and PodResources messages: a list of every container on a busy node
# fits.
_MAX_MESSAGE_BYTES = 16 << 20
# Failures that are answers: the runtime is up, it just has nothing for this request (an unknown
# container, a method it lacks, a list over the message limit). No back-off follows them.
_ANSWERS = (
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.UNIMPLEMENTED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
)


def grpc_target(endpoint: str) -> str:
    """gRPC target for "unix:///path", or a bare path, absolute or relative: gRPC's "unix:"
    scheme takes both ("unix://" only an absolute one)."""
    if endpoint.startswith("unix:"):
        return endpoint
    return f"unix://{endpoint}" if endpoint.startswith("/") else f"unix:{endpoint}"


def dial(endpoint: str) -> grpc.Channel:
    """A channel with its own subchannels. gRPC shares subchannels among channels to one
    address by default, so a channel opened to redial after a failure could take over the
    closed one's subchannel, still in its reconnect back-off, and fail at once with the old
    error (a restarted kubelet or runtime unreachable for up to gRPC's 120 s back-off)."""
    return grpc.insecure_channel(
        grpc_target(endpoint),
        options=[
            ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
            ("grpc.use_local_subchannel_pool", 1),
        ],
    )


def socket_path(endpoint: str) -> str:
    return endpoint.removeprefix("unix://").removeprefix("unix:")


class CriClient:
    """Looks containers up; safe to call from several threads at once (one shared channel).

    After a failed request no request is sent for `retry_after` seconds: a runtime that is down
    must not be asked once per container. Answers are not cached here: the Resolver owns that.
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
        self._lock = threading.Lock()  # guards the fields below
        self._channel: grpc.Channel | None = None
        self._stub: api_pb2_grpc.RuntimeServiceStub | None = None
        self._down_until: float | None = None  # set while backing off after a failure
        self._closed = False
        self._warned: set[str] = set()  # sandboxes past the limits, told once (those listed)

    def version(self) -> str | None:
        """ "<runtime> <version> (CRI <api version>)" for a startup log line, or None (logged)."""
        v = self._ask("Version", api_pb2.VersionRequest(version="v1"))
        if isinstance(v, Unattributed):
            return None
        name, version, api = (
            s[:_VERSION_LIMIT] for s in (v.runtime_name, v.runtime_version, v.runtime_api_version)
        )
        return f"{name} {version} (CRI {api})"

    def lookup(self, container_id: str) -> Attribution:
        """The container's pod; container_not_found if the runtime does not know it (yet),
        cri_error if it did not answer or we are backing off."""
        request = api_pb2.ContainerStatusRequest(container_id=container_id)
        response = self._ask("ContainerStatus", request)
        if isinstance(response, Unattributed):
            return Attribution(reason=response)
        return _attribution(response.status)

    def containers(self) -> dict[str, Attribution]:
        """Every container the runtime lists, by id, in one request (a start on a busy node
        asks once, not once per container); empty if there is no list."""
        response = self._ask("ListContainers", api_pb2.ListContainersRequest())
        if isinstance(response, Unattributed):
            return {}
        return {c.id: _attribution(c) for c in response.containers}

    def sends_again_at(self) -> float:
        """When (on the clock) requests are sent again after a failure; 0 when not backing off."""
        with self._lock:
            return self._down_until or 0.0

    def sandboxes(self) -> dict[tuple[str, str], Sandbox] | None:
        """Each pod's uid, labels and annotations by (namespace, name), from its ready sandbox
        in one ListPodSandbox (kubelet gives a sandbox its pod's labels and annotations when it
        creates it; no CRI call changes them after). A name with two ready sandboxes of
        different uids (a pod recreated while its predecessor's sandbox still runs) maps to
        none; a sandbox past Kubernetes' limits is skipped, with one warning. None if the
        runtime did not answer."""
        response = self._ask("ListPodSandbox", api_pb2.ListPodSandboxRequest())
        if isinstance(response, Unattributed):
            return None
        found: dict[tuple[str, str], dict[str, Sandbox]] = {}  # by uid
        for s in response.items:
            if s.state == api_pb2.SANDBOX_READY and (sandbox := self._sandbox(s)) is not None:
                pod = (s.metadata.namespace, s.metadata.name)
                found.setdefault(pod, {})[sandbox.uid] = sandbox
        with self._lock:
            self._warned &= {s.id for s in response.items}
        return {pod: one.popitem()[1] for pod, one in found.items() if len(one) == 1}

    def pod_uids(self) -> dict[tuple[str, str], str] | None:
        """Each pod's uid by (namespace, name) (sandboxes()): the kubelet's PodResources names
        pods without it. None if the runtime did not answer."""
        found = self.sandboxes()
        return None if found is None else {pod: s.uid for pod, s in found.items()}

    def close(self) -> None:
        """Ends in-flight requests at once (they read as cri_error) and sends no more."""
        with self._lock:
            self._closed = True
            channel, self._channel, self._stub = self._channel, None, None
        if channel is not None:
            channel.close()

    def _sandbox(self, s: api_pb2.PodSandbox) -> Sandbox | None:
        """The sandbox's pod, or None (warned once per sandbox) past Kubernetes' limits."""
        m = s.metadata
        names = ((m.namespace, LABEL_NAMESPACE), (m.name, LABEL_POD), (m.uid, LABEL_POD_UID))
        named = all(0 < len(value) <= LABEL_LIMITS[label] for value, label in names)
        if named and _within(s.labels) and _within(s.annotations):
            return Sandbox(m.uid, dict(s.labels), dict(s.annotations))
        with self._lock:
            told = s.id in self._warned
            self._warned.add(s.id)
        if not told:
            log.warning(
                "CRI sandbox %.64s: a name, uid, label or annotation past Kubernetes' limits "
                "(keys %d characters, each map %d): its pod is left unnamed (no pod_uid on its "
                "allocation series; the guard does not check it, counted unseen)",
                s.id,
                _KEY_LIMIT,
                _MAP_LIMIT,
            )
        return None

    def _ask(self, method: str, request: Message) -> Any:
        """The response, or the reason there is none."""
        with self._lock:
            if self._closed or (self._down_until is not None and self._clock() < self._down_until):
                return Unattributed.CRI_ERROR
            if self._stub is None:
                self._channel = dial(self._endpoint)
                self._stub = api_pb2_grpc.RuntimeServiceStub(self._channel)
            channel, stub = self._channel, self._stub
        start = time.monotonic()
        try:
            response = getattr(stub, method)(request, timeout=self._timeout)
        except ValueError:  # "closed channel": close(), or another thread replaced it
            return Unattributed.CRI_ERROR
        except grpc.RpcError as e:
            if self._closed:  # cancelled by close(): not the runtime's failure
                return Unattributed.CRI_ERROR
            if e.code() in _ANSWERS:
                self._answered(start)
                return Unattributed.CONTAINER_NOT_FOUND
            self._failed(e, channel)
            self._observe(start, False)
            return Unattributed.CRI_ERROR
        self._answered(start)
        return response

    def _answered(self, start: float) -> None:
        with self._lock:
            recovered, self._down_until = self._down_until is not None, None
        if recovered:
            log.info("CRI endpoint %s answers again", self._endpoint)
        self._observe(start, True)

    def _observe(self, start: float, ok: bool) -> None:
        """Last, once the request's effect on the back-off is in place."""
        if self._on_request is not None:
            self._on_request(time.monotonic() - start, ok)

    def _failed(self, error: grpc.RpcError, channel: grpc.Channel | None) -> None:
        with self._lock:
            if self._closed:
                return
            first = self._down_until is None
            self._down_until = self._clock() + self._retry_after
            # A fresh channel on retry: gRPC's own reconnect back-off could outlast ours. Only
            # the channel this request used: another thread may have opened a new one already.
            stale = self._channel is channel
            if stale:
                self._channel = self._stub = None
        if first:
            log.warning(
                "CRI endpoint %s: %s; new pods' calls are held for their names "
                "(kubenpu_pending_calls), retrying every %gs",
                self._endpoint,
                _describe(self._endpoint, error),
                self._retry_after,
            )
        if stale and channel is not None:
            channel.close()


def _attribution(status: api_pb2.ContainerStatus | api_pb2.Container) -> Attribution:
    labels = status.labels
    if any(len(labels.get(k, "")) > n for k, n in LABEL_LIMITS.items()) or (
        len(status.metadata.name) > _NAME_LIMIT
    ):
        log.warning(
            "CRI container %.64s: a label longer than Kubernetes allows (namespace and "
            "container 63, pod 253, pod uid 36 characters): its calls get empty labels "
            "(label_too_long)",
            status.id,
        )
        return Attribution(reason=Unattributed.LABEL_TOO_LONG)
    container = labels.get(LABEL_CONTAINER) or status.metadata.name
    if not (labels.get(LABEL_NAMESPACE) and labels.get(LABEL_POD)):
        # A container kubelet did not create (e.g. started with ctr or nerdctl).
        return Attribution(container=container, reason=Unattributed.NOT_POD)
    return Attribution(
        labels[LABEL_NAMESPACE], labels[LABEL_POD], container, pod_uid=labels.get(LABEL_POD_UID, "")
    )


def _within(pairs: Mapping[str, str]) -> bool:
    """Whether a label or annotation map keeps Kubernetes' limits: keys of a DNS subdomain
    prefix and a 63-character name, the keys and values of a pod's annotations 256 KiB in all
    (its labels get the same bound)."""
    return all(len(k) <= _KEY_LIMIT for k in pairs) and (
        sum(len(k) + len(v) for k, v in pairs.items()) <= _MAP_LIMIT
    )


def _describe(endpoint: str, error: grpc.RpcError) -> str:
    path = socket_path(endpoint)
    if error.code() == grpc.StatusCode.UNAVAILABLE and not os.path.exists(path):
        return f"socket {path} does not exist"
    return f"{error.code().name}: {error.details()}"
