"""Wait until a DaemonSet has a ready pod on every node it schedules, then exit 0.

The chart's uninstall hook (deploy/helm/kubenpu/templates/uninstall.yaml) runs this in a Job, so
that Helm, which waits for a hook Job but not for a hook DaemonSet, waits until every node ran
`kubenpu-agent --uninstall`. Standard library only (the agent image's Python, no kubectl): one
GET of the DaemonSet through the API server, with the pod's service account, every few seconds;
a redirect is not followed (it would carry the token), an answer that is no DaemonSet is asked
again.

    python3 -m kubenpu.cli.rollout NAMESPACE NAME [--timeout SECONDS]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import ssl
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubenpu.files import read_at_most

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
POLL_SECONDS = 2.0
MAX_ANSWER_BYTES = 4 << 20  # a DaemonSet is a few KB; the API server's own limit is 3 MiB


def api_server(env: dict[str, str]) -> str:
    """The in-cluster API server's URL, from the variables the kubelet sets in every pod."""
    host, port = env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"]
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


def _object(value: object, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{what} is {type(value).__name__}, not an object")
    return value


def _count(fields: dict[str, Any], key: str) -> int:
    """A count the API server writes, absent as 0; ValueError for anything but an integer."""
    value = fields.get(key, 0)
    if type(value) is not int:  # bool is an int, and "1" < 1 would be a TypeError
        raise ValueError(f"{key} is {value!r}, not a count")
    return value


def pending(status: dict[str, Any], generation: int) -> str:
    """Why the DaemonSet is not done yet, or "" when every scheduled pod is ready; ValueError
    for a status that is not a DaemonSet's."""
    if _count(status, "observedGeneration") < generation:
        return "the controller has not seen the DaemonSet yet"
    want = _count(status, "desiredNumberScheduled")
    ready = _count(status, "numberReady")
    updated = _count(status, "updatedNumberScheduled")
    done = min(ready, updated)  # a pod of an older template does not count
    if done < want:
        return f"{done} of {want} nodes done"
    return ""


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is an HTTPError, not followed: urllib would send the service account's
    token along to wherever it points. The API server does not redirect this GET."""

    def redirect_request(self, *args: Any) -> None:
        return None


def fetch_daemonset(base: str, namespace: str, name: str) -> Callable[[], object]:
    """A function that GETs the DaemonSet (at most MAX_ANSWER_BYTES of it, as parsed JSON), with
    the service account's token and CA when the pod has them."""
    url = f"{base}/apis/apps/v1/namespaces/{namespace}/daemonsets/{name}"
    headers = {"Accept": "application/json"}
    token = SERVICE_ACCOUNT / "token"
    context = None
    if token.exists():
        headers["Authorization"] = f"Bearer {token.read_text().strip()}"
        context = ssl.create_default_context(cafile=str(SERVICE_ACCOUNT / "ca.crt"))
    opener = urllib.request.build_opener(_NoRedirect, urllib.request.HTTPSHandler(context=context))

    def get() -> object:
        request = urllib.request.Request(url, headers=headers)
        with opener.open(request, timeout=10) as response:
            return json.loads(read_at_most(response.read, MAX_ANSWER_BYTES, "the answer"))

    return get


def _reason(answer: object) -> str:
    """pending() of a DaemonSet as the API server sends it; ValueError for anything else."""
    ds = _object(answer, "the answer")
    metadata = _object(ds.get("metadata"), "metadata")
    return pending(_object(ds.get("status", {}), "status"), _count(metadata, "generation"))


def wait(get: Callable[[], object], timeout: float) -> str:
    """Poll until the DaemonSet is done; "" then, else the last reason it was not (a failed GET
    or an answer that is no DaemonSet is retried: the API server may be restarting)."""
    deadline = time.monotonic() + timeout
    reason = "no answer yet"
    while True:
        try:
            reason = _reason(get())
        except (OSError, ValueError, RecursionError) as err:  # URLError is an OSError, bad JSON
            # a ValueError, JSON nested past the stack a RecursionError
            reason = f"cannot read the DaemonSet: {err}"
        if not reason or time.monotonic() >= deadline:
            return reason
        time.sleep(POLL_SECONDS)


def _seconds(text: str) -> float:
    """--timeout: a finite number of seconds, 0 or more (nan and inf would never end)."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not 0 <= seconds < math.inf:
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number of seconds >= 0")
    return seconds


def main(argv: list[str] | None = None, env: dict[str, str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m kubenpu.cli.rollout", description=__doc__)
    parser.add_argument("namespace")
    parser.add_argument("name")
    parser.add_argument("--timeout", type=_seconds, default=300.0, help="seconds (default 300)")
    parser.add_argument("--api", help="API server URL (default: the in-cluster one)")
    args = parser.parse_args(argv)
    base = args.api or api_server(dict(os.environ) if env is None else env)
    reason = wait(fetch_daemonset(base, args.namespace, args.name), args.timeout)
    where = f"daemonset {args.namespace}/{args.name}"
    if reason:
        print(f"kubenpu.cli.rollout: {where} not done after {args.timeout:g} s: {reason}")
        return 1
    print(f"kubenpu.cli.rollout: {where}: every node done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
