"""Generated lines inside a file people also edit (slurm.conf): a block between marker lines, the rest untouched.

gpufleet owns only what lies between `# BEGIN gpufleet managed <what>` and `# END gpufleet managed <what>`;
every other byte of the file (comments, settings, line endings, even bytes that are not UTF-8) is written
back exactly as it was read. A file without the markers gets the block appended at its end. Also here: a
unified diff of old and new text (`--dry-run`), and an atomic write that keeps a `.bak` of what it replaced.

Stdlib only, in `core`, because the CLI does the editing (the files live on the Slurm controller, not on the
head) and the CLI may not import the server's domains.
"""

from __future__ import annotations

import difflib
import os
import tempfile
from pathlib import Path

from gpufleet.core.errors import InvalidInput

# Text is decoded with surrogateescape so that bytes that are not UTF-8 survive a read and a write unchanged.
ENCODING = "utf-8"
ERRORS = "surrogateescape"


def markers(what: str) -> tuple[str, str]:
    """The two marker lines (without newlines) around the block named `what`."""
    return f"# BEGIN gpufleet managed {what}", f"# END gpufleet managed {what}"


def wrap(body: str, what: str) -> str:
    """The block as it appears in the file: the markers around `body`, every line ending in a newline."""
    begin, end = markers(what)
    return f"{begin}\n{_lines(body)}{end}\n"


def _lines(body: str) -> str:
    return body if not body or body.endswith("\n") else body + "\n"


def find(text: str, what: str) -> tuple[int, int] | None:
    """The line numbers (0-based) of the BEGIN and END markers, or None when the file has neither.

    Raises InvalidInput when the markers are broken: one without the other, either twice, END before
    BEGIN. gpufleet will not guess which lines it owns.
    """
    begin, end = markers(what)
    lines = text.splitlines()
    begins = [i for i, line in enumerate(lines) if line.strip() == begin]
    ends = [i for i, line in enumerate(lines) if line.strip() == end]
    if not begins and not ends:
        return None
    if len(begins) != 1 or len(ends) != 1:
        found = ", ".join(f"line {i + 1}" for i in sorted(begins + ends))
        raise InvalidInput(
            f"expected one {begin!r} and one {end!r} line, found {len(begins)} and {len(ends)} ({found}): "
            "fix the markers by hand"
        )
    if ends[0] < begins[0]:
        raise InvalidInput(f"{end!r} (line {ends[0] + 1}) comes before {begin!r} (line {begins[0] + 1})")
    return begins[0], ends[0]


def place(text: str, body: str, what: str) -> str:
    """`text` with the lines between the markers replaced by `body`; everything else byte for byte.

    Without markers the wrapped block is appended at the end (after a newline if the last line lacks one,
    and a blank line to set it apart). Raises InvalidInput for broken markers (see `find`).
    """
    found = find(text, what)
    if found is None:
        head = text if not text or text.endswith("\n") else text + "\n"
        gap = "\n" if head.strip() and not head.endswith("\n\n") else ""
        return head + gap + wrap(body, what)
    first, last = found
    # keepends: the marker lines and all around them keep their own line endings (\r\n stays \r\n).
    lines = text.splitlines(keepends=True)
    return "".join(lines[: first + 1]) + _lines(body) + "".join(lines[last:])


def unified_diff(old: str, new: str, path: str) -> str:
    """What `new` changes in `path`, as `diff -u` prints it ('' when nothing changes)."""
    out = []
    for line in difflib.unified_diff(
        old.splitlines(keepends=True), new.splitlines(keepends=True), fromfile=path, tofile=f"{path} (gpufleet)"
    ):
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


def read_text(path: Path, *, missing_ok: bool = False) -> str:
    """A config file's text, every byte kept (see ENCODING). '' for a missing file when `missing_ok`.

    Raises InvalidInput naming the file when it is missing (unless `missing_ok`), a directory or unreadable.
    """
    try:
        return path.read_bytes().decode(ENCODING, ERRORS)
    except FileNotFoundError:
        if missing_ok and path.parent.is_dir():
            return ""
        raise InvalidInput(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InvalidInput(f"{path}: is a directory, not a file") from None
    except OSError as exc:
        raise InvalidInput(f"cannot read {path}: {exc.strerror or exc}") from None


def write_atomic(path: Path, text: str, *, backup: bool = True) -> Path | None:
    """Replace `path` with `text` so that readers see the old file or the new one, never half of either.

    The text goes to a temporary file in the same directory, is flushed to disk, given the old file's mode
    and owner, then renamed over the old one. A symlink is followed: the file it points to is replaced and the
    link stays. With `backup`, the old content is first kept (the same way) as `<name>.bak`, which is returned.
    A new file gets mode 0644. Raises InvalidInput when the file cannot be written; then it is unchanged.
    """
    target = Path(os.path.realpath(path))
    try:
        old = target.stat()
    except FileNotFoundError:
        old = None
    except OSError as exc:
        raise InvalidInput(f"cannot write {path}: {exc.strerror or exc}") from None
    saved = None
    if backup and old is not None:
        saved = target.with_name(target.name + ".bak")
        _replace(saved, target.read_bytes(), old)
    _replace(target, text.encode(ENCODING, ERRORS), old)
    return saved


def _replace(target: Path, data: bytes, like: os.stat_result | None) -> None:
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:
        raise InvalidInput(f"cannot write {target}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, (like.st_mode & 0o7777) if like is not None else 0o644)
        if like is not None and (like.st_uid, like.st_gid) != (os.getuid(), os.getgid()):
            # slurm.conf must stay readable by the same owner (SlurmUser); a file that silently changed
            # owner is a surprise found only at the next restart. Refuse rather than do that.
            os.chown(tmp, like.st_uid, like.st_gid)
        os.replace(tmp, target)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise InvalidInput(f"cannot write {target}: {exc.strerror or exc}") from None
    _sync_dir(target.parent)


def _sync_dir(directory: Path) -> None:
    """Make the rename durable: a crash after it must not bring the old file back."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems (e.g. NFS, tmpfs) do not sync directories; the rename itself is done
    finally:
        os.close(fd)
