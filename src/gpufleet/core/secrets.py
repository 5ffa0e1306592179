"""Bearer secrets: generated with enough entropy that a fast hash is the right way to store them.

Tokens are 256-bit random strings, so SHA-256 (not a slow password hash) is what stores them:
no dictionary can guess them, and verifying costs microseconds on every heartbeat channel.
The prefix tells a human (and a secret scanner) what kind of credential leaked.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets as _secrets

ADMIN_PREFIX = "gfa_"
JOIN_PREFIX = "gfj_"
NODE_PREFIX = "gfn_"
SESSION_PREFIX = "gfs_"


def new_token(prefix: str) -> str:
    return prefix + _secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def derived(secret: str, purpose: str) -> str:
    """A value only the holder of `secret` can compute, e.g. a web session's CSRF token."""
    return hmac.new(secret.encode(), purpose.encode(), hashlib.sha256).hexdigest()


def same(a: str, b: str) -> bool:
    return hmac.compare_digest(a, b)
