"""Which head this agent trusts: the CA pinned by its join token, kept next to its credential.

On first contact the agent fetches the head's CA over an unverified connection and compares its
fingerprint with the join token's pin before anything secret is sent; a mismatch stops the agent
(wrong server, or someone in between). A matching CA is saved, and every later connection, the join
included, verifies the head's certificate against it and nothing else.
"""

from __future__ import annotations

import logging
import os
import ssl
from pathlib import Path

import httpx

from gpufleet.core import tls
from gpufleet.core.errors import ConfigError, Unavailable

log = logging.getLogger(__name__)
CA_FILE = "head-ca.pem"


async def fetch_ca(server: str) -> str:
    """The CA the head at `server` presents. Unverified on purpose: the caller checks the pin.

    Raises Unavailable if the head cannot be reached, UntrustedServer if it sends no certificate.
    """
    async with httpx.AsyncClient(verify=False, timeout=httpx.Timeout(10.0)) as http:  # noqa: S501
        try:
            response = await http.get(server.rstrip("/") + "/ca.pem")
        except httpx.HTTPError as exc:
            raise Unavailable(f"cannot reach the head node at {server}: {exc!r}") from None
    if response.status_code != 200:
        raise tls.UntrustedServer(f"the head at {server} offers no CA certificate (HTTP {response.status_code})")
    return response.text


def _save(path: Path, pem: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(pem)
    tmp.replace(path)


async def head_context(
    server: str, pin: str | None, state_dir: Path, ca_file: Path | None, insecure_http: bool
) -> ssl.SSLContext | None:
    """The TLS context to reach the head with (None for plain HTTP).

    Trust, in order: the CA the join token pins (fetched, checked, saved); the CA saved at an
    earlier join; `ca_file`; the system's CAs. Raises UntrustedServer when the head's CA does not
    match the pin, ConfigError for plain HTTP off loopback or a pin with an http:// URL.
    """
    tls.check_plain_http(server, insecure_http)
    if server.startswith("http://"):
        if pin is not None:
            raise ConfigError(f"the join token pins the head's CA, but {server} is plain HTTP: use its https:// URL")
        return None
    saved = state_dir / CA_FILE
    saved_pem = saved.read_text() if saved.exists() else None
    if pin is None:
        if saved_pem is not None:
            return tls.client_context(ca_pem=saved_pem)
        return tls.client_context(ca_file=ca_file)
    if saved_pem is not None and tls.fingerprint(saved_pem) == pin:
        return tls.client_context(ca_pem=saved_pem)
    pem = await fetch_ca(server)
    try:
        presented = tls.fingerprint(pem)
    except ConfigError:
        raise tls.UntrustedServer(f"the head at {server} sent something that is not a CA certificate") from None
    if presented != pin:
        raise tls.UntrustedServer(
            f"refusing to join {server}: its CA fingerprint is {presented}, but the join token pins {pin}. "
            "Either this is not your head node or someone is in between; check the URL and the join token "
            "(`gpufleet server init` on the head prints the right fingerprint)"
        )
    _save(saved, pem)
    log.info("pinned the head's CA %s", pin)
    return tls.client_context(ca_pem=pem)
