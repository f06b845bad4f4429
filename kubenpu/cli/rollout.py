"""Wait until a DaemonSet has a ready pod on every node it schedules, then exit 0.

The chart's uninstall hook (deploy/helm/kubenpu/templates/uninstall.yaml) runs this in a Job, so
that Helm, which waits for a hook Job but not for a hook DaemonSet, waits until every node ran
`kubenpu-agent --uninstall`. Standard library only (the agent image's Python, no kubectl): one
GET of the DaemonSet through the API server, with the pod's service account, every few seconds.

    python3 -m kubenpu.cli.rollout NAMESPACE NAME [--timeout SECONDS]
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
POLL_SECONDS = 2.0


def api_server(env: dict[str, str]) -> str:
    """The in-cluster API server's URL, from the variables the kubelet sets in every pod."""
    host, port = env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"]
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


def pending(status: dict[str, Any], generation: int) -> str:
    """Why the DaemonSet is not done yet, or "" when every scheduled pod is ready."""
    if status.get("observedGeneration", 0) < generation:
        return "the controller has not seen the DaemonSet yet"
    want = status.get("desiredNumberScheduled", 0)
    ready = status.get("numberReady", 0)
    updated = status.get("updatedNumberScheduled", 0)
    done = min(ready, updated)  # a pod of an older template does not count
    if done < want:
        return f"{done} of {want} nodes done"
    return ""


def fetch_daemonset(base: str, namespace: str, name: str) -> Callable[[], dict[str, Any]]:
    """A function that GETs the DaemonSet, with the service account's token and CA when the pod
    has them."""
    url = f"{base}/apis/apps/v1/namespaces/{namespace}/daemonsets/{name}"
    headers = {"Accept": "application/json"}
    token = SERVICE_ACCOUNT / "token"
    context = None
    if token.exists():
        headers["Authorization"] = f"Bearer {token.read_text().strip()}"
        context = ssl.create_default_context(cafile=str(SERVICE_ACCOUNT / "ca.crt"))

    def get() -> dict[str, Any]:
        request = urllib.request.Request(url, headers=headers)
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            return json.load(response)

    return get


def wait(get: Callable[[], dict[str, Any]], timeout: float) -> str:
    """Poll until the DaemonSet is done; "" then, else the last reason it was not (a failed GET
    is retried: the API server may be restarting)."""
    deadline = time.monotonic() + timeout
    reason = "no answer yet"
    while True:
        try:
            ds = get()
            reason = pending(ds.get("status", {}), ds["metadata"].get("generation", 0))
        except (OSError, ValueError, KeyError) as err:  # URLError is an OSError
            reason = f"cannot read the DaemonSet: {err}"
        if not reason or time.monotonic() >= deadline:
            return reason
        time.sleep(POLL_SECONDS)


def main(argv: list[str] | None = None, env: dict[str, str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m kubenpu.cli.rollout", description=__doc__)
    parser.add_argument("namespace")
    parser.add_argument("name")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds (default 300)")
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
