"""Image sync against the real rsync: into directory targets (changes applied, exclusions respected,
--delete, a dry run that changes nothing, the drift report, the limit on nodes at once) and over SSH
to a private sshd (scripts/services/rsync.sh), all through the task fan-out the head uses."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.core.clock import FakeClock
from gpufleet.core.db import transaction
from gpufleet.inventory import categories
from gpufleet.inventory import service as inventory
from gpufleet.inventory.schemas import NodeSettings
from gpufleet.provisioning import images, sync
from gpufleet.provisioning.images import ImageConfig
from gpufleet.provisioning.runner import Completed, ProcessRunner, Runner, Step
from gpufleet.provisioning.sync import NodePlan, SyncConfig
from gpufleet.tasks.runner import TaskContext
from gpufleet.tasks.schemas import TaskOut
from tests.conftest import ROOT, need
from tests.provisioning.images_helpers import ACTOR, import_tarball, make_tree, run_task, sqlite_sessions, tarball
from tests.services import install_tools

__all__ = ["sqlite_sessions"]
pytestmark = pytest.mark.rsync
SCRIPT = ROOT / "scripts" / "services" / "rsync.sh"
TOOLS = ("rsync", "ssh", "sshd")


def _install() -> None:
    install_tools(TOOLS, "rsync.sh")


@dataclass(frozen=True)
class Sshd:
    port: int
    key: Path
    known_hosts: Path
    user: str


@pytest.fixture(scope="session")
def sshd(worker_id: str) -> Iterator[Sshd]:
    """A private sshd on 127.0.0.1, one per xdist worker (a port and state directory of its own)."""
    _install()
    index = int(worker_id.removeprefix("gw")) if worker_id.startswith("gw") else 0
    env = os.environ | {
        "GPUFLEET_RSYNC_STATE": f"/tmp/gpufleet-test-rsync-sshd-{worker_id}",
        "GPUFLEET_RSYNC_SSHD_PORT": str(12322 + index),
    }
    done = subprocess.run(
        ["bash", str(SCRIPT), "start"], capture_output=True, text=True, timeout=60, env=env, check=False
    )
    if done.returncode != 0:
        need("rsync", f"the private sshd did not start: {(done.stderr or done.stdout).strip()[-300:]}")
    port, key, known_hosts, user = done.stdout.strip().splitlines()[-1].split()
    yield Sshd(int(port), Path(key), Path(known_hosts), user)
    subprocess.run(["bash", str(SCRIPT), "stop"], capture_output=True, timeout=30, env=env, check=False)


@pytest.fixture
def config(tmp_path: Path) -> ImageConfig:
    _install()
    return ImageConfig(images_dir=tmp_path / "images", command_timeout_s=60, import_dirs=(tmp_path,))


def _image(sessions: sessionmaker[Session], clock: FakeClock, config: ImageConfig, name: str, tmp: Path) -> Path:
    """An image made by the real tar from make_tree's tree, used by a category `name` of 3 nodes."""
    import_tarball(sessions, clock, config, name, tarball(make_tree(tmp / f"{name}-tree"), tmp / f"{name}.tar"))
    with transaction(sessions) as s:
        categories.create_category(s, clock, name, settings={"software_image": name})
        inventory.add_nodes(s, clock, [f"{name}[1-3]"], NodeSettings(category=name))
    return config.path(name)


def _sync(
    sessions: sessionmaker[Session],
    clock: FakeClock,
    config: ImageConfig,
    plans: list[NodePlan],
    *,
    dry_run: bool = False,
    limit: int = 8,
    runner: Runner | None = None,
    sync_config: SyncConfig | None = None,
) -> TaskOut:
    def work(ctx: TaskContext) -> str:
        return sync.run_sync(
            ctx,
            sessions,
            clock,
            runner or ProcessRunner(),
            config,
            sync_config or SyncConfig(),
            plans=plans,
            dry_run=dry_run,
            limit=limit,
            actor=ACTOR,
        )

    task = run_task(sessions, clock, "image.sync", [p.node for p in plans], work)
    assert task.state == "succeeded", [(t.target, t.detail) for t in task.targets]
    return task


def _plans(sessions: sessionmaker[Session], nodes: str, target: str) -> list[NodePlan]:
    """Plans for `target`; a local one's directory is the image_sync_local_root."""
    with transaction(sessions, readonly=True) as s:
        return sync.plan(s, inventory.list_nodes(s, [nodes]), target=target, local_root=Path(target).parent)


def _files(root: Path) -> dict[str, bytes | str]:
    out: dict[str, bytes | str] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        out[rel] = os.readlink(path) if path.is_symlink() else path.read_bytes() if path.is_file() else "dir"
    return out


def test_a_sync_brings_directory_targets_in_line_and_leaves_local_state_alone(
    sqlite_sessions: sessionmaker[Session], clock: FakeClock, config: ImageConfig, tmp_path: Path
) -> None:
    image = _image(sqlite_sessions, clock, config, "dirs", tmp_path)
    nodes = tmp_path / "nodes"
    used = nodes / "dirs2"  # a node that ran a while: local state, an old file, a changed one
    for sub in ("proc/1", "var/log", "var/lib/gpufleet-agent", "etc", "usr/lib", "home/alice"):
        (used / sub).mkdir(parents=True)
    local_state = {
        "proc/1/status": "State: R\n",
        "var/log/syslog": "node log\n",
        "var/lib/gpufleet-agent/credential": "secret\n",
        "etc/hostname": "dirs2\n",
        "home/alice/notes": "mine\n",
    }
    for rel, text in local_state.items():
        (used / rel).write_text(text)
    (used / "etc" / "old.conf").write_text("from an older image\n")
    (used / "usr" / "lib" / "file03.txt").write_text("edited on the node\n")
    plans = _plans(sqlite_sessions, "dirs[1-3]", str(nodes / "{node}"))

    dry = _sync(sqlite_sessions, clock, config, plans, dry_run=True)
    assert not (nodes / "dirs1").exists() or not any((nodes / "dirs1").iterdir())  # a dry run writes nothing
    assert (used / "etc" / "old.conf").exists()
    by_node = {t.target: t.data or {} for t in dry.targets}
    listed = {tuple(c) for c in by_node["dirs2"]["changes"]}
    assert {("delete", "etc/old.conf"), ("update", "usr/lib/file03.txt"), ("create", "etc/os-release")} <= listed
    assert not {path for _, path in listed} & {"proc/1/status", "var/log/syslog", "etc/hostname", "home/alice/notes"}
    assert by_node["dirs1"]["counts"]["create"] == len(_files(image)) - 1  # all but /etc/hostname (excluded)

    done = _sync(sqlite_sessions, clock, config, plans)
    expected = {k: v for k, v in _files(image).items() if k != "etc/hostname"}
    for node in ("dirs1", "dirs3"):
        assert _files(nodes / node) == expected
    got = _files(used)
    for rel, text in local_state.items():
        assert got.pop(rel) == text.encode()  # excluded: neither written nor deleted
    assert "etc/old.conf" not in got  # --delete
    assert got["usr/lib/file03.txt"] == (image / "usr" / "lib" / "file03.txt").read_bytes()
    lib = nodes / "dirs1" / "usr" / "lib" / "gpu"
    assert (lib / "libgpu.so.1").stat().st_ino == (lib / "libgpu-hard.so").stat().st_ino
    assert oct((nodes / "dirs1" / "etc" / "shadow").stat().st_mode & 0o777) == "0o640"
    data = {t.target: t.data or {} for t in done.targets}
    assert data["dirs1"]["revision"] == 1
    assert data["dirs2"]["deleted"] == 1
    # 3 files in etc (hostname excluded), libgpu.so.1 and 20 others; the hard link is made, not sent
    assert data["dirs1"]["files_transferred"] == 24
    assert data["dirs1"]["counts"]["create"] == 24 + 8 + 2  # and 8 directories, the link, the hard link
    assert done.summary == "3 node(s) against dirs revision 1"

    again = _sync(sqlite_sessions, clock, config, plans, dry_run=True)
    assert all((t.data or {})["changes_total"] == 0 for t in again.targets)  # in line now


def test_the_drift_report_finds_what_differs_from_the_image(
    sqlite_sessions: sessionmaker[Session], clock: FakeClock, config: ImageConfig, tmp_path: Path
) -> None:
    image = _image(sqlite_sessions, clock, config, "drift", tmp_path)
    plans = _plans(sqlite_sessions, "drift1", str(tmp_path / "nodes" / "{node}"))
    _sync(sqlite_sessions, clock, config, plans)
    node = tmp_path / "nodes" / "drift1"
    runner = ProcessRunner()
    report = sync.node_drift(sqlite_sessions, runner, config, SyncConfig(), plans[0])
    assert report.in_line
    # an edit that keeps the size and puts the time back: only a content comparison sees it
    edited = node / "usr" / "lib" / "file05.txt"
    st = edited.stat()
    edited.write_text(edited.read_text().replace("file", "FILE"))
    os.utime(edited, ns=(st.st_atime_ns, st.st_mtime_ns))
    (node / "usr" / "lib" / "file06.txt").unlink()
    (node / "usr" / "lib" / "stray.so").write_text("left behind\n")
    os.chmod(node / "etc" / "shadow", 0o644)
    os.utime(node / "etc" / "os-release", (0, 0))  # only touched: no drift
    (node / "var" / "log" / "syslog").write_text("excluded: no drift\n")
    report = sync.node_drift(sqlite_sessions, runner, config, SyncConfig(), plans[0])
    assert (report.differs, report.missing, report.extra, report.attributes) == (
        ["usr/lib/file05.txt"],
        ["usr/lib/file06.txt"],
        ["usr/lib/stray.so"],
        ["etc/shadow"],
    )
    assert (report.image, report.revision, report.in_line) == ("drift", 1, False)
    assert (image / "usr" / "lib" / "file06.txt").exists()  # a drift report writes nothing either way
    assert not (node / "usr" / "lib" / "file06.txt").exists()


class CountingRunner:
    """The real runner, counting how many rsyncs run at once (each held a moment, so overlaps show)."""

    def __init__(self) -> None:
        self.running = 0
        self.most = 0
        self.lock = threading.Lock()

    def run(self, step: Step, *, on_line: Any = None, ok_codes: frozenset[int] = frozenset({0})) -> Completed:
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            time.sleep(0.15)
            return ProcessRunner().run(step, on_line=on_line, ok_codes=ok_codes)
        finally:
            with self.lock:
                self.running -= 1


def test_the_limit_on_nodes_synced_at_once_is_honoured(
    sqlite_sessions: sessionmaker[Session], clock: FakeClock, config: ImageConfig, tmp_path: Path
) -> None:
    _image(sqlite_sessions, clock, config, "limit", tmp_path)
    with transaction(sqlite_sessions) as s:
        inventory.add_nodes(s, clock, ["limit[4-6]"], NodeSettings(category="limit"))
    plans = _plans(sqlite_sessions, "limit[1-6]", str(tmp_path / "nodes" / "{node}"))
    for limit, most in ((2, 2), (6, 6)):
        counting = CountingRunner()
        task = _sync(sqlite_sessions, clock, config, plans, limit=limit, runner=counting, dry_run=limit == 6)
        assert counting.most == most
        assert (task.done, task.failed) == (6, 0)


def test_a_sync_over_ssh_to_a_private_sshd(
    sqlite_sessions: sessionmaker[Session], clock: FakeClock, config: ImageConfig, tmp_path: Path, sshd: Sshd
) -> None:
    image = _image(sqlite_sessions, clock, config, "ssh", tmp_path)
    ssh_config = SyncConfig(
        ssh_key=sshd.key,
        ssh_port=sshd.port,
        ssh_options=("BatchMode=yes", f"UserKnownHostsFile={sshd.known_hosts}", "StrictHostKeyChecking=yes"),
    )
    remote = tmp_path / "remote"
    plans = _plans(sqlite_sessions, "ssh[1-2]", f"{sshd.user}@127.0.0.1:{remote}/{{node}}")
    assert plans[0].target == f"{sshd.user}@127.0.0.1:{remote}/ssh1/"
    remote.mkdir()
    task = _sync(sqlite_sessions, clock, config, plans, sync_config=ssh_config)
    expected = {k: v for k, v in _files(image).items() if k != "etc/hostname"}
    assert _files(remote / "ssh1") == expected
    assert _files(remote / "ssh2") == expected
    assert all((t.data or {})["bytes_transferred"] > 64 * 1024 for t in task.targets)

    with (image / "etc" / "os-release").open("a") as fh:
        fh.write("VERSION_ID=2\n")
    dry = _sync(sqlite_sessions, clock, config, plans[:1], dry_run=True, sync_config=ssh_config)
    (target,) = dry.targets
    assert (target.data or {})["changes"] == [["update", "etc/os-release"]]
    assert (target.data or {})["revision"] == 2  # the change on disk was recorded before the sync
    report = sync.node_drift(sqlite_sessions, ProcessRunner(), config, ssh_config, plans[1])
    assert report.differs == ["etc/os-release"]
    with transaction(sqlite_sessions, readonly=True) as s:
        assert images.history(s, images.get_image(s, "ssh"))[0].change == "changed on disk outside gpufleet"
