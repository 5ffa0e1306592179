"""The mount probe against REALLY hung mounts: sshfs (FUSE) over a private sshd (scripts/services/sshfs.sh).

The kernel here has no NFS client, but FUSE is there. Two hangs, as a shared file system hangs:

- the server stops (SIGSTOP of the sshd process serving SFTP): sshfs has read the kernel's request and
  waits for an answer that never comes, so the probe's child sits in an uninterruptible wait that even
  SIGKILL cannot end until the server answers: a hard NFS mount with its server gone;
- the client daemon stops (SIGSTOP of sshfs): the request waits in the kernel's queue.

Each time the probe says "hung" within its timeout, starts no second child while one is stuck, and says
"ok" again once the server answers. Every test leaves the processes running (SIGCONT) and unmounts.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpufleet.agent.checks.mounts import read_mountinfo
from gpufleet.agent.checks.runner import HostChecks
from gpufleet.agent.storage.checks import StorageChecks
from gpufleet.agent.storage.collector import StorageCollector
from gpufleet.agent.storage.probe import MountProber
from gpufleet.agent.storage.source import HostStorage
from tests.conftest import ROOT
from tests.services import install_tools, need

SCRIPT = ROOT / "scripts" / "services" / "sshfs.sh"
TIMEOUT_S = 1.0


@dataclass
class Sshfs:
    mountpoint: Path
    sshfs: subprocess.Popen[bytes]
    sshd_pid: int

    def server_processes(self) -> list[int]:
        """The sshd processes below the listener: the one serving this mount's SFTP session among them."""
        found: list[int] = []
        todo = [self.sshd_pid]
        while todo:
            parent = todo.pop()
            children = subprocess.run(["pgrep", "-P", str(parent)], capture_output=True, text=True, check=False)
            for pid in map(int, children.stdout.split()):
                found.append(pid)
                todo.append(pid)
        return found


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


@pytest.fixture
def sshfs(tmp_path: Path, worker_id: str) -> Iterator[Sshfs]:
    if not Path("/dev/fuse").exists():
        need("fuse", "/dev/fuse is missing: this kernel or container has no FUSE")
    tools = install_tools(("sshfs", "fusermount3", "sshd"), "sshfs.sh")
    index = int(worker_id.removeprefix("gw")) if worker_id.startswith("gw") else 0
    env = os.environ | {
        "GPUFLEET_SSHFS_STATE": f"/tmp/gpufleet-test-sshfs-{worker_id}",
        "GPUFLEET_SSHFS_SSHD_PORT": str(12422 + index),
    }
    started = subprocess.run(["bash", str(SCRIPT), "start"], capture_output=True, text=True, env=env, check=False)
    if started.returncode != 0:
        need("sshfs", f"the private sshd did not start: {(started.stderr or started.stdout).strip()[-300:]}")
    port, key, known_hosts, user = started.stdout.strip().splitlines()[-1].split()
    sshd_pid = int(Path(env["GPUFLEET_SSHFS_STATE"], "sshd.pid").read_text())
    export, mountpoint = tmp_path / "export", tmp_path / "mnt"
    export.mkdir()
    mountpoint.mkdir()
    (export / "data").write_text("model weights\n")
    options = f"IdentityFile={key},UserKnownHostsFile={known_hosts},StrictHostKeyChecking=yes,BatchMode=yes"
    daemon = subprocess.Popen(
        [tools["sshfs"], "-f", "-p", port, "-o", options, f"{user}@127.0.0.1:{export}", str(mountpoint)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    mounts = Sshfs(mountpoint, daemon, sshd_pid)
    try:
        deadline = time.monotonic() + 20
        while str(mountpoint) not in read_mountinfo(Path("/proc/self/mountinfo").read_text()):
            if daemon.poll() is not None or time.monotonic() > deadline:
                error = daemon.stderr.read().decode() if daemon.stderr and daemon.poll() is not None else ""
                need("fuse", f"sshfs did not mount: {error.strip()[-300:] or 'no mount within 20 s'}")
            time.sleep(0.05)
        yield mounts
    finally:
        _signal([daemon.pid, *mounts.server_processes()], signal.SIGCONT)
        subprocess.run([tools["fusermount3"], "-u", "-z", str(mountpoint)], capture_output=True, check=False)
        daemon.terminate()
        try:
            daemon.wait(timeout=10)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
        subprocess.run(["bash", str(SCRIPT), "stop"], capture_output=True, env=env, check=False)


def test_a_stopped_server_is_hung_within_the_timeout_and_never_piles_up_children(sshfs: Sshfs) -> None:
    prober = MountProber(TIMEOUT_S, fresh_s=0)
    path = str(sshfs.mountpoint)
    healthy = prober.probe(path)
    assert healthy.state == "ok"
    assert healthy.size_bytes
    assert healthy.size_bytes > 0
    server = sshfs.server_processes()
    assert server, "no sshd session serves the mount"
    _signal(server, signal.SIGSTOP)
    try:
        started = time.monotonic()
        hung = prober.probe(path)
        took = time.monotonic() - started
        assert hung.state == "hung"
        assert hung.message == f"no answer within {TIMEOUT_S:g} s"
        assert took < TIMEOUT_S + 5  # the timeout, then a short wait for the killed child: never blocked
        stuck = prober.outstanding()
        # The child waits for the server in the kernel, past SIGKILL: it is kept, not waited on.
        assert stuck in (0, 1)
        for _ in range(3):
            again = prober.probe(path)
            assert again.state == "hung"
        assert prober.outstanding() <= 1  # one stuck child per mount at most, however often it is probed
    finally:
        _signal(server, signal.SIGCONT)
    deadline = time.monotonic() + 20
    while (result := prober.probe(path)).state != "ok":
        assert time.monotonic() < deadline, result
        time.sleep(0.1)
    assert prober.outstanding() == 0


def test_a_stopped_fuse_daemon_fails_the_required_mount_check_and_the_round_ends(sshfs: Sshfs, tmp_path: Path) -> None:
    path = str(sshfs.mountpoint)
    storage = HostStorage(MountProber(TIMEOUT_S, fresh_s=0))
    judge = StorageChecks(storage, required=[path], shared_mounts=[path])
    checks = HostChecks(tmp_path / "no-checks.d", mounts=[path], storage=judge)
    collector = StorageCollector(storage, shared_mounts=[path], required=[path])
    (ok,) = checks.run()
    assert ok.status == 0
    assert ok.message.startswith(f"{path} is mounted (fuse.sshfs from ")
    first = collector.collect()
    assert first.entities[f"fs:{path}"]["fs_state"] == 0
    assert first.mounts[0].fstype == "fuse.sshfs"
    assert first.mounts[0].required
    os.kill(sshfs.sshfs.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        (failed,) = checks.run()
        values = collector.collect().entities[f"fs:{path}"]
        assert time.monotonic() - started < 2 * TIMEOUT_S + 10
    finally:
        os.kill(sshfs.sshfs.pid, signal.SIGCONT)
    assert failed.name == f"mount:{path.strip('/').replace('/', '-')}"
    assert failed.status == 1
    assert failed.message.startswith(f"{path}: no answer")
    assert failed.message.endswith("(hung FUSE daemon?)")
    assert values["fs_state"] == 1
    assert "fs_size_bytes" not in values
