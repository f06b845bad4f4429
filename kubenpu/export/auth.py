"""The metrics server's auth (export.prometheus.auth): basic and/or bearer, secrets from files."""

from __future__ import annotations

import base64
import hmac

from kubenpu.config import AuthConfig
from kubenpu.export.files import read_secret


class Auth:
    """Basic and/or bearer auth in the spirit of the Prometheus exporter-toolkit's web config:
    secrets come from files, comparisons are constant-time, either configured scheme admits."""

    def __init__(self, cfg: AuthConfig) -> None:
        key = "export.prometheus.auth"
        self._basic = None
        if cfg.username:
            password = read_secret(cfg.password_file, f"{key}.password_file")
            self._basic = base64.b64encode(cfg.username.encode() + b":" + password)
        self._bearer = (
            read_secret(cfg.bearer_token_file, f"{key}.bearer_token_file")
            if cfg.bearer_token_file
            else None
        )

    def required(self) -> bool:
        return bool(self._basic or self._bearer)

    def allows(self, header: str) -> bool:
        scheme, _, credentials = header.strip().partition(" ")
        given = credentials.strip().encode()
        expected = {"basic": self._basic, "bearer": self._bearer}.get(scheme.lower())
        return expected is not None and hmac.compare_digest(given, expected)

    def challenge(self) -> tuple[str, str]:
        return ("WWW-Authenticate", 'Basic realm="kubenpu"' if self._basic else "Bearer")
