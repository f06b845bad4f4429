import json
import logging
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest
from cri_server import RUNTIME_NAME, CriTestServer
from fakes import Clock

from kubenpu.resolve import Attribution
from kubenpu.resolve.cri import (
    LABEL_NAMESPACE,
    LABEL_POD,
    LABEL_POD_UID,
    CriClient,
    Sandbox,
    api_pb2,
    api_pb2_grpc,
    dial,
    grpc_target,
)

CID = "a" * 64
OTHER = "b" * 64
TIMEOUT = 5.0  # generous: only the slow-server test is meant to hit a deadline


class Requests:
    """The on_request observer: what the client reports to the metrics."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, bool]] = []

    def __call__(self, seconds: float, ok: bool) -> None:
        self.calls.append((seconds, ok))

    @property
    def oks(self) -> list[bool]:
        return [ok for _, ok in self.calls]


@pytest.fixture
def sock(cri_socket: str) -> str:
    return cri_socket


@pytest.fixture
def server(cri: CriTestServer) -> CriTestServer:
    cri.add_container(CID, "ml", "trainer-0", "worker", pod_uid="u-1")
    return cri


def client(sock: str, **kw: Any) -> CriClient:
    return CriClient(f"unix://{sock}", **{"timeout": TIMEOUT, **kw})


# The client caches nothing (the Resolver owns the answers: see test_resolver.py's
# test_answers_are_cached and test_forgotten_container_is_asked_again).


def test_labels_resolved(server: CriTestServer, sock: str) -> None:
    requests = Requests()
    c = client(sock, on_request=requests)
    assert c.lookup(CID) == Attribution("ml", "trainer-0", "worker", pod_uid="u-1")
    assert c.lookup(CID) == Attribution("ml", "trainer-0", "worker", pod_uid="u-1")
    assert server.requests[CID] == 2
    assert requests.oks == [True, True]


def test_not_found_is_an_answer_and_asked_again(server: CriTestServer, sock: str) -> None:
    requests = Requests()
    c = client(sock, on_request=requests)
    assert c.lookup(OTHER) == Attribution(reason="container_not_found")
    server.add_container(OTHER, "ml", "trainer-0", "late")
    assert c.lookup(OTHER) == Attribution("ml", "trainer-0", "late")
    assert server.requests[OTHER] == 2
    assert requests.oks == [True, True]  # the runtime answered


def test_the_list_names_every_container_in_one_request(server: CriTestServer, sock: str) -> None:
    server.add_container(OTHER, "", "", "adhoc")
    requests = Requests()
    assert client(sock, on_request=requests).containers() == {
        CID: Attribution("ml", "trainer-0", "worker", pod_uid="u-1"),
        OTHER: Attribution(container="adhoc", reason="not_pod"),
    }
    assert server.lists == 1 and requests.oks == [True]


def test_a_runtime_without_the_list_is_no_failure(server: CriTestServer, sock: str) -> None:
    server.listed = False
    requests = Requests()
    c = client(sock, on_request=requests)
    assert c.containers() == {}
    assert c.lookup(CID).container == "worker"  # no back-off: the runtime answered
    assert requests.oks == [True, True]


def test_container_without_kubelet_labels(server: CriTestServer, sock: str) -> None:
    server.add_container(OTHER, "", "", "adhoc")
    assert client(sock).lookup(OTHER) == Attribution(container="adhoc", reason="not_pod")


def test_bare_path_endpoint(server: CriTestServer, sock: str) -> None:
    assert CriClient(sock, timeout=TIMEOUT).lookup(CID).pod == "trainer-0"
    assert grpc_target("/run/crio/crio.sock") == "unix:///run/crio/crio.sock"
    assert grpc_target("unix:///run/crio/crio.sock") == "unix:///run/crio/crio.sock"
    assert grpc_target("run/crio.sock") == "unix:run/crio.sock"  # relative: "unix://" rejects it


def test_version(server: CriTestServer, sock: str) -> None:
    assert client(sock).version() == f"{RUNTIME_NAME} 0.1.0 (CRI v1)"


def test_server_down_then_recovers_after_back_off(server: CriTestServer, sock: str) -> None:
    clock, requests = Clock(), Requests()
    c = client(sock, retry_after=30.0, on_request=requests, clock=clock)
    server.stop()
    assert c.lookup(CID) == Attribution(reason="cri_error")
    assert requests.oks == [False]

    server.start(sock)
    clock.now += 29
    assert c.lookup(CID) == Attribution(reason="cri_error")  # still backing off: not asked
    assert requests.oks == [False]
    assert server.requests[CID] == 0

    clock.now += 2
    assert c.lookup(CID) == Attribution("ml", "trainer-0", "worker", pod_uid="u-1")
    assert requests.oks == [False, True]


def test_redial_does_not_inherit_a_failed_connection(server: CriTestServer, sock: str) -> None:
    """A channel opened to redial after a failure gets a connection of its own. With gRPC's
    shared subchannels it took the failed channel's, still in its reconnect back-off, and
    failed at once with the old error (two CI runs: a restarted kubelet stayed unreachable)."""
    server.stop()
    failed = dial(sock)
    with pytest.raises(grpc.RpcError):  # its connection now backs off, for a second or more
        api_pb2_grpc.RuntimeServiceStub(failed).Version(api_pb2.VersionRequest(), timeout=TIMEOUT)
    server.start(sock)
    fresh = dial(sock)
    try:
        answer = api_pb2_grpc.RuntimeServiceStub(fresh).Version(
            api_pb2.VersionRequest(), timeout=TIMEOUT
        )
    finally:
        fresh.close()
        failed.close()
    assert answer.runtime_name == RUNTIME_NAME


def test_unavailable_status_is_not_cached(server: CriTestServer, sock: str) -> None:
    clock = Clock()
    c = client(sock, retry_after=10.0, clock=clock)
    server.set_unavailable()
    assert c.lookup(CID) == Attribution(reason="cri_error")
    server.set_unavailable(False)
    clock.now += 11
    assert c.lookup(CID).container == "worker"
    assert server.requests[CID] == 2


def test_missing_socket_warns_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    clock, requests = Clock(), Requests()
    path = tmp_path / "absent.sock"
    c = CriClient(str(path), timeout=TIMEOUT, retry_after=1.0, on_request=requests, clock=clock)
    with caplog.at_level(logging.WARNING):
        assert c.version() is None
        clock.now += 2
        assert c.lookup(CID) == Attribution(reason="cri_error")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert f"socket {path} does not exist" in warnings[0]
    assert "\n" not in warnings[0]
    assert requests.oks == [False, False]


def test_slow_server_hits_the_deadline(server: CriTestServer, sock: str) -> None:
    requests = Requests()
    c = client(sock, timeout=0.2, on_request=requests)
    server.set_slow(60)  # released by server.stop()
    assert c.lookup(CID) == Attribution(reason="cri_error")
    assert requests.oks == [False]


def test_script_mode_rereads_the_containers_file(tmp_path: Path, sock: str) -> None:
    file = tmp_path / "containers.json"
    entry = {"id": CID, "namespace": "ml", "pod": "p", "container": "c", "pod_uid": "u"}
    file.write_text(json.dumps([entry]))
    script = Path(__file__).with_name("cri_server.py")
    cmd = [sys.executable, str(script), "--socket", sock, "--containers", str(file)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == f"listening on unix:{sock}"
        c = client(sock)
        assert c.lookup(CID) == Attribution("ml", "p", "c", pod_uid="u")
        assert c.lookup(OTHER) == Attribution(reason="container_not_found")

        new = tmp_path / "containers.json.new"
        new.write_text(json.dumps([entry, {**entry, "id": OTHER, "container": "d"}]))
        os.replace(new, file)
        assert c.lookup(OTHER) == Attribution("ml", "p", "d", pod_uid="u")
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0


def test_concurrent_lookups_share_one_client(server: CriTestServer, sock: str) -> None:
    ids = [f"{i:064x}" for i in range(32)]
    for container_id in ids:
        server.add_container(container_id, "ml", f"pod-{container_id[-2:]}", "c")
    requests = Requests()
    c = client(sock, on_request=requests)
    server.hold()
    with ThreadPoolExecutor(8) as pool:
        answers = pool.map(c.lookup, ids)
        assert server.wait_in_flight(8)
        server.release()
        assert [a.pod for a in answers] == [f"pod-{i[-2:]}" for i in ids]
    assert requests.oks == [True] * 32


def test_close_ends_a_running_request(server: CriTestServer, sock: str) -> None:
    """close() cancels a request the runtime holds (the timeout here is an hour); that is not
    the runtime's failure, and nothing is sent afterwards."""
    requests = Requests()
    c = client(sock, timeout=3600.0, on_request=requests)
    server.hold()
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(c.lookup, CID)
        assert server.wait_in_flight(1)
        c.close()
        assert answer.result(timeout=60) == Attribution(reason="cri_error")
    server.release()
    assert c.lookup(CID) == Attribution(reason="cri_error")
    assert server.requests[CID] == 1
    assert requests.oks == []


@pytest.mark.parametrize(
    "namespace, pod, container",
    [("n" * 64, "p", "c"), ("n", "p" * 254, "c"), ("n", "p", "c" * 64), ("", "", "c" * 254)],
    ids=["namespace", "pod", "container", "unlabelled-container"],
)
def test_labels_past_kubernetes_limits_are_a_counted_skip(
    server: CriTestServer, sock: str, namespace: str, pod: str, container: str, caplog
) -> None:
    """A runtime's names had no bound: a megabyte of pod name became a label of every series.
    Kubernetes' own limits: namespace and container name 63 (DNS labels), pod name 253."""
    server.add_container(OTHER, namespace, pod, container)
    with caplog.at_level(logging.WARNING):
        assert client(sock).lookup(OTHER) == Attribution(reason="label_too_long")
        assert client(sock).containers()[OTHER] == Attribution(reason="label_too_long")
    assert "longer than Kubernetes allows" in caplog.text


def test_a_pod_uid_past_a_uuids_length_is_a_counted_skip(server: CriTestServer, sock: str) -> None:
    server.add_container(OTHER, "n", "p", "c", pod_uid="u" * 37)
    assert client(sock).lookup(OTHER) == Attribution(reason="label_too_long")
    server.add_container(OTHER, "n", "p", "c", pod_uid="u" * 36)
    assert client(sock).lookup(OTHER) == Attribution("n", "p", "c", pod_uid="u" * 36)


def test_labels_at_kubernetes_limits_are_kept(server: CriTestServer, sock: str) -> None:
    server.add_container(OTHER, "n" * 63, "p" * 253, "c" * 63)
    assert client(sock).lookup(OTHER) == Attribution("n" * 63, "p" * 253, "c" * 63)


def test_a_runtime_version_is_cut_for_its_log_line(server: CriTestServer, sock: str) -> None:
    server.version = "v" * 100_000
    assert len(client(sock).version() or "") < 600


UID_A, UID_B, UID_OLD = ("0b1c2d3e-0000-4000-8000-00000000000" + c for c in "abc")


def test_sandboxes_name_ready_pods_with_their_labels_and_annotations(
    server: CriTestServer, sock: str
) -> None:
    """One ListPodSandbox: each ready sandbox's pod by namespace and name, with its labels
    (kubelet's io.kubernetes.pod.* among them) and annotations. A predecessor's sandbox that is
    not ready (same name, old uid) is ignored, so the name keeps its uid; a pod whose containers
    name it (CID's, u-1) is listed by its sandbox too."""
    server.add_sandbox(UID_A, "ml", "a", {"team": "x"}, {"note": "y"})
    server.add_sandbox(UID_OLD, "ml", "a", {"team": "old"}, ready=False)
    server.add_sandbox(UID_B, "ml", "b", ready=False)
    requests = Requests()
    found = client(sock, on_request=requests).sandboxes()
    assert found is not None and set(found) == {("ml", "a"), ("ml", "trainer-0")}
    assert found["ml", "a"] == Sandbox(
        UID_A,
        {"team": "x", LABEL_NAMESPACE: "ml", LABEL_POD: "a", LABEL_POD_UID: UID_A},
        {"note": "y"},
    )
    assert found["ml", "trainer-0"].uid == "u-1"
    assert server.sandbox_lists == 1 and requests.oks == [True]
    assert client(sock).pod_uids() == {("ml", "a"): UID_A, ("ml", "trainer-0"): "u-1"}


def test_a_name_with_two_ready_sandboxes_of_different_uids_names_none(
    server: CriTestServer, sock: str
) -> None:
    """A pod recreated under its name while its predecessor's sandbox is still ready: which uid
    is the pod's is unknown, so neither is taken; once the old one stops, the new one is."""
    server.add_sandbox(UID_OLD, "ml", "a")
    server.add_sandbox(UID_A, "ml", "a")
    assert ("ml", "a") not in (client(sock).sandboxes() or {})
    server.add_sandbox(UID_OLD, "ml", "a", ready=False)
    assert (client(sock).sandboxes() or {})["ml", "a"].uid == UID_A


def test_sandboxes_of_a_runtime_that_does_not_answer_are_none(
    server: CriTestServer, sock: str
) -> None:
    server.set_unavailable()
    requests = Requests()
    c = client(sock, on_request=requests)
    assert c.sandboxes() is None and c.pod_uids() is None
    assert requests.oks == [False]  # the second was not sent: backing off


@pytest.mark.parametrize(
    "namespace, pod, uid, labels, annotations",
    [
        ("n" * 64, "p", UID_A, {}, {}),
        ("n", "p" * 254, UID_A, {}, {}),
        ("n", "p", "u" * 37, {}, {}),
        ("n", "p", UID_A, {"k" * 318: "v"}, {}),
        ("n", "p", UID_A, {}, {"big": "v" * (256 << 10)}),
    ],
    ids=["namespace", "pod", "uid", "label-key", "annotations-total"],
)
def test_a_sandbox_past_kubernetes_limits_is_skipped_with_one_warning(
    server: CriTestServer, sock: str, namespace, pod, uid, labels, annotations, caplog
) -> None:
    """A runtime's maps have no bound of their own: one past Kubernetes' limits (names 63 and
    253, a uid 36, keys 317, a pod's annotations 256 KiB) leaves its pod unnamed, the rest of
    the list kept, and is told once, not at every list."""
    server.add_sandbox(uid, namespace, pod, labels, annotations)
    server.add_sandbox(UID_B, "ml", "b")
    c = client(sock)
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            assert set(c.sandboxes() or {}) == {("ml", "b"), ("ml", "trainer-0")}
    [line] = [r.getMessage() for r in caplog.records if "CRI sandbox" in r.getMessage()]
    assert "past Kubernetes' limits" in line and "left unnamed" in line


def test_a_sandbox_at_kubernetes_limits_is_kept(server: CriTestServer, sock: str) -> None:
    key = "p" * 253 + "/" + "k" * 63
    server.add_sandbox("u" * 36, "n" * 63, "p" * 253, {key: "v" * 63})
    found = client(sock).sandboxes() or {}
    assert found["n" * 63, "p" * 253].labels[key] == "v" * 63
