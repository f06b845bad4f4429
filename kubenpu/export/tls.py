"""The metrics server's TLS context (export.prometheus.tls): TLS 1.2 or later, the configured
certificate chain and key, never a passphrase prompt. certs.py checks the certificates' dates."""

from __future__ import annotations

import ssl
from collections.abc import Callable

from kubenpu.config import TlsConfig
from kubenpu.export.errors import ExportError
from kubenpu.export.files import read_regular


def ssl_context(cfg: TlsConfig) -> ssl.SSLContext | None:
    if not cfg.enabled():
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    key = "export.prometheus.tls"
    for path, what in ((cfg.cert_file, "cert_file"), (cfg.key_file, "key_file")):
        read_regular(path, f"{key}.{what}")
    try:
        # A passphrase-protected key: a clear error, never OpenSSL's prompt on the terminal.
        ctx.load_cert_chain(cfg.cert_file, cfg.key_file, password=_no_passphrase(cfg.key_file))
    except (OSError, ssl.SSLError) as err:
        raise ExportError(
            f"cannot load export.prometheus.tls cert_file {cfg.cert_file} / key_file "
            f"{cfg.key_file}: {getattr(err, 'strerror', None) or err}"
        ) from None
    return ctx


def _no_passphrase(key_file: str) -> Callable[[], bytes]:
    def refuse() -> bytes:
        raise ExportError(
            f"export.prometheus.tls.key_file {key_file} is encrypted: give an unencrypted key "
            "(openssl pkey -in KEY -out PLAIN)"
        )

    return refuse
