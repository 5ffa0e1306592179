"""The node's own credential, kept on the node after the join token was traded for it."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from gpufleet.core.errors import ConfigError


@dataclass(frozen=True)
class Credential:
    server: str
    node: str
    node_id: int
    token: str
    heartbeat_interval_s: float | None = None  # what the head handed out at join


class CredentialStore:
    """One JSON file, mode 0600, replaced atomically so a crash never leaves half a credential."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> Credential | None:
        try:
            data = json.loads(self.path.read_text())
            return Credential(
                server=str(data["server"]),
                node=str(data["node"]),
                node_id=int(data["node_id"]),
                token=str(data["token"]),
                heartbeat_interval_s=float(data["heartbeat_interval_s"]) if data.get("heartbeat_interval_s") else None,
            )
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ConfigError(f"{self.path}: cannot read the credential: {exc.strerror}") from None
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"{self.path}: corrupt credential file ({exc}); delete it and join again") from None

    def check_writable(self) -> None:
        """Raise ConfigError unless a credential can be saved here."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            probe = self.path.with_name(self.path.name + ".probe")
            probe.touch(mode=0o600)
            probe.unlink()
        except OSError as exc:
            raise ConfigError(f"cannot write the node credential in {self.path.parent}: {exc.strerror}") from None

    def save(self, credential: Credential) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = self.path.with_name(self.path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(asdict(credential), fh)
            fh.flush()
            os.fsync(fh.fileno())
        tmp.replace(self.path)

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)
