"""The node's artifact cache: models and datasets copied to local disk once, checked, and reused.

Layout under `root`: `<sha256>/` per artifact, holding `tree/` (a directory artifact) or `file/<name>`
(a file artifact), `index.json` with what the head is told (`CacheEntry`: size, when copied,
when last used, uses), and `.incoming-*` for copies in progress. A copy is checked against the registered
checksum before it is renamed into place, so a reader never sees a half-copied or corrupt artifact, and
a crash mid-copy leaves only an `.incoming-*` that the next start clears.

The cache stays under `limit_bytes` by evicting the least recently used artifacts, never one a running
rank uses. An artifact bigger than the whole limit is refused, not staged past it.

Everything here blocks (disk copies, downloads, hashing): the supervisor runs it on a thread, one stage
at a time per node, so two ranks needing the same dataset copy it once.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

import httpx

from gpufleet.core import addresses
from gpufleet.protocol.artifacts import (
    MAX_CACHE_ENTRIES,
    ArtifactError,
    CacheEntry,
    NodeCache,
    StageRef,
    digest,
    local_path,
)

log = logging.getLogger(__name__)
INDEX = "index.json"
DOWNLOAD_TIMEOUT_S = 60.0  # without a byte: a stalled object store fails the rank instead of hanging it


@dataclass(frozen=True)
class Staged:
    ref: StageRef
    path: Path  # what the job reads: the tree's directory, or the file
    copied: bool  # False: it was already in the cache
    seconds: float


class ArtifactCache:
    def __init__(self, root: Path, limit_bytes: int, clock: Callable[[], float] = time.time) -> None:
        self.root = root
        self.limit_bytes = limit_bytes
        self.clock = clock
        # Read at the first use, not here: a simulator's hundreds of nodes mostly never stage anything.
        self._loaded: dict[str, CacheEntry] | None = None

    @property
    def in_use(self) -> bool:
        """Whether this node has a cache to tell the head about (one was ever created here)."""
        return self._loaded is not None or self.root.is_dir()

    @property
    def _entries(self) -> dict[str, CacheEntry]:
        if self._loaded is None:
            self._loaded = self._load()
        return self._loaded

    # -- the index ----------------------------------------------------------------------------------
    def _load(self) -> dict[str, CacheEntry]:
        self.root.mkdir(parents=True, exist_ok=True)
        # Traversable, not listable: a job reaches an artifact by the path it is given (its checksum),
        # but cannot list what other projects' jobs staged here.
        self.root.chmod(0o711)
        for leftover in self.root.glob(".incoming-*"):  # a copy a crash interrupted
            shutil.rmtree(leftover, ignore_errors=True)
        try:
            raw = json.loads((self.root / INDEX).read_text())
            entries = {e["sha256"]: CacheEntry.model_validate(e) for e in raw}
        except (OSError, ValueError, TypeError, KeyError):
            entries = {}  # no index, or a damaged one: what is on disk unindexed is cleared below
        entries = {sha: e for sha, e in entries.items() if (self.root / sha).is_dir()}
        for path in self.root.iterdir():
            if path.is_dir() and not path.name.startswith(".") and path.name not in entries:
                shutil.rmtree(path, ignore_errors=True)
        return entries

    def _save(self) -> None:
        data = json.dumps([e.model_dump() for e in self._entries.values()])
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".index-")
        with os.fdopen(fd, "w") as f:
            f.write(data)
        os.replace(tmp, self.root / INDEX)

    def report(self) -> NodeCache:
        """What the head is told: every entry, or the MAX_CACHE_ENTRIES most recently used of a bigger cache
        (the message's limit; the scheduler loses locality only for what no job used for longest)."""
        recent = sorted(self._entries.values(), key=lambda e: e.last_used_at, reverse=True)[:MAX_CACHE_ENTRIES]
        return NodeCache(limit_bytes=self.limit_bytes, entries=sorted(recent, key=lambda e: e.sha256))

    def used_bytes(self) -> int:
        return sum(e.size_bytes for e in self._entries.values())

    # -- staging ------------------------------------------------------------------------------------
    def stage(self, ref: StageRef, in_use: Collection[str] = ()) -> Staged:
        """Make `ref` present and checked in the cache; ArtifactError when it cannot be."""
        try:
            return self._stage(ref, in_use)
        except OSError as exc:  # the cache itself unwritable, full, gone
            raise ArtifactError(f"{ref.kind} {ref.ref}: the node cache {self.root}: {exc.strerror or exc}") from None

    def _stage(self, ref: StageRef, in_use: Collection[str]) -> Staged:
        started = self.clock()
        entry = self._entries.get(ref.sha256)
        if entry is not None and not (self.root / ref.sha256).is_dir():
            # Removed behind our back (by hand, a disk cleaner): copy it again rather than fail every rank.
            log.warning("artifact cache: %s vanished from %s; copying it again", ref.sha256[:12], self.root)
            del self._entries[ref.sha256]
            entry = None
        copied = entry is None
        if entry is None:
            if ref.size_bytes > self.limit_bytes:
                raise ArtifactError(
                    f"{ref.kind} {ref.ref} is {ref.size_bytes} bytes,"
                    f" over this node's cache limit of {self.limit_bytes}"
                )
            self._evict(ref.size_bytes, {*in_use, ref.sha256})
            size = self._copy_in(ref)
            entry = CacheEntry(sha256=ref.sha256, size_bytes=size, copied_at=started, last_used_at=started, uses=0)
        now = self.clock()
        self._entries[ref.sha256] = entry.model_copy(update={"last_used_at": now, "uses": entry.uses + 1})
        self._save()
        return Staged(ref, self._payload(ref.sha256), copied, now - started)

    def _payload(self, sha256: str) -> Path:
        """A tree's directory, or a file artifact's one file."""
        home = self.root / sha256
        if (home / "tree").is_dir():
            return home / "tree"
        return next((home / "file").iterdir())

    def _evict(self, need: int, keep: Collection[str]) -> None:
        """Drop least recently used entries, none in `keep`, until `need` more bytes fit; when even dropping
        every other entry would not make room, ArtifactError and nothing is dropped."""
        used = self.used_bytes()
        if used + need <= self.limit_bytes:
            return
        kept = sum(e.size_bytes for e in self._entries.values() if e.sha256 in keep)
        if kept + need > self.limit_bytes:
            raise ArtifactError(
                f"the node cache cannot make room for {need} bytes: running jobs use the rest of its {self.limit_bytes}"
            )
        for entry in sorted(self._entries.values(), key=lambda e: e.last_used_at):
            if used + need <= self.limit_bytes:
                break
            if entry.sha256 in keep:
                continue
            log.info("artifact cache: evicting %s (%d bytes, least recently used)", entry.sha256[:12], entry.size_bytes)
            shutil.rmtree(self.root / entry.sha256, ignore_errors=True)
            del self._entries[entry.sha256]
            used -= entry.size_bytes
        if used + need > self.limit_bytes:
            raise ArtifactError(
                f"the node cache cannot make room for {need} bytes: running jobs use the rest of its {self.limit_bytes}"
            )
        self._save()

    def _copy_in(self, ref: StageRef) -> int:
        """Copy `ref` in, checked; its size in bytes as copied."""
        incoming = Path(tempfile.mkdtemp(dir=self.root, prefix=".incoming-"))
        try:
            source = local_path(ref.source)
            if source is not None and source.is_dir():
                target = incoming / "tree"
                shutil.copytree(source, target, symlinks=True)
            else:
                (incoming / "file").mkdir()
                target = incoming / "file" / (source.name if source is not None else _basename(ref.source))
                if source is None:
                    _download(ref.source, target, ref.size_bytes)
                else:
                    shutil.copyfile(source, target)
            sha, size = digest(target)
            if sha != ref.sha256:
                raise ArtifactError(
                    f"{ref.kind} {ref.ref}: checksum mismatch after copying from {ref.source}"
                    f" (registered {ref.sha256[:12]}, got {sha[:12]}); the copy was discarded"
                )
            _readable(incoming)  # by the jobs' users, whatever modes the source had
            incoming.rename(self.root / ref.sha256)
            log.info("artifact cache: staged %s %s (%d bytes)", ref.kind, ref.ref, size)
        except OSError as exc:
            raise ArtifactError(f"{ref.kind} {ref.ref}: cannot copy from {ref.source}: {exc.strerror or exc}") from None
        finally:
            shutil.rmtree(incoming, ignore_errors=True)
        return size


def _readable(top: Path) -> None:
    """Directories 0755 and files 0644 under `top` (the copy is root's; its users read it)."""
    top.chmod(0o755)
    for parent, dirs, files in os.walk(top):
        for name in dirs:
            Path(parent, name).chmod(0o755)
        for name in files:
            Path(parent, name).chmod(0o644)


def _basename(uri: str) -> str:
    name = uri.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
    return name if name not in ("", ".", "..") else "artifact"


def _allowed(request: httpx.Request) -> None:
    """Every request of a download, redirects included, to an address this node may fetch from: the head
    checked the URL as spelled, but only the node sees what its name resolves to and where it redirects
    (a public URL answering 302 to the metadata service would hand the node's cloud credentials over)."""
    why = addresses.refused_resolved(
        request.url.host, request.url.port or (443 if request.url.scheme == "https" else 80)
    )
    if why is not None:
        raise ArtifactError(f"refused to fetch {request.url}: {why}")


def _download(uri: str, target: Path, size_bytes: int) -> None:
    """The file at `uri`, stopped past its registered size: a wrong or hostile URL cannot fill the disk."""
    written = 0
    try:
        with (
            httpx.Client(
                timeout=DOWNLOAD_TIMEOUT_S, follow_redirects=True, event_hooks={"request": [_allowed]}
            ) as client,
            client.stream("GET", uri) as response,
        ):
            if response.status_code != 200:
                raise ArtifactError(f"cannot download {uri}: HTTP {response.status_code}")
            with target.open("wb") as f:
                for chunk in response.iter_bytes():
                    written += len(chunk)
                    if written > size_bytes:
                        raise ArtifactError(f"{uri} sends more than its registered {size_bytes} bytes; stopped")
                    f.write(chunk)
    except httpx.HTTPError as exc:
        raise ArtifactError(f"cannot download {uri}: {exc}") from None


def job_variables(staged: list[Staged]) -> dict[str, str]:
    """What a job reads: GPUFLEET_MODEL_PATH for its model, GPUFLEET_DATASET_PATH for its first dataset
    and GPUFLEET_DATASET_PATHS for all of them (colon-separated, in the order the job named them)."""
    out: dict[str, str] = {}
    datasets = [str(s.path) for s in staged if s.ref.kind == "dataset"]
    models = [str(s.path) for s in staged if s.ref.kind == "model"]
    if models:
        out["GPUFLEET_MODEL_PATH"] = models[0]
    if datasets:
        out["GPUFLEET_DATASET_PATH"] = datasets[0]
        out["GPUFLEET_DATASET_PATHS"] = ":".join(datasets)
    return out


def describe_staged(staged: Staged) -> str:
    """One line for the job's stderr, so its user sees what the node did before their program ran."""
    what = f"{staged.ref.kind} {staged.ref.ref}"
    if staged.copied:
        size = staged.ref.size_bytes
        return f"gpufleet: {what} copied to the node cache and checked ({size} bytes, {staged.seconds:.1f} s)\n"
    return f"gpufleet: {what} reused from the node cache\n"
