"""`~/.ssh/authorized_keys` for the accounts gpufleet manages: what goes in it, and writing it safely.

The home directory belongs to its user, who could point `.ssh` or the file itself at, say, `/etc`
and have root write or chown there. So every step works through directory descriptors opened without
following symbolic links, the file is written to a new name and renamed over the old one (which
replaces a link rather than following it), and a FIFO or device in its place is never read.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Sequence
from pathlib import Path

HEADER = (
    "# Managed by gpufleet from the head node: local changes are overwritten.\n"
    "# Change these keys with `gpufleet user update NAME --ssh-key ...`.\n"
)
FILE_NAME = "authorized_keys"
_TMP_NAME = ".authorized_keys.gpufleet-new"
_MAX_READ = 1024 * 1024
# One plain public key: type, base64 blob, optional comment. No options (command=, from=, ...): the
# head never sends them, and a line this pattern refuses cannot smuggle one in, nor a second line.
KEY_PATTERN = re.compile(r"(?:ssh|ecdsa|sk)-[a-z0-9@.-]+ [A-Za-z0-9+/]+={0,3}(?: [^\x00-\x1f\x7f]*)?")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def render(keys: Sequence[str]) -> tuple[bytes, list[str]]:
    """The file's content for `keys`, and one note per key left out because it is not a plain key line."""
    lines: list[str] = []
    dropped: list[str] = []
    for number, key in enumerate(keys, 1):
        line = key.strip()
        if KEY_PATTERN.fullmatch(line):
            lines.append(line + "\n")
        else:
            dropped.append(f"SSH key {number} left out: not a plain public key line")
    return (HEADER + "".join(lines)).encode(), dropped


def install(home: Path, uid: int, gid: int, content: bytes, *, create_home: bool = False) -> bool:
    """Make `home/.ssh/authorized_keys` hold `content`: mode 0600 in a 0700 directory, both owned by uid:gid.

    With `create_home`, a missing home directory is created (mode 0700, owned by uid:gid). Returns
    whether anything changed. Raises FileNotFoundError when the home is missing (and not to be created),
    and OSError for everything else, e.g. ELOOP or ENOTDIR when the home or `.ssh` is a symbolic link.
    """
    if create_home and not home.exists():
        home.mkdir(mode=0o700)
        os.chown(home, uid, gid, follow_symlinks=False)
    home_fd = os.open(home, _DIR_FLAGS)
    try:
        changed = False
        with contextlib.suppress(FileExistsError):
            os.mkdir(".ssh", 0o700, dir_fd=home_fd)
            changed = True
        ssh_fd = os.open(".ssh", _DIR_FLAGS, dir_fd=home_fd)
        try:
            info = os.fstat(ssh_fd)
            if (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) != (uid, gid, 0o700):
                os.fchown(ssh_fd, uid, gid)
                os.fchmod(ssh_fd, 0o700)
                changed = True
            if _current(ssh_fd, uid, gid) == content:
                return changed
            _replace(ssh_fd, uid, gid, content)
            return True
        finally:
            os.close(ssh_fd)
    finally:
        os.close(home_fd)


def _current(ssh_fd: int, uid: int, gid: int) -> bytes | None:
    """The file's content if it is a regular file with the right owner and mode; None otherwise."""
    try:
        # O_NONBLOCK: opening a FIFO the user left in its place must not hang the agent.
        fd = os.open(FILE_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=ssh_fd)
    except OSError:
        return None  # missing, a link, or unreadable: replace it
    try:
        info = os.fstat(fd)
        right = (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (uid, gid, 0o600)
        if not stat.S_ISREG(info.st_mode) or not right or info.st_size > _MAX_READ:
            return None
        return os.read(fd, _MAX_READ + 1)
    finally:
        os.close(fd)


def _replace(ssh_fd: int, uid: int, gid: int, content: bytes) -> None:
    """Write a new file next to the old one and rename it into place, so no reader sees half a file."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(_TMP_NAME, dir_fd=ssh_fd)  # left by an earlier attempt that died
    # O_EXCL with O_CREAT never follows a link someone planted under the temporary name.
    fd = os.open(_TMP_NAME, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=ssh_fd)
    try:
        try:
            view = memoryview(content)
            while view:
                view = view[os.write(fd, view) :]
            os.fchown(fd, uid, gid)
            os.fchmod(fd, 0o600)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(_TMP_NAME, FILE_NAME, src_dir_fd=ssh_fd, dst_dir_fd=ssh_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(_TMP_NAME, dir_fd=ssh_fd)
        raise
    os.fsync(ssh_fd)
