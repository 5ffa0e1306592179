"""The datasets issue's must-show, with real processes (a head, `gpufleet sim` with two nodes, the CLI): a
dataset registered with `gpufleet dataset register` is staged into a node's cache by the first job that
names it, and the next job goes to that node (data locality, even where pack would choose the other) and
reuses the copy instead of copying it again; a member of another project is refused it at submission."""

import json
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpufleet.protocol.artifacts import digest
from tests.e2e.conftest import Head, cli_json, run_cli, start_sim, stop, wait_for

# One worker runs the whole module: its module-scoped cluster is then started once, not on each worker.
pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("test_datasets")]
NODES = 2


@dataclass
class Cluster:
    head: Head
    tmp: Path
    alice: str  # each user's own API token
    bob: str

    def cache(self, node: str) -> Path:
        return self.tmp / "sim" / "nodes" / f"{node}.cache"  # where `gpufleet sim` stages for real


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("datasets")
    head = Head(tmp).start()
    sim = start_sim(tmp, head.url, head.join_token(NODES), NODES)
    try:
        wait_for(lambda: sum(n["state"] == "up" and n["gpu_count"] == 8 for n in head.nodes()) == NODES, 60)
        tokens = {}
        for user, project in (("alice", "alpha"), ("bob", "beta")):
            head.api("POST", "/api/v1/users", json={"username": user})
            head.api("POST", "/api/v1/projects", json={"name": project})
            head.api("POST", f"/api/v1/projects/{project}/members", json={"user": user})
            tokens[user] = head.api("POST", "/api/v1/tokens/user", json={"user": user})["token"]
        yield Cluster(head, tmp, tokens["alice"], tokens["bob"])
    finally:
        stop(sim)
        head.kill(signal.SIGTERM)


def _job(head: Head, job_id: int) -> dict[str, Any]:
    found: dict[str, Any] = head.api("GET", f"/api/v1/jobs/{job_id}")
    return found


def _submit(c: Cluster, token: str, *args: str) -> int:
    done = run_cli(c.tmp, "job", "submit", "-o", "json", *args, server=c.head.url, token=token)
    assert done.returncode == 0, done.stderr
    job_id: int = json.loads(done.stdout)["id"]
    return job_id


def _stderr(c: Cluster, job_id: int) -> str:
    """The job's stderr as the head keeps it (what `gpufleet job logs` prints to stderr)."""
    page = c.head.api("GET", f"/api/v1/jobs/{job_id}/output")
    return "".join(chunk["data"] for chunk in page["chunks"] if chunk["stream"] == "stderr")


def _index(c: Cluster, node: str) -> dict[str, dict[str, Any]]:
    return {e["sha256"]: e for e in json.loads((c.cache(node) / "index.json").read_text())}


def test_a_dataset_staged_once_is_reused_by_the_next_job_on_that_node(cluster: Cluster) -> None:
    c = cluster
    data = c.tmp / "shared" / "cifar"
    for split, rows in (("train", 500), ("test", 100)):
        (data / split).mkdir(parents=True)
        (data / split / "rows.csv").write_text("".join(f"{i},{i % 10}\n" for i in range(rows)))
    sha, size = digest(data)
    registered = cli_json(
        c.tmp, c.head.url, "dataset", "register", "cifar:1", str(data), "--project", "alpha", "--licence", "mit"
    )
    assert (registered["ref"], registered["sha256"], registered["size_bytes"]) == ("cifar:1", sha, size)
    listed = run_cli(c.tmp, "dataset", "list", server=c.head.url)
    assert listed.returncode == 0, listed.stderr
    assert "cifar:1" in listed.stdout

    # A filler takes half of one node first, so the dataset's first job (a whole node) goes to the other.
    filler = _submit(c, c.alice, "--gpus-per-node", "4", "--", "sleep", "300")
    try:
        wait_for(lambda: _job(c.head, filler)["state"] == "running", 30, interval=0.2)
        (other,) = _job(c.head, filler)["allocation"]
        first = _submit(c, c.alice, "--gpus-per-node", "8", "--dataset", "cifar", "--", "sleep", "1")
        wait_for(lambda: _job(c.head, first)["state"] in ("completed", "failed", "cancelled"), 60, interval=0.2)
        assert _job(c.head, first)["state"] == "completed", _job(c.head, first)
        (holder,) = _job(c.head, first)["allocation"]
        assert holder != other
        wait_for(lambda: "cifar:1 copied to the node cache" in _stderr(c, first), 30, interval=0.3)
        staged = _index(c, holder)[sha]
        assert (staged["uses"], staged["size_bytes"]) == (1, size)
        assert (c.cache(holder) / sha / "tree" / "train" / "rows.csv").read_bytes() == (
            data / "train" / "rows.csv"
        ).read_bytes()
        wait_for(lambda: cli_json(c.tmp, c.head.url, "dataset", "show", "cifar:1")["nodes"] == [holder], 30)

        # Pack would put a one-GPU job on the fuller node (the filler's); the cache draws it to the holder.
        second = _submit(c, c.alice, "--dataset", "cifar:1", "--", "sleep", "1")
        control = c.head.api("POST", "/api/v1/jobs", json={"user": "alice", "argv": ["sleep", "1"]})["id"]
        for job_id in (second, control):
            wait_for(lambda j=job_id: _job(c.head, j)["state"] in ("completed", "failed"), 60, interval=0.2)
        done = _job(c.head, second)
        assert done["state"] == "completed", done
        assert set(done["allocation"]) == {holder}
        assert set(_job(c.head, control)["allocation"]) == {other}  # the same job without the dataset
        wait_for(lambda: "cifar:1" in _stderr(c, second), 30, interval=0.3)
        assert "gpufleet: dataset cifar:1 reused from the node cache" in _stderr(c, second)
        assert "copied" not in _stderr(c, second)
        reused = _index(c, holder)[sha]
        assert reused["uses"] == 2
        assert reused["copied_at"] == staged["copied_at"]  # not copied again
        assert reused["last_used_at"] > staged["last_used_at"]
        assert not c.cache(other).exists() or sha not in _index(c, other)
    finally:
        run_cli(c.tmp, "job", "cancel", str(filler), server=c.head.url)


def test_a_member_of_another_project_is_refused_the_dataset(cluster: Cluster) -> None:
    c = cluster
    data = c.tmp / "shared" / "private.bin"
    data.parent.mkdir(parents=True, exist_ok=True)
    data.write_bytes(b"alpha's data\n" * 100)
    registered = run_cli(c.tmp, "dataset", "register", "private:1", str(data), "--project", "alpha", server=c.head.url)
    assert registered.returncode == 0, registered.stderr
    before = [j["id"] for j in c.head.api("GET", "/api/v1/jobs")]

    refused = run_cli(
        c.tmp, "job", "submit", "--project", "beta", "--dataset", "private", "--", "sleep", "1",
        server=c.head.url, token=c.bob,
    )  # fmt: skip
    assert refused.returncode != 0
    assert "dataset private:1 belongs to project alpha" in refused.stderr
    assert "project beta may not use it" in refused.stderr
    assert "Traceback" not in refused.stderr
    # Nothing was queued for it.
    assert [j["id"] for j in c.head.api("GET", "/api/v1/jobs")] == before
    assert c.head.api("GET", "/api/v1/jobs", params={"user": "bob"}) == []

    # Only alpha's admins may change the registry; bob cannot just register it again for beta.
    again = run_cli(c.tmp, "dataset", "register", "private:2", str(data), "--project", "beta", server=c.head.url,
                    token=c.bob)  # fmt: skip
    assert again.returncode != 0
    # Alice, in alpha, may use it.
    mine = _submit(c, c.alice, "--dataset", "private", "--", "sleep", "1")
    wait_for(lambda: _job(c.head, mine)["state"] in ("completed", "failed"), 60, interval=0.2)
    assert _job(c.head, mine)["state"] == "completed", _job(c.head, mine)
