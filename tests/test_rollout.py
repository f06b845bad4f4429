"""kubenpu.cli.rollout, the uninstall hook's wait: against a local HTTP server that answers the one
path the API server serves a DaemonSet at (the API server itself cannot run here), with the
status fields the DaemonSet controller writes, in the order it writes them."""

from __future__ import annotations

import contextlib
import datetime
import json
import re
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import NamedTuple

import certifi
import pytest
from helpers import certificate, eventually

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


class Redirect(NamedTuple):
    location: str


class Answers(list):
    """The answers the fake API server pops, and the headers of each GET it was sent."""

    def __init__(self) -> None:
        super().__init__()
        self.headers: list[dict[str, str]] = []


@contextlib.contextmanager
def serving(
    handler: type[BaseHTTPRequestHandler], host: str = "127.0.0.1", tls: Path | None = None
) -> Iterator[int]:
    """handler served on a free port of host (yielded), in TLS with the certificate (and its
    key beside it, .key) when tls is given."""
    server = ThreadingHTTPServer((host, 0), handler)
    if tls is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(tls, tls.with_suffix(".key"))
        server.socket = context.wrap_socket(server.socket, server_side=True)
    # shutdown() waits for the loop's next poll: 0.5 s a test by default
    threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def api_server(answers: Answers) -> type[BaseHTTPRequestHandler]:
    """A handler whose answers are popped from answers (the last one repeats); a string answer
    is sent as that HTTP status with no body, bytes as the body itself, a Redirect as a 302 to
    its location. As the API server, it answers 406 to an Accept that JSON does not meet (none
    is JSON)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            answer = answers.pop(0) if len(answers) > 1 else answers[0]
            answers.headers.append(dict(self.headers))
            if self.path != PATH:
                answer = "404"
            if self.headers.get("Accept", "*/*").lower() not in ("application/json", "*/*"):
                answer = "406"
            if isinstance(answer, Redirect):
                self.send_response(302)
                self.send_header("Location", answer.location)
                answer = "302"
            else:
                self.send_response(int(answer) if isinstance(answer, str) else 200)
            if isinstance(answer, str):
                body = b""
            else:
                body = answer if isinstance(answer, bytes) else json.dumps(answer).encode()
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    return Handler


@pytest.fixture
def api() -> Iterator[tuple[str, Answers]]:
    """The fake API server in plain HTTP: its URL and the answers it pops (api_server)."""
    answers = Answers()
    with serving(api_server(answers)) as port:
        yield f"http://127.0.0.1:{port}", answers


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


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        ([], "the answer is list, not an object"),
        (b"x", "Expecting value"),
        (b"null", "the answer is NoneType, not an object"),
        ({"status": {}}, "metadata is NoneType, not an object"),
        ({"metadata": [], "status": {}}, "metadata is list, not an object"),
        ({"metadata": {"generation": "1"}}, "generation is '1', not a count"),
        ({"metadata": {}, "status": "ok"}, "status is str, not an object"),
        ({"metadata": {}, "status": {"observedGeneration": True}}, "observedGeneration is True"),
        ({"metadata": {}, "status": {"numberReady": 2.0}}, "numberReady is 2.0, not a count"),
        (b"[" * 100_000, "maximum recursion depth"),
        (b" " * (rollout.MAX_ANSWER_BYTES + 1), "the answer is larger than 4194304 bytes"),
    ],
)
def test_an_answer_that_is_no_daemonset_is_asked_again(api, capsys, monkeypatch, answer, why):
    """Valid JSON of another shape (a proxy's page, an API server mid-upgrade) made a traceback."""
    url, answers = api
    answers.extend([answer, ROLLING[-1]])
    monkeypatch.setattr(rollout, "POLL_SECONDS", 0.0)
    assert run(url, "--timeout", "0") == 1
    out = capsys.readouterr().out
    assert "cannot read the DaemonSet: " in out and why in out, out
    assert run(url) == 0  # asked again: the next answer is a DaemonSet, done


@pytest.mark.parametrize("timeout", ["nan", "inf", "-inf", "-1", "1e309", "x"])
def test_a_timeout_that_would_never_end_is_refused(timeout, capsys):
    with pytest.raises(SystemExit) as exit:
        run("http://127.0.0.1:1", f"--timeout={timeout}")
    assert exit.value.code == 2
    assert "is not a finite number of seconds >= 0" in capsys.readouterr().err


@pytest.fixture
def service_account(tmp_path, monkeypatch) -> Path:
    """The pod's service account directory, its CA the public ones (no cluster's)."""
    (tmp_path / "token").write_text("the-token\n")
    (tmp_path / "ca.crt").write_bytes(Path(certifi.where()).read_bytes())
    monkeypatch.setattr(rollout, "SERVICE_ACCOUNT", tmp_path)
    return tmp_path


def test_a_redirect_is_not_followed_with_the_token(api, service_account, capsys):
    """The token must reach the API server only, not another host a redirect names."""
    seen: list[str | None] = []

    class Elsewhere(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get("Authorization"))
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    url, answers = api
    with serving(Elsewhere, "127.0.0.2") as port:
        answers.append(Redirect(f"http://127.0.0.2:{port}{PATH}"))
        assert run(url, "--timeout", "0") == 1
    assert seen == []
    assert "cannot read the DaemonSet: HTTP Error 302" in capsys.readouterr().out


def test_the_service_accounts_token_is_sent_and_json_asked_for(api, service_account):
    url, answers = api
    answers.append(ROLLING[-1])
    assert run(url) == 0
    [headers] = answers.headers
    assert headers["Authorization"] == "Bearer the-token"  # read, stripped of its newline


def test_without_api_the_in_cluster_address_is_asked(api, capsys, monkeypatch):
    """The kubelet's variables, passed or from the environment: the fake speaks plain HTTP,
    so the TLS handshake with it fails, which shows it was asked."""
    url, answers = api
    answers.append(ROLLING[-1])
    port = url.rsplit(":", 1)[1]
    env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": port}
    argv = ["kubenpu", "kubenpu-uninstall", "--timeout", "0"]
    assert rollout.main(argv, env) == 1
    monkeypatch.setattr(rollout.os, "environ", env)
    assert rollout.main(argv) == 1
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and all("cannot read the DaemonSet: <urlopen error [SSL" in o for o in out)


def test_help_names_the_module_and_each_option(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")  # each option's help on its line, whatever the terminal
    with pytest.raises(SystemExit):
        rollout.main(["--help"])
    out = capsys.readouterr().out
    assert out.startswith("usage: python3 -m kubenpu.cli.rollout [-h]")
    assert "Wait until a DaemonSet has a ready pod on every node" in out
    # each option's line as a whole: its text, nothing else
    assert re.search(r"^ +--timeout TIMEOUT +seconds \(default 300\)$", out, re.M), out
    assert re.search(r"^ +--api API +API server URL \(default: the in-cluster one\)$", out, re.M)


@pytest.mark.parametrize("signed_by_the_cluster", [True, False])
def test_the_api_server_is_verified_with_the_service_accounts_ca(
    tmp_path, service_account, capsys, signed_by_the_cluster
):
    """The API server's certificate is signed by the cluster's own CA, which only the service
    account's ca.crt holds (no system store does): the GET verifies the server with that file,
    and refuses a server it did not sign."""
    now = datetime.datetime.now(datetime.UTC)
    day = datetime.timedelta(days=1)
    cert, _ = certificate(tmp_path, "apiserver", now - day, now + day)
    if signed_by_the_cluster:
        (service_account / "ca.crt").write_bytes(cert.read_bytes())
    answers = Answers()
    answers.append(ROLLING[-1])
    with serving(api_server(answers), tls=cert) as port:
        code = run(f"https://localhost:{port}", "--timeout", "0")
    out = capsys.readouterr().out
    if signed_by_the_cluster:
        assert code == 0, out
        assert answers.headers[0]["Authorization"] == "Bearer the-token"
    else:
        assert code == 1
        assert "cannot read the DaemonSet: <urlopen error [SSL: CERTIFICATE_VERIFY_FAILED]" in out
        assert answers.headers == []


def test_a_get_that_is_never_answered_is_given_up_on():
    """Each GET has a timeout of its own: a connection the server accepts and never answers (an
    API server stuck) would otherwise hold the hook, and helm, past --timeout for ever."""
    errors: list[OSError] = []

    def call(get: Callable[[], object]) -> None:
        try:
            get()
        except OSError as err:  # wait() reports it and asks again
            errors.append(err)

    with socket.create_server(("127.0.0.1", 0)) as listener:  # the kernel accepts; nobody reads
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        get = rollout.fetch_daemonset(url, "kubenpu", "kubenpu-uninstall")
        threading.Thread(target=call, args=(get,), daemon=True).start()
        eventually(lambda: errors or None, "the unanswered GET given up on", bound=120)
    assert [type(e) for e in errors] == [TimeoutError]
