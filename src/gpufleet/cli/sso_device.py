"""The CLI's side of single sign-on: the OAuth 2.0 device authorization grant (RFC 8628) against the provider.

httpx and the standard library only: the CLI installs without the server's dependencies. The ID token it
returns is what the CLI hands to the head, which checks it and answers with a gpufleet API token.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

DEVICE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"
DEFAULT_SCOPES = ("openid", "profile", "email", "groups")
SLOW_DOWN_S = 5  # RFC 8628 3.5: each slow_down adds 5 seconds to the interval

ShowCode = Callable[[str, str, str | None], None]  # (verification_uri, user_code, verification_uri_complete)


class DeviceLoginError(Exception):
    """The device sign-in did not end in tokens; the message says why, for the user."""


def _json(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _post(http: httpx.Client, url: str, data: dict[str, str], what: str) -> httpx.Response:
    try:
        return http.post(url, data=data, headers={"Accept": "application/json"})
    except httpx.HTTPError as exc:
        raise DeviceLoginError(f"cannot reach the sign-in provider ({what}): {exc}") from exc


def discover(http: httpx.Client, issuer: str) -> dict[str, Any]:
    """The provider's discovery document, with its issuer checked against the one asked for."""
    url = issuer.rstrip("/") + "/.well-known/openid-configuration"
    try:
        response = http.get(url, headers={"Accept": "application/json"})
    except httpx.HTTPError as exc:
        raise DeviceLoginError(f"cannot reach the sign-in provider at {issuer}: {exc}") from exc
    document = _json(response)
    if response.status_code != 200 or not document:
        raise DeviceLoginError(f"the sign-in provider at {issuer} answered {response.status_code} for its discovery")
    if document.get("issuer") != issuer:
        raise DeviceLoginError(f"the provider calls itself {document.get('issuer')!r}, not {issuer!r}")
    for field in ("device_authorization_endpoint", "token_endpoint"):
        if not isinstance(document.get(field), str):
            raise DeviceLoginError(f"the sign-in provider offers no {field} (device sign-in unsupported)")
    return document


def device_login(
    issuer: str,
    client_id: str,
    show: ShowCode,
    *,
    scopes: tuple[str, ...] = DEFAULT_SCOPES,
    ca_file: Path | None = None,
    timeout_s: float = 10,
    http: httpx.Client | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, Any]:
    """Run the device grant: start it, `show` the user where to go and which code to enter, poll the token
    endpoint until the user has signed in, and return the token response (with `id_token`)."""
    own = http is None
    if http is None:
        verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=str(ca_file)) if ca_file else True
        http = httpx.Client(verify=verify, timeout=timeout_s)
    try:
        return _device_login(http, issuer, client_id, show, scopes, sleep, clock)
    finally:
        if own:
            http.close()


def _device_login(
    http: httpx.Client,
    issuer: str,
    client_id: str,
    show: ShowCode,
    scopes: tuple[str, ...],
    sleep: Callable[[float], None],
    clock: Callable[[], float],
) -> dict[str, Any]:
    document = discover(http, issuer)
    started = _post(
        http,
        document["device_authorization_endpoint"],
        {"client_id": client_id, "scope": " ".join(scopes)},
        "device authorization",
    )
    grant = _json(started)
    if started.status_code != 200 or not isinstance(grant.get("device_code"), str):
        error = grant.get("error", started.status_code)
        raise DeviceLoginError(f"the sign-in provider refused to start a device sign-in: {error}")
    interval = float(grant.get("interval", 5))
    deadline = clock() + float(grant.get("expires_in", 600))
    show(str(grant["verification_uri"]), str(grant["user_code"]), grant.get("verification_uri_complete"))
    while True:
        if clock() + interval > deadline:
            raise DeviceLoginError("the sign-in code expired before it was used (expired_token); run the login again")
        sleep(interval)
        polled = _post(
            http,
            document["token_endpoint"],
            {"grant_type": DEVICE_GRANT, "device_code": grant["device_code"], "client_id": client_id},
            "token",
        )
        body = _json(polled)
        if polled.status_code == 200:
            if "openid" in scopes and not isinstance(body.get("id_token"), str):
                raise DeviceLoginError("the sign-in provider returned no ID token")
            return body
        error = body.get("error")
        if error == "authorization_pending":
            continue
        if error == "slow_down":
            interval += SLOW_DOWN_S
            continue
        if error == "access_denied":
            raise DeviceLoginError("the sign-in was refused at the provider (access_denied)")
        if error == "expired_token":
            raise DeviceLoginError("the sign-in code expired before it was used (expired_token); run the login again")
        detail = body.get("error_description") or ""
        raise DeviceLoginError(f"the sign-in provider refused: {error or polled.status_code} {detail}".rstrip())
