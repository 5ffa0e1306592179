"""A tarball import reads only inside image_import_dirs, checked at the request and again when the task
starts tar: a link swapped in between to point out of the directory is refused, and tar reads the file
the check resolved."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.core.clock import FakeClock
from gpufleet.core.db import transaction
from gpufleet.core.errors import InvalidInput, NotFound
from gpufleet.provisioning import images
from gpufleet.provisioning.images import ImageConfig, Source
from gpufleet.provisioning.runner import Completed, Step
from tests.provisioning.images_helpers import ACTOR, make_tree, sqlite_sessions, tarball

__all__ = ["sqlite_sessions"]  # the fixture, imported for pytest


class Recording:
    """Runs nothing; keeps the argv of each step."""

    def __init__(self) -> None:
        self.argv: list[tuple[str, ...]] = []

    def run(self, step: Step, **_: object) -> Completed:
        self.argv.append(step.argv)
        return Completed(step.argv, 0, "", "", 0.0)


def test_a_link_swapped_after_the_request_is_refused_when_the_task_starts(
    sqlite_sessions: sessionmaker[Session], clock: FakeClock, tmp_path: Path
) -> None:
    imports = tmp_path / "imports"
    imports.mkdir()
    config = ImageConfig(images_dir=tmp_path / "images", import_dirs=(imports,))
    real = tarball(make_tree(tmp_path / "tree"), imports / "real.tar")
    link = imports / "latest.tar"
    link.symlink_to(real)
    source = Source(tarball=str(link))
    with transaction(sqlite_sessions) as s:
        images.begin_create(s, clock, config, "base", source, ACTOR)
    link.unlink()
    link.symlink_to("/etc/passwd")
    runner = Recording()
    with pytest.raises(InvalidInput, match="not inside an import directory"):
        images.run_create(
            sqlite_sessions,
            clock,
            runner,
            config,
            name="base",
            source=source,
            clone_path=None,
            actor=ACTOR,
            task_id=None,
        )
    assert runner.argv == []  # tar never ran
    with pytest.raises(NotFound), transaction(sqlite_sessions, readonly=True) as s:
        images.get_image(s, "base")  # the request's row is gone with the failed build


def test_tar_reads_the_resolved_file(sqlite_sessions: sessionmaker[Session], clock: FakeClock, tmp_path: Path) -> None:
    imports = tmp_path / "imports"
    imports.mkdir()
    config = ImageConfig(images_dir=tmp_path / "images", import_dirs=(imports,))
    real = tarball(make_tree(tmp_path / "tree"), imports / "real.tar")
    (imports / "latest.tar").symlink_to(real)
    source = Source(tarball=str(imports / "latest.tar"))
    with transaction(sqlite_sessions) as s:
        images.begin_create(s, clock, config, "base", source, ACTOR)
    runner = Recording()
    images.run_create(
        sqlite_sessions, clock, runner, config, name="base", source=source, clone_path=None, actor=ACTOR, task_id=None
    )
    assert runner.argv[0][:3] == ("tar", "--extract", f"--file={real.resolve()}")
