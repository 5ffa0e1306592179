"""Configure a freshly started glewlwyd (scripts/services/oidc.sh) through its admin REST API.

Run by the system python3 (standard library only): it logs in as the database's built-in admin, then adds
the scopes, the OIDC plugin with the given RSA key, the clients gpufleet-web and gpufleet-cli and the users
alice, bob and carol with their groups, and grants each user's consent to both clients ahead of time, so a
login is the username and password and nothing more. Prints the env file's lines on stdout.
"""

from __future__ import annotations

import argparse
import http.cookiejar
import json
import secrets
import sys
import urllib.error
import urllib.request
from pathlib import Path

PLUGIN = "oidc"  # the plugin instance's name: its endpoints live under /api/oidc/
SCOPES = ("openid", "profile", "email", "groups")
USERS = {
    "alice": ("Alice Example", ("gpu-admins", "ml-vision")),
    "bob": ("Bob Example", ("ml-vision", "ml-nlp")),
    "carol": ("Carol Example", ("ml-nlp",)),
}
ADMIN = ("admin", "password")  # the initial admin of glewlwyd's init.sqlite3.sql; this instance is private


class Api:
    """An admin or user session on the glewlwyd API (cookie-authenticated)."""

    def __init__(self, base: str) -> None:
        self.base = base.rstrip("/") + "/api"
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))

    def call(self, method: str, path: str, body: object = None) -> object:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data=data, method=method)  # noqa: S310 (our own http URL)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with self.opener.open(request, timeout=10) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            raise SystemExit(
                f"glewlwyd setup: {method} {path}: {exc.code} {exc.read().decode(errors='replace')}"
            ) from exc
        return json.loads(raw) if raw.strip() else None

    def login(self, username: str, password: str) -> None:
        self.call("POST", "/auth/", {"username": username, "password": password})


def plugin_parameters(issuer: str, key_pem: str, cert_pem: str, ttl_s: int) -> dict[str, object]:
    return {
        "iss": issuer,
        "jwt-type": "rsa",
        "jwt-key-size": "256",
        "key": key_pem,
        "cert": cert_pem,
        "jwks-show": True,
        "access-token-duration": ttl_s,  # glewlwyd gives the ID token the access token's lifetime
        "refresh-token-duration": 3600,
        "code-duration": 600,
        "refresh-token-rolling": False,
        "allow-non-oidc": False,
        "auth-type-code-enabled": True,
        "auth-type-token-enabled": False,
        "auth-type-id-token-enabled": False,
        "auth-type-none-enabled": False,
        "auth-type-password-enabled": False,
        "auth-type-client-enabled": False,
        "auth-type-refresh-enabled": True,
        "auth-type-device-enabled": True,
        "device-authorization-expiration": 600,
        "device-authorization-interval": 1,  # the tests poll; 5 s (the default) would only slow them
        "secret-type": "public",  # `sub` is the same for every client: the head keys users on issuer#sub
        "allowed-scope": list(SCOPES),
        "name-claim": "mandatory",
        "email-claim": "mandatory",
        "scope-claim": "no",
        "claims": [
            {"name": "preferred_username", "user-property": "username", "type": "string", "mandatory": True},
            {"name": "groups", "user-property": "groups", "type": "string", "mandatory": True},
        ],
        "pkce-allowed": True,
        "pkce-method-plain-allowed": False,
        "pkce-required": False,
        "pkce-required-public-client": True,
        "request-parameter-allow": False,
        "session-management-allowed": False,
        "introspection-revocation-allowed": False,
        "register-client-allowed": False,
        "encrypt-out-token-allow": False,
        "address-claim": {"type": "no"},
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--key", type=Path, required=True)
    parser.add_argument("--cert", type=Path, required=True)
    parser.add_argument("--redirect-uris", default="")
    parser.add_argument("--id-token-ttl", type=int, default=300)
    args = parser.parse_args()
    issuer = f"{args.url.rstrip('/')}/api/{PLUGIN}"

    admin = Api(args.url)
    admin.login(*ADMIN)
    user_modules = admin.call("GET", "/mod/user/")
    assert isinstance(user_modules, list)
    database = next(m for m in user_modules if m["name"] == "database")
    database["parameters"]["data-format"]["groups"] = {
        "multiple": True,
        "read": True,
        "write": True,
        "profile-read": True,
        "profile-write": False,
    }
    admin.call("PUT", "/mod/user/database", database)
    admin.call("PUT", "/mod/user/database/reset")  # the running instance reads its parameters again
    for scope in SCOPES[1:]:
        admin.call(
            "POST",
            "/scope/",
            {"name": scope, "display_name": scope, "description": f"OIDC {scope}", "password_required": False},
        )
    admin.call(
        "POST",
        "/mod/plugin/",
        {
            "module": "oidc",
            "name": PLUGIN,
            "display_name": "gpufleet test OIDC",
            "enabled": True,
            "parameters": plugin_parameters(issuer, args.key.read_text(), args.cert.read_text(), args.id_token_ttl),
        },
    )
    web_secret = secrets.token_urlsafe(24)
    redirect_uris = [u.strip() for u in args.redirect_uris.split(",") if u.strip()]
    admin.call(
        "POST",
        "/client/",
        {
            "client_id": "gpufleet-web",
            "name": "gpufleet dashboard",
            "confidential": True,
            "client_secret": web_secret,
            "token_endpoint_auth_method": ["client_secret_basic", "client_secret_post"],
            "redirect_uri": redirect_uris or ["http://127.0.0.1/unused"],
            "authorization_type": ["code", "refresh_token"],
            "scope": list(SCOPES),
            "enabled": True,
        },
    )
    admin.call(
        "POST",
        "/client/",
        {
            "client_id": "gpufleet-cli",
            "name": "gpufleet CLI",
            "confidential": False,
            "token_endpoint_auth_method": ["none"],
            "redirect_uri": [],
            "authorization_type": ["device_authorization", "refresh_token"],
            "scope": list(SCOPES),
            "enabled": True,
        },
    )
    passwords: dict[str, str] = {}
    for username, (name, groups) in USERS.items():
        passwords[username] = f"{username}-{secrets.token_hex(6)}"
        admin.call(
            "POST",
            "/user/",
            {
                "username": username,
                "name": name,
                "email": f"{username}@example.test",
                "password": passwords[username],
                "scope": list(SCOPES),
                "groups": list(groups),
                "enabled": True,
            },
        )
        user = Api(args.url)
        user.login(username, passwords[username])
        for client in ("gpufleet-web", "gpufleet-cli"):
            user.call("PUT", f"/auth/grant/{client}", {"scope": " ".join(SCOPES)})

    lines = {
        "GPUFLEET_OIDC_ISSUER": issuer,
        "GPUFLEET_OIDC_WEB_CLIENT_ID": "gpufleet-web",
        "GPUFLEET_OIDC_WEB_CLIENT_SECRET": web_secret,
        "GPUFLEET_OIDC_CLI_CLIENT_ID": "gpufleet-cli",
        "GPUFLEET_OIDC_DEVICE_VERIFICATION_URL": f"{issuer}/device",
        "GPUFLEET_OIDC_LOGIN_URL": f"{args.url.rstrip('/')}/login.html",
        **{f"GPUFLEET_OIDC_PASSWORD_{u.upper()}": p for u, p in passwords.items()},
    }
    sys.stdout.write("".join(f"{k}={v}\n" for k, v in lines.items()))


if __name__ == "__main__":
    main()
