"""What the image and sync tests share: a small node tree, a migrated SQLite database per module,
images made from tarballs through the real tar, and running a task's work to its end."""

from __future__ import annotations

import os
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.core.clock import Clock, FakeClock
from gpufleet.core.db import make_engine, make_session_factory, transaction
from gpufleet.migrations import upgrade
from gpufleet.provisioning import images
from gpufleet.provisioning.images import ImageConfig, Source
from gpufleet.provisioning.runner import ProcessRunner
from gpufleet.tasks import service as tasks
from gpufleet.tasks.runner import TaskContext, TaskRunner
from gpufleet.tasks.schemas import TaskOut

ACTOR = "user:alice"


def make_tree(root: Path) -> Path:
    """A small node image: nested files, a link, a hard link, odd modes, an empty mount point,
    local state a sync must leave alone on nodes."""
    (root / "etc" / "ssh").mkdir(parents=True)
    (root / "usr" / "lib" / "gpu").mkdir(parents=True)
    (root / "proc").mkdir()
    (root / "var" / "log").mkdir(parents=True)
    (root / "etc" / "os-release").write_text('PRETTY_NAME="gpufleet test image"\n')
    (root / "etc" / "hostname").write_text("image\n")
    (root / "etc" / "ssh" / "sshd_config").write_text("PermitRootLogin prohibit-password\n")
    (root / "etc" / "shadow").write_text("root:*:19000:0:99999:7:::\n")
    os.chmod(root / "etc" / "shadow", 0o640)
    (root / "usr" / "lib" / "gpu" / "libgpu.so.1").write_bytes(os.urandom(64 * 1024))
    os.link(root / "usr" / "lib" / "gpu" / "libgpu.so.1", root / "usr" / "lib" / "gpu" / "libgpu-hard.so")
    os.symlink("libgpu.so.1", root / "usr" / "lib" / "gpu" / "libgpu.so")
    for i in range(20):
        (root / "usr" / "lib" / f"file{i:02d}.txt").write_text(f"file {i}\n" * (i + 1))
    return root


def tarball(tree: Path, out: Path) -> Path:
    with tarfile.open(out, "w:gz") as tar:
        for entry in sorted(tree.iterdir()):
            tar.add(entry, arcname=entry.name)
    return out


@pytest.fixture(scope="module")
def sqlite_sessions(tmp_path_factory: pytest.TempPathFactory) -> Iterator[sessionmaker[Session]]:
    """One migrated SQLite database for a module's tests (each uses names of its own): migrating
    for every test would cost most of their time."""
    engine = make_engine(f"sqlite:///{tmp_path_factory.mktemp('db') / 'gpufleet.db'}")
    upgrade(engine)
    yield make_session_factory(engine)
    engine.dispose()


def run_task(
    sessions: sessionmaker[Session],
    clock: Clock,
    kind: str,
    targets: list[str],
    work: Callable[[TaskContext], str | None],
    timeout_s: float = 60.0,
) -> TaskOut:
    """Create a task, run `work` on the real TaskRunner and return the finished task."""
    with transaction(sessions) as s:
        task_id = tasks.create(s, clock, kind=kind, targets=targets, params={}, created_by=ACTOR).id
    runner = TaskRunner(sessions, clock)
    runner.start(task_id, work)
    runner.wait(task_id, timeout_s)
    with transaction(sessions, readonly=True) as s:
        return TaskOut.of(tasks.get(s, task_id))


def import_tarball(
    sessions: sessionmaker[Session],
    clock: FakeClock,
    config: ImageConfig,
    name: str,
    tar: Path,
    task_id: int | None = None,
) -> str:
    """An image made from a tarball through the real tar; returns the summary."""
    source = Source(tarball=str(tar))
    with transaction(sessions) as s:
        _, clone_path = images.begin_create(s, clock, config, name, source, ACTOR)
    return images.run_create(
        sessions,
        clock,
        ProcessRunner(),
        config,
        name=name,
        source=source,
        clone_path=clone_path,
        actor=ACTOR,
        task_id=task_id,
    )
