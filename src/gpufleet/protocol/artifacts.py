"""Models and datasets on the wire: what a node must stage before a rank starts, what its cache holds,
and the one checksum everyone computes the same way.

An artifact is a file or a directory tree. Its checksum (`digest`) is SHA-256: of the file's bytes for a
file (what `sha256sum FILE` prints), and for a tree, of its manifest, one line per regular file in byte
order of the relative path, `<sha256 of the file>  <relative path>\\n` (what `sha256sum` prints for each
file). The CLI computes it at registration, the agent after copying: a copy that does not match is
thrown away and the rank does not start. Stdlib only: the agent and the CLI use it.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from gpufleet.protocol.bounds import MAX_INT64

ArtifactKind = Literal["model", "dataset"]
Sha256 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
MAX_STAGED = 8  # artifacts one job may name: a model and a few datasets
MAX_CACHE_ENTRIES = 512  # entries one cache report carries (a node's cache of many small artifacts is cut)
_CHUNK = 1024 * 1024


class ArtifactError(Exception):
    """An artifact that cannot be read, checked or staged; the message says why."""


class StageRef(BaseModel):
    """One artifact a rank needs on its node: where to get it and what it must hash to."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    kind: ArtifactKind
    name: Annotated[str, StringConstraints(max_length=63)]
    version: Annotated[str, StringConstraints(max_length=32)]
    sha256: Sha256
    size_bytes: int = Field(ge=0, le=MAX_INT64)
    source: Annotated[str, StringConstraints(max_length=1024)]  # an absolute path, file:// or http(s):// URI

    @property
    def ref(self) -> str:
        return f"{self.name}:{self.version}"


class CacheEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    sha256: Sha256
    size_bytes: int = Field(ge=0, le=MAX_INT64)
    copied_at: float  # epoch seconds: when it was copied in (unchanged while it is reused)
    last_used_at: float
    uses: int = Field(ge=0, le=2**31 - 1)  # ranks that used it since it was copied


class NodeCache(BaseModel):
    """agent -> head, after each welcome and each change: every artifact the node's cache holds."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    type: Literal["node_cache"] = "node_cache"
    limit_bytes: int = Field(ge=0, le=MAX_INT64)
    entries: list[CacheEntry] = Field(default_factory=list, max_length=MAX_CACHE_ENTRIES)


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _tree_files(root: Path) -> list[tuple[str, Path]]:
    """(relative path, path) of every regular file under `root`, in byte order of the relative path.
    Links and special files are refused: a staged copy must be exactly what was registered."""
    found: list[tuple[str, Path]] = []
    for top, dirs, files in os.walk(root, followlinks=False):
        for name in [*dirs, *files]:
            path = Path(top, name)
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode):
                raise ArtifactError(f"{path} is a symbolic link; artifacts hold plain files and directories")
            if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
                raise ArtifactError(f"{path} is not a plain file or directory")
            if stat.S_ISREG(mode):
                found.append((path.relative_to(root).as_posix(), path))
    return sorted(found, key=lambda item: item[0].encode("utf-8", "surrogateescape"))


def digest(path: Path) -> tuple[str, int]:
    """(sha256, size in bytes) of a file or a directory tree, as the module docstring defines it."""
    try:
        mode = path.lstat().st_mode
        if stat.S_ISREG(mode):
            return _file_sha256(path), path.stat().st_size
        if not stat.S_ISDIR(mode):
            raise ArtifactError(f"{path} is not a plain file or directory")
        manifest = hashlib.sha256()
        size = 0
        for relative, file in _tree_files(path):
            manifest.update(f"{_file_sha256(file)}  {relative}\n".encode("utf-8", "surrogateescape"))
            size += file.stat().st_size
        return manifest.hexdigest(), size
    except OSError as exc:
        raise ArtifactError(f"cannot read {path}: {exc.strerror or exc}") from None


def local_path(source: str) -> Path | None:
    """The filesystem path a source names (an absolute path or a file:// URI); None for http(s), and for a
    file:// URI without an absolute path (`file://data/x`), which each agent would read from its own cwd."""
    if source.startswith("file://"):
        path = source.removeprefix("file://")
        return Path(path) if path.startswith("/") else None
    if source.startswith("/"):
        return Path(source)
    return None


def check_source(source: str) -> str:
    """A source the agents can stage from, else ArtifactError: an absolute path or file:// URI (a
    shared filesystem), or an http(s):// URI (one file: an object store's public or presigned URL)."""
    if local_path(source) is not None or source.startswith(("http://", "https://")):
        if "\x00" in source:
            raise ArtifactError("the location holds a NUL character")
        return source
    raise ArtifactError(
        f"cannot stage from {source!r}: give an absolute path on a shared filesystem, a file:// URI or an"
        " http(s):// URI (for an object store, its public or presigned URL)"
    )
