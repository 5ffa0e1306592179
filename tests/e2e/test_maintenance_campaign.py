"""Issue 24's must-show for maintenance campaigns, with real processes (a head, `gpufleet sim`, the CLI):
a campaign syncing an image revision over 16 busy nodes with --max-unavailable 2 never has more than 2
out at once, kills no running job, stops with 15 nodes untouched when its canary fails, and after the
fix, resumed and carried across a head restart, ends with every node on the new revision and serving.

The canary fails for real: revision 2 of the image turns /home into a link, and rsync cannot replace a
node's /home, which holds its users' files (an excluded path: a sync never touches it): exit status 23.
The nodes are directories standing in for nodes (image_sync_local_root), as in the image sync tests.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from filelock import FileLock

from tests.e2e.campaign_checks import ENDED_BADLY, OutWatch, check_never_over, count_steps, steps, wait_task
from tests.e2e.conftest import Head, run_cli, start_sim, stop, wait_for
from tests.provisioning.images_helpers import make_tree, tarball

pytestmark = [pytest.mark.e2e, pytest.mark.rsync, pytest.mark.requires_tool("rsync", "tar")]
NODES = 16
NAMES = [f"sim{i:03d}" for i in range(1, NODES + 1)]
CAMPAIGN = "/api/v1/maintenance/campaigns/image-r2"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Head, Path]]:
    tmp = tmp_path_factory.mktemp("maintenance")
    env = {
        "GPUFLEET_MAINTENANCE_INTERVAL_S": "0.2",
        "GPUFLEET_IMAGE_IMPORT_DIRS": json.dumps([str(tmp)]),
        "GPUFLEET_IMAGE_SYNC_LOCAL_ROOT": str(tmp / "nodes"),
        # Requeueable jobs land again on nodes the campaign has yet to take, and are requeued again there.
        "GPUFLEET_JOB_MAX_REQUEUES": "100",
    }
    # Under the heavy lock (tests.conftest.heavy, which is per test): a head, 16 simulated nodes and rsync
    # would starve the Slurm tests' slurmctld and the 200-node join storm beside them.
    with FileLock(str(Path("/tmp") / "gpufleet-test-heavy-e2e.lock")):
        head = Head(tmp, env=env).start()
        settings = {"software_image": "base", "sync_target": f"{tmp}/nodes/{{node}}"}
        head.api("POST", "/api/v1/categories", json={"name": "gpu", "settings": settings})
        head.api("POST", "/api/v1/nodes", json={"names": ["sim[001-016]"], "category": "gpu"})
        sim = start_sim(tmp, head.url, head.join_token(NODES), NODES)
        try:
            wait_for(lambda: [n["state"] for n in head.nodes()].count("up") == NODES, 60, 0.25)
            yield head, tmp
        finally:
            stop(sim)
            head.kill(signal.SIGTERM)


def test_a_campaign_over_busy_nodes_stops_at_its_canary_then_finishes_across_a_restart(
    cluster: tuple[Head, Path],
) -> None:
    head, tmp = cluster
    image = tmp / "head" / "images" / "base"
    tree = make_tree(tmp / "tree")
    (tree / "home").mkdir()
    (tree / "etc" / "gpufleet-release").write_text("r1\n")
    imported = {"name": "base", "tarball": str(tarball(tree, tmp / "b.tar"))}
    wait_task(head, head.api("POST", "/api/v1/images", json=imported))
    wait_task(head, head.api("POST", "/api/v1/sync", json={"category": "gpu"}))  # every node on revision 1
    for name in NAMES:  # each node's users' files, on its /home (which no sync touches)
        notes = tmp / "nodes" / name / "home" / "alice" / "notes"
        notes.parent.mkdir(parents=True)
        notes.write_text(f"alice's notes on {name}\n")

    # 16 busy nodes: a whole-node job on each, half of them short and not requeueable, half long and requeueable.
    head.api("POST", "/api/v1/users", json={"username": "alice"})
    jobs = {"short": [], "long": []}
    for i in range(NODES):
        long = i % 2 == 1
        spec = {"user": "alice", "gpus_per_node": 8, "argv": ["sleep", "600" if long else str(4 + i)], "requeue": long}
        jobs["long" if long else "short"].append(head.api("POST", "/api/v1/jobs", json=spec)["id"])
    wait_for(lambda: [j["state"] for j in head.api("GET", "/api/v1/jobs")].count("running") == NODES, 30, 0.25)

    # Revision 2, made by an admin's edit of the tree: /home becomes a link. The canary's sync fails on it.
    (image / "home").rmdir()
    (image / "home").symlink_to("/srv/home")
    (image / "etc" / "gpufleet-release").write_text("r2\n")
    with OutWatch(head) as watch:
        created = run_cli(
            tmp,
            "maintenance",
            "create",
            "image-r2",
            "--category",
            "gpu",
            "--action",
            "sync-image:base",
            "--max-unavailable",
            "2",
            "--wait-jobs",
            "2s",
            "-o",
            "json",
            server=head.url,
        )
        assert created.returncode == 0, created.stderr
        canary = next(n["node"] for n in json.loads(created.stdout)["nodes"] if n["canary"])
        wait_for(lambda: head.api("GET", CAMPAIGN)["state"] == "stopped", 60, 0.2)
        stopped = head.api("GET", CAMPAIGN)
        assert stopped["reason"].startswith(f"the canary {canary} failed"), stopped["reason"]
        failed = next(n for n in stopped["nodes"] if n["node"] == canary)
        assert (failed["phase"], "rsync exited with status 23" in failed["detail"]) == ("failed", True), failed
        untouched = [n for n in stopped["nodes"] if n["node"] != canary]
        assert [n["phase"] for n in untouched] == ["pending"] * (NODES - 1)
        assert watch.ever_out == {canary}  # the other 15 never left service
        for name in NAMES:
            if name != canary:
                assert (tmp / "nodes" / name / "etc" / "gpufleet-release").read_text() == "r1\n"

        # The fix, revision 3: /home a directory again. Resumed, and the head restarted on the way.
        (image / "home").unlink()
        (image / "home").mkdir()
        (image / "etc" / "gpufleet-release").write_text("r3\n")
        resumed = run_cli(tmp, "maintenance", "resume", "image-r2", server=head.url)
        assert resumed.returncode == 0, resumed.stderr
        wait_for(lambda: head.api("GET", CAMPAIGN)["phases"].get("done", 0) >= 4, 60, 0.2)
        midway = head.api("GET", CAMPAIGN)
        assert (midway["state"], midway["phases"].get("done", 0) < NODES) == ("running", True)
        head.kill(signal.SIGTERM)
        head.start()
        wait_for(lambda: head.api("GET", CAMPAIGN)["state"] == "completed", 120, 0.25)
        assert watch.looks > 10  # it did watch

    done = json.loads(run_cli(tmp, "maintenance", "show", "image-r2", "-o", "json", server=head.url).stdout)
    assert done["actions"] == ["sync-image:base@3"]
    assert [n["phase"] for n in done["nodes"]] == ["done"] * NODES
    assert {n["results"]["0"]["revision"] for n in done["nodes"]} == {3}
    assert head.api("GET", "/api/v1/images/base")["revision"] == 3
    for name in NAMES:
        assert (tmp / "nodes" / name / "etc" / "gpufleet-release").read_text() == "r3\n"
        assert (tmp / "nodes" / name / "home" / "alice" / "notes").read_text() == f"alice's notes on {name}\n"
    nodes = {n["name"]: n for n in head.nodes()}
    assert all(nodes[n]["state"] == "up" and nodes[n]["drain_reason"] is None for n in NAMES)
    assert all(head.api("GET", f"/api/v1/nodes/{n}")["hold"] is None for n in NAMES)

    # Never more than 2 out: as the watch saw the nodes, and at every one of the campaign's own changes.
    assert watch.most <= 2, watch.most
    records = steps(head, "image-r2")
    assert check_never_over(records, 2) == set()
    assert count_steps(records, "maintenance.take").total() == NODES + 1  # the canary twice

    # No running job killed: the short ones completed, the long ones ran on or were requeued.
    states = {j["id"]: j for j in head.api("GET", "/api/v1/jobs", params={"limit": 100})}
    assert all(states[j]["state"] == "completed" for j in jobs["short"]), [states[j] for j in jobs["short"]]
    assert not [states[j] for j in jobs["long"] if states[j]["state"] in ENDED_BADLY]
    requeued = [j for j in jobs["long"] if states[j]["run"] > 1]  # a long job's node can only be had so
    assert requeued, [states[j] for j in jobs["long"]]
    print(f"{len(requeued)} requeueable job(s) requeued; {watch.looks} looks at the nodes, at most {watch.most} out")
