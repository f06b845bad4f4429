"""kubenpu.cli.rollout, the uninstall hook's wait: against a local HTTP server that answers the one
path the API server serves a DaemonSet at (the API server itself cannot run here), with the
status fields the DaemonSet controller writes, in the order it writes them."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from kubenpu.cli import rollout

PATH = "/apis/apps/v1/namespaces/kubenpu/daemonsets/kubenpu-uninstall"


def daemonset(generation: int, **status: int) -> dict:
    return {"kind": "DaemonSet", "metadata": {"generation": generation}, "status": status}


# What the controller shows after the hook creates the DaemonSet on a 2-node cluster: not yet
# observed, then scheduled with no pod ready, one ready, both ready.
ROLLING = [
    daemonset(1),
    daemonset(1, observedGeneration=1, desiredNumberScheduled=2, updatedNumberScheduled=2),
    daemonset(
        1, observedGeneration=1, desiredNumberScheduled=2, numberReady=1, updatedNumberScheduled=2
    ),
    daemonset(
        1, observedGeneration=1, desiredNumberScheduled=2, numberReady=2, updatedNumberScheduled=2
    ),
]


@pytest.fixture
def api() -> Iterator[tuple[str, list]]:
    """A server whose answers are popped from the list it yields (the last one repeats); a
    string answer is sent as that HTTP status with no body."""
    answers: list = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            answer = answers.pop(0) if len(answers) > 1 else answers[0]
            if self.path != PATH:
                answer = "404"
            body = b"" if isinstance(answer, str) else json.dumps(answer).encode()
            self.send_response(int(answer) if isinstance(answer, str) else 200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", answers
    server.shutdown()
    server.server_close()


def run(url: str, *extra: str) -> int:
    return rollout.main(["kubenpu", "kubenpu-uninstall", "--api", url, *extra])


def test_waits_until_every_scheduled_node_is_ready(api, capsys, monkeypatch):
    url, answers = api
    answers.extend(["503", *ROLLING])  # an API server that is restarting is asked again
    monkeypatch.setattr(rollout, "POLL_SECONDS", 0.0)
    assert run(url) == 0
    assert answers == ROLLING[-1:], "it stopped before the last status"
    assert "daemonset kubenpu/kubenpu-uninstall: every node done" in capsys.readouterr().out


def test_a_node_that_never_runs_it_fails_with_the_counts(api, capsys):
    url, answers = api
    answers.append(ROLLING[2])
    assert run(url, "--timeout", "0") == 1
    out = capsys.readouterr().out
    assert out == (
        "kubenpu.cli.rollout: daemonset kubenpu/kubenpu-uninstall not done after 0 s: "
        "1 of 2 nodes done\n"
    )


def test_an_unreachable_or_missing_daemonset_is_reported(api, capsys):
    url, answers = api
    answers.append("404")
    assert run(url, "--timeout", "0") == 1
    assert "cannot read the DaemonSet: HTTP Error 404" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("status", "generation", "why"),
    [
        ({}, 1, "the controller has not seen the DaemonSet yet"),
        ({"observedGeneration": 1}, 2, "the controller has not seen the DaemonSet yet"),
        ({"observedGeneration": 1, "desiredNumberScheduled": 0}, 1, ""),  # no node selected
        # ready, but not of the current template
        ({"observedGeneration": 2, "desiredNumberScheduled": 3, "numberReady": 3}, 2, "0 of 3"),
    ],
)
def test_pending(status, generation, why):
    assert rollout.pending(status, generation).startswith(why)
    assert (rollout.pending(status, generation) == "") == (why == "")


def test_the_in_cluster_address_is_the_kubelets_variables():
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    assert rollout.api_server(env) == "https://10.0.0.1:443"
    env["KUBERNETES_SERVICE_HOST"] = "fd00::1"
    assert rollout.api_server(env) == "https://[fd00::1]:443"
