"""The guest scenarios' shared helpers (tests/vm/guestlib.py) where a busy host matters: the
slowness their deadlines scale by, and a scrape that survives one failed request."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest
from vm.guestlib import scrape, slowness

TEXT = b"# TYPE kubenpu_up gauge\nkubenpu_up 1\n"


@pytest.mark.parametrize(
    ("cmdline", "factor"),
    [
        ("console=ttyS0 kubenpu.run=/src/x.sh kubenpu.slow=4.5 quiet", 4.5),
        ("kubenpu.slow=0.3", 1.0),  # an idle host: never shorter than the deadlines as written
        ("kubenpu.slow=fast", 1.0),
        ("kubenpu.slow=nan", 1.0),
        ("console=ttyS0", 1.0),
    ],
)
def test_slowness_from_the_kernel_command_line(cmdline: str, factor: float) -> None:
    assert slowness(cmdline) == factor


class _Flaky(http.server.BaseHTTPRequestHandler):
    """Drops the first `fail` connections without a reply, then serves TEXT."""

    fail = 0
    served = 0

    def do_GET(self) -> None:
        type(self).served += 1
        if type(self).served <= type(self).fail:
            self.close_connection = True
            return  # no status line: the client sees the connection closed
        self.send_response(200)
        self.send_header("Content-Length", str(len(TEXT)))
        self.end_headers()
        self.wfile.write(TEXT)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def flaky() -> Iterator[tuple[type[_Flaky], str]]:
    handler = type("Handler", (_Flaky,), {})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield handler, f"http://127.0.0.1:{server.server_address[1]}/metrics"
    server.shutdown()
    server.server_close()


def test_one_failed_scrape_is_retried(flaky, capsys) -> None:
    """The node scenario's boots died on one /metrics request over its 5 s: a failed request is
    retried (and said), the next one's text returned."""
    handler, url = flaky
    handler.fail = 1
    assert scrape(url=url, patience=60)["kubenpu_up"][0]["value"] == 1
    assert handler.served == 2
    assert "a scrape failed" in capsys.readouterr().err


def test_a_scrape_without_patience_fails_at_once(flaky) -> None:
    """restart_guest times the first answer itself: no retry hides the failure from it."""
    handler, url = flaky
    handler.fail = 1
    with pytest.raises(OSError):
        scrape(url=url, patience=0)
    assert handler.served == 1
