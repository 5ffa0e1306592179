"""The doctor's TLS checks, plain functions like the others in `checks`: the CA a node pinned against the
one the head serves, and the head's own certificate, key and CA (valid, not expiring soon, matching).
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from gpufleet.core import tls
from gpufleet.core.errors import ConfigError
from gpufleet.deploy.units import SERVER_UNIT
from gpufleet.doctor.checks import CERT_WARN_DAYS, Finding, Status, worst


def check_node_trust(
    server: str,
    insecure_http: bool,
    pinned_pem: str | None,
    pinned_path: Path,
    served_pem: str | None,
    verify_error: str | None,
    trust: str,
) -> Finding:
    """The CA this node pinned at its join (`pinned_pem`, from `pinned_path`) against the CA the head
    serves now (`served_pem`, from /ca.pem). Without a pin, whether the head's certificate verifies
    against what the agent would trust instead (`trust`: the ca_file or the system's CAs), as
    `verify_error` says."""
    if server.startswith("http://"):
        try:
            tls.check_plain_http(server, insecure_http)
        except ConfigError as exc:
            return Finding("tls", Status.fail, str(exc).split(". ")[0], "use the head's https:// URL")
        return Finding("tls", Status.ok, f"plain HTTP to {server} (loopback or insecure_http): no CA to compare")
    if pinned_pem is None:
        if verify_error is not None:
            return Finding(
                "tls",
                Status.fail,
                f"no CA pinned in {pinned_path.parent}, and the head's certificate does not verify against "
                f"{trust}: {verify_error}",
                "join with a join token that pins the head's CA (`gpufleet token create` on the head), "
                "or set ca_file to the head's CA",
            )
        return Finding("tls", Status.ok, f"no CA pinned; the head's certificate verifies against {trust}")
    return _compare_pin(pinned_pem, pinned_path, served_pem)


def _compare_pin(pinned_pem: str, pinned_path: Path, served_pem: str | None) -> Finding:
    rejoin = (
        f"if the head's CA was made anew on purpose, delete {pinned_path} and "
        f"{pinned_path.with_name('credential.json')} and join again with a new join token (`gpufleet token create` "
        "on the head); otherwise this is not your head, or someone is in between: check the server URL"
    )
    pinned = _fingerprint_or_none(pinned_pem)
    served = _fingerprint_or_none(served_pem) if served_pem is not None else None
    if pinned is None:
        return Finding("tls", Status.fail, f"{pinned_path} is not a PEM certificate", rejoin)
    if served is None:
        what = "no CA" if served_pem is None else "a /ca.pem that is not a PEM certificate"
        return Finding("tls", Status.fail, f"this node pinned CA {pinned}, but the head serves {what}", rejoin)
    if served != pinned:
        return Finding(
            "tls", Status.fail, f"the head serves CA {served}, but this node pinned {pinned} ({pinned_path})", rejoin
        )
    return Finding("tls", Status.ok, f"the head serves the CA this node pinned ({pinned})")


Problem = tuple[Status, str, str]  # how bad, what, the fix


def check_head_tls(
    files: tuple[Path, Path, Path | None] | None,
    own: bool,
    now: dt.datetime,
    served_ca_pem: str | None,
    error: str | None = None,
) -> Finding:
    """The head's server certificate, key and CA (`Settings.effective_tls()`; `error` when that
    refused), at `now`: readable, valid and not expiring within CERT_WARN_DAYS, the key the
    certificate's, the certificate signed by the CA, and the CA the running head serves (from
    /ca.pem, None where not asked) the one on disk. `own`: made by `gpufleet server init`."""
    if error is not None:
        return Finding("tls", Status.fail, error, "set both tls_cert and tls_key, or neither")
    if files is None:
        return Finding(
            "tls",
            Status.warn,
            "the head serves plain HTTP: agents and the CLI send their secrets unencrypted",
            f"`gpufleet server init`, then `systemctl restart {SERVER_UNIT}`",
        )
    from cryptography import x509

    cert_path, key_path, ca_path = files
    renew = (
        f"`gpufleet server init --reissue`, then `systemctl restart {SERVER_UNIT}`"
        if own
        else f"renew {cert_path} with your CA, then `systemctl restart {SERVER_UNIT}`"
    )
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    except OSError as exc:
        return Finding("tls", Status.fail, f"cannot read {cert_path}: {exc.strerror}", _read_fix(exc))
    except ValueError:
        return Finding("tls", Status.fail, f"{cert_path} is not a PEM certificate", renew)
    problems = _validity(cert, now, renew) + _key(cert, cert_path, key_path, renew)
    ca_said = ""
    if ca_path is not None:
        ca_problems, ca_fingerprint = _issuer(cert, cert_path, ca_path, served_ca_pem, renew)
        problems += ca_problems
        ca_said = f", signed by the CA {ca_fingerprint}" if ca_fingerprint else ""
    if problems:
        return Finding(
            "tls",
            worst(p[0] for p in problems),
            "; ".join(p[1] for p in problems),
            "; ".join(dict.fromkeys(p[2] for p in problems)),
        )
    until = cert.not_valid_after_utc
    days = int((until - now).total_seconds() // 86400)
    return Finding("tls", Status.ok, f"server certificate valid until {until:%Y-%m-%d} ({days} days){ca_said}")


def _validity(cert: Any, now: dt.datetime, renew: str) -> list[Problem]:
    until: dt.datetime = cert.not_valid_after_utc
    since: dt.datetime = cert.not_valid_before_utc
    days = (until - now).total_seconds() / 86400
    if since > now:
        return [(Status.fail, f"the certificate is valid only from {since:%Y-%m-%d %H:%M}Z", renew)]
    if until <= now:
        return [(Status.fail, f"the certificate expired on {until:%Y-%m-%d}", renew)]
    if days < CERT_WARN_DAYS:
        return [(Status.warn, f"the certificate expires on {until:%Y-%m-%d}, in {int(days)} days", renew)]
    return []


def _key(cert: Any, cert_path: Path, key_path: Path, renew: str) -> list[Problem]:
    from cryptography.hazmat.primitives import serialization

    der, spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    try:
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except OSError as exc:
        return [(Status.fail, f"cannot read {key_path}: {exc.strerror}", _read_fix(exc))]
    except (ValueError, TypeError):
        return [(Status.fail, f"{key_path} is not an unencrypted PEM private key", renew)]
    if key.public_key().public_bytes(der, spki) != cert.public_key().public_bytes(der, spki):
        return [(Status.fail, f"{key_path} is not the key of {cert_path}", renew)]
    return []


def _issuer(
    cert: Any, cert_path: Path, ca_path: Path, served_ca_pem: str | None, renew: str
) -> tuple[list[Problem], str | None]:
    """Whether the CA at `ca_path` signed `cert`, and whether the running head serves that CA; and the
    CA's fingerprint."""
    from cryptography import x509
    from cryptography.exceptions import InvalidSignature

    try:
        ca_pem = ca_path.read_text()
        ca = x509.load_pem_x509_certificate(ca_pem.encode())
    except OSError as exc:
        return [(Status.fail, f"cannot read {ca_path}: {exc.strerror}", _read_fix(exc))], None
    except ValueError:
        return [(Status.fail, f"{ca_path} is not a PEM certificate", renew)], None
    problems: list[Problem] = []
    ours = tls.fingerprint(ca_pem)
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        problems.append((Status.fail, f"{cert_path} is not signed by the CA in {ca_path}", renew))
    if served_ca_pem is not None and _fingerprint_or_none(served_ca_pem) != ours:
        problems.append(
            (
                Status.fail,
                f"the running head serves CA {_fingerprint_or_none(served_ca_pem)}, but {ca_path} is {ours}",
                f"`systemctl restart {SERVER_UNIT}` (the head reads its certificates on start)",
            )
        )
    return problems, ours


def _fingerprint_or_none(pem: str) -> str | None:
    try:
        return tls.fingerprint(pem)
    except ConfigError:
        return None


def _read_fix(exc: OSError) -> str:
    if isinstance(exc, PermissionError):
        return "run `gpufleet doctor` as root or as the user the head runs as"
    return "`gpufleet server init` makes the CA and the server certificate"
