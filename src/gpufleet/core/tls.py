"""TLS trust, stdlib only (the agent and CLI use it): CA fingerprints, pinned join tokens, contexts.

A join token may carry the fingerprint of the head's CA, `gfj_...:sha256:<hex>`, the way `kubeadm
join` takes `--discovery-token-ca-cert-hash`: the agent fetches the CA from the head, checks it
against the pin before it sends anything secret, and from then on trusts only that CA. The
fingerprint is SHA-256 over the CA certificate's DER bytes, what `openssl x509 -fingerprint -sha256`
prints (without the colons), so an admin can check it by hand.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
import ssl
from pathlib import Path
from urllib.parse import urlsplit

from gpufleet.core.errors import ConfigError, GpufleetError

PIN_SEPARATOR = ":sha256:"
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class UntrustedServer(GpufleetError):
    """The server's certificate authority is not the one this side was told to trust."""

    exit_code = 8


def fingerprint(pem: str) -> str:
    """`sha256:<hex>` of the first certificate in `pem`. Raises ConfigError if it is not a PEM certificate."""
    try:
        der = ssl.PEM_cert_to_DER_cert(pem)
    except ValueError:
        raise ConfigError("not a PEM certificate") from None
    return "sha256:" + hashlib.sha256(der).hexdigest()


def pin_join_token(token: str, ca_fingerprint: str | None) -> str:
    """The join token as handed to admins: with the CA pin appended when the head serves TLS."""
    if ca_fingerprint is None:
        return token
    return token + PIN_SEPARATOR + ca_fingerprint.removeprefix("sha256:")


def split_join_token(text: str) -> tuple[str, str | None]:
    """The secret to present and the CA pin (`sha256:<hex>`), if the token carries one.

    Raises ConfigError for a pin that is not 64 hex digits, rather than silently not pinning.
    """
    secret, sep, pin = text.strip().partition(PIN_SEPARATOR)
    if not sep:
        return secret, None
    pin = pin.lower()
    if not _HEX64.match(pin):
        raise ConfigError("the join token's CA fingerprint is not sha256 followed by 64 hex digits")
    return secret, "sha256:" + pin


def is_loopback(url: str) -> bool:
    return is_loopback_host(urlsplit(url).hostname or "")


def is_loopback_host(host: str) -> bool:
    """`localhost` or a loopback address (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_plain_http(url: str, allow_insecure_http: bool) -> None:
    """Refuse to send credentials over plain HTTP except on loopback (the demo) or when told to.

    Raises ConfigError with what to do instead.
    """
    if url.startswith("http://") and not is_loopback(url) and not allow_insecure_http:
        raise ConfigError(
            f"{url} is plain HTTP: credentials would cross the network in clear text. Use https:// "
            "(run `gpufleet server init` on the head), or set insecure_http = true if a TLS proxy is in between"
        )


def client_context(ca_pem: str | None = None, ca_file: Path | None = None) -> ssl.SSLContext:
    """A verifying client context trusting `ca_pem` or `ca_file`, else the system's CAs."""
    try:
        if ca_pem is not None:
            return ssl.create_default_context(cadata=ca_pem)
        return ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(f"cannot load the CA certificate{f' {ca_file}' if ca_file else ''}: {exc}") from None
