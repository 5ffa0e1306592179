"""Passwords: argon2id hashes (argon2-cffi) and the minimum policy."""

from __future__ import annotations

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

from gpufleet.core.errors import InvalidInput

MIN_LENGTH = 12
MAX_LENGTH = 1024  # argon2 takes any length; this bounds the work an attacker can ask for
_hasher = PasswordHasher()


def check_policy(password: str, username: str) -> None:
    """Raise InvalidInput saying which rule a password breaks."""
    if len(password) < MIN_LENGTH:
        raise InvalidInput(f"password too short: at least {MIN_LENGTH} characters")
    if len(password) > MAX_LENGTH:
        raise InvalidInput(f"password too long: at most {MAX_LENGTH} characters")
    if username.lower() in password.lower():
        raise InvalidInput("password must not contain the username")
    if len(set(password)) < 4:
        raise InvalidInput("password must use at least 4 different characters")


def hash_password(password: str) -> str:
    return _hasher.hash(password)


def verify(password_hash: str, password: str) -> bool:
    try:
        return _hasher.verify(password_hash, password)
    except (VerificationError, InvalidHashError):
        return False
