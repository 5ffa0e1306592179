"""Device secrets sealed at rest (BMC passwords, switches' SNMP communities and keys): Fernet (AES-128-CBC
with HMAC-SHA256) under a key kept in a file, `bmc_key_file` (data_dir/bmc.key by default; the name
predates switches).

The key file holds one Fernet key per line. The first line seals; every line opens, so a key is
rotated by putting a new one first, re-saving the BMCs (`gpufleet bmc set`) and the switches (`gpufleet
switch remove`, then `add`: a switch cannot be re-saved in place, so its rates start afresh), then dropping
the old line. The database alone (a dump, a backup, a replica's disk) therefore never
yields a secret.
Head replicas must share the same key file: copy it to each (mode 0600, owned by the service user).
The file is created with mode 0600 on first use, atomically, so two replicas starting at once on a
shared directory cannot end up with different keys.
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from gpufleet.core.config import Settings
from gpufleet.core.errors import ConfigError, Conflict

_BOXES: dict[Path, CredentialBox] = {}
_BOXES_LOCK = threading.Lock()


def head_box(settings: Settings) -> CredentialBox:
    """The box of this head's key file (`bmc_key_file`, else data_dir/bmc.key)."""
    return box_for(settings.bmc_key_file or settings.data_dir / "bmc.key")


def box_for(path: Path) -> CredentialBox:
    """The box for a key file, read once per process (a rotated key file takes effect at restart).

    Raises ConfigError as `CredentialBox.from_key_file` does.
    """
    with _BOXES_LOCK:
        box = _BOXES.get(path)
        if box is None:
            box = _BOXES[path] = CredentialBox.from_key_file(path)
        return box


class CredentialBox:
    """Seals and opens device secrets with the head's keys."""

    def __init__(self, keys: list[bytes]) -> None:
        if not keys:
            raise ConfigError("the key file (bmc_key_file) holds no key")
        try:
            self._fernet = MultiFernet([Fernet(k) for k in keys])
        except ValueError:
            raise ConfigError("the key file (bmc_key_file) holds a line that is not a Fernet key") from None

    @classmethod
    def generate(cls) -> CredentialBox:
        """A box with a fresh key that lives only in memory (tests)."""
        return cls([Fernet.generate_key()])

    @classmethod
    def from_key_file(cls, path: Path) -> CredentialBox:
        """The box for `path`, creating the file with a new key (mode 0600) if it does not exist.

        Raises ConfigError if the file cannot be read or created, or is readable by others.
        """
        try:
            ensure_key_file(path)
            mode = path.stat().st_mode
            if mode & 0o077:
                raise ConfigError(f"{path} is readable by others (mode {mode & 0o777:o}): chmod 600 it")
            lines = path.read_bytes().split()
        except OSError as exc:
            raise ConfigError(f"cannot use the key file {path}: {exc.strerror or exc}") from None
        return cls([line.strip() for line in lines if line.strip()])

    def seal(self, password: str) -> str:
        return self._fernet.encrypt(password.encode()).decode("ascii")

    def open(self, sealed: str) -> str:
        """The password. Raises Conflict when no key opens it (another head's key file, or a lost one)."""
        try:
            return self._fernet.decrypt(sealed.encode("ascii")).decode()
        except (InvalidToken, UnicodeError):
            raise Conflict(
                "the stored secret cannot be decrypted with this head's key file "
                "(replicas must share it; after a lost key, set the BMC's or switch's credentials again)"
            ) from None


def ensure_key_file(path: Path) -> None:
    """Create `path` with one new key and mode 0600 unless it exists. Written to a temporary file
    first and linked into place, so a reader never sees a half-written key and a racing creator loses."""
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(Fernet.generate_key() + b"\n")
            fh.flush()
            os.fsync(fh.fileno())
        with contextlib.suppress(FileExistsError):  # another process created it meanwhile: theirs wins
            os.link(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
