"""Validity of the configured TLS certificates: checked at --check-config and at start.

An expired or not-yet-valid certificate still starts the agent (a scraper or collector may not
check it, and a renewal may be on its way), but it is a warning naming the setting and the
date, and `kubenpu_tls_certificate_expiry_timestamp_seconds{setting}` carries the earliest
notAfter of each file so an alert can fire before it lapses. X.509 is parsed by the
`cryptography` package.
"""

from __future__ import annotations

import datetime
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kubenpu.export.errors import ExportError
from kubenpu.export.files import read_regular

if TYPE_CHECKING:
    from kubenpu.config import Config

log = logging.getLogger(__name__)

_BEGIN = b"-----BEGIN CERTIFICATE-----"
_DATE = "%Y-%m-%d %H:%M"


@dataclass(frozen=True)
class Validity:
    setting: str  # the config key, e.g. export.prometheus.tls.cert_file
    not_after: float  # the earliest notAfter of the file's certificates, Unix seconds
    problems: tuple[str, ...]  # one line per expired or not-yet-valid certificate


def settings(cfg: Config) -> dict[str, str]:
    """The configured certificate files by setting (the key file holds no certificate)."""
    otlp = cfg.export.otlp
    files = {
        "export.prometheus.tls.cert_file": cfg.export.prometheus.tls.cert_file,
        "export.otlp.certificate": otlp.certificate if otlp.enabled else "",
        "export.otlp.client_certificate": otlp.client_certificate if otlp.enabled else "",
    }
    return {k: v for k, v in files.items() if v}


def validity(setting: str, pem: bytes, now: datetime.datetime) -> Validity | None:
    """The certificates of one PEM file against `now` (UTC); None when it holds none that
    parse (the TLS library reports that file when it loads it)."""
    from cryptography import x509  # the agent extras only: kubenpuctl never checks TLS

    try:
        certs = x509.load_pem_x509_certificates(pem) if _BEGIN in pem else []
    except ValueError:
        return None
    if not certs:
        return None
    problems = []
    for cert in certs:
        subject = cert.subject.rfc4514_string()[:120]
        after, before = cert.not_valid_after_utc, cert.not_valid_before_utc
        if now > after:
            problems.append(f"{setting}: certificate {subject!r} expired on {after:{_DATE}} UTC")
        elif now < before:
            problems.append(
                f"{setting}: certificate {subject!r} is not valid before {before:{_DATE}} UTC"
            )
    not_after = min(c.not_valid_after_utc for c in certs).timestamp()
    return Validity(setting, not_after, tuple(problems))


def check(cfg: Config, now: datetime.datetime | None = None) -> list[Validity]:
    """Every configured certificate file's validity. A file that cannot be read is left to
    the loader, which makes it the start's error."""
    now = now or datetime.datetime.now(datetime.UTC)
    found = []
    for setting, path in settings(cfg).items():
        try:
            pem = read_regular(path, setting)
        except ExportError:
            continue
        if (v := validity(setting, pem, now)) is not None:
            found.append(v)
    return found


def problems(cfg: Config) -> list[str]:
    """The warnings --check-config prints."""
    return [p for v in check(cfg) for p in v.problems]


def warn(found: list[Validity]) -> None:
    for v in found:
        for problem in v.problems:
            log.warning("%s; TLS peers that check it will refuse it", problem)
