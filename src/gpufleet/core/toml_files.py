"""Named TOML files an admin adds to the built-in ones (job templates, burn-in profiles): reading one, and
reading a set of directories where a later file replaces an earlier one of the same name.

Every problem is an InvalidInput naming the file, so a bad file is refused with its reason and the others
still load."""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from gpufleet.core.errors import InvalidInput

T = TypeVar("T")


class Refused(Exception):
    """A file's content is not what its kind needs; the message says why (the loader adds the file)."""


def load_file(path: Path, parse: Callable[[Path, dict[str, object]], T]) -> T:
    """`parse` of the TOML in `path`. Raises InvalidInput naming the file when it cannot be read, is not TOML,
    or `parse` raises Refused."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InvalidInput(f"{path}: cannot read it: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise InvalidInput(f"{path}: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise InvalidInput(f"{path}: not valid TOML: {exc}") from None
    try:
        return parse(path, data)
    except Refused as exc:
        raise InvalidInput(f"{path}: {exc}") from None


def load_dirs(
    dirs: Sequence[Path], parse: Callable[[Path, dict[str, object]], T], name_of: Callable[[T], str]
) -> tuple[dict[str, T], list[str]]:
    """Every `*.toml` of `dirs` in turn, by name, a later file replacing an earlier one of the same name. A
    file that fails to load is left out (what it meant to replace stays) and its problem listed. A directory
    that does not exist is skipped: admin directories are optional."""
    found: dict[str, T] = {}
    problems: list[str] = []
    for directory in dirs:
        try:
            if not directory.exists():
                continue
            paths = sorted(p for p in directory.iterdir() if p.suffix == ".toml")
        except OSError as exc:
            problems.append(f"{directory}: cannot list it: {exc.strerror or exc}")
            continue
        for path in paths:
            if not path.is_file():  # a FIFO would block the reading thread; a directory is no such file
                problems.append(f"{path}: not a regular file")
                continue
            try:
                item = load_file(path, parse)
            except InvalidInput as exc:
                problems.append(str(exc))
            else:
                found[name_of(item)] = item
    return found, problems
