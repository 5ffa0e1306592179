"""Image sync: rsync's argv for each kind of target, targets checked before anything runs, rsync's
itemized output and stats parsed (recorded from rsync 3.5.0), and which image goes where."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.core.clock import FakeClock, to_datetime
from gpufleet.core.config import load_settings
from gpufleet.core.db import transaction
from gpufleet.core.errors import Conflict, InvalidInput
from gpufleet.inventory import categories
from gpufleet.inventory import service as inventory
from gpufleet.inventory.schemas import NodeSettings
from gpufleet.provisioning import images, networks, sync
from gpufleet.provisioning.image_models import Image
from gpufleet.provisioning.networks import NetworkSpec
from gpufleet.provisioning.runner import Completed, Step
from gpufleet.provisioning.sync import Change, SyncConfig, Target
from tests.provisioning.images_helpers import ACTOR, sqlite_sessions

__all__ = ["sqlite_sessions"]

# `rsync -aHAX --numeric-ids --delete --stats -n -i --out-format='%i %n'` (rsync 3.5.0) after a
# file grew, one was added, one deleted on the image, one only touched and a directory's mode changed.
RECORDED = """\
*deleting   extra
*deleting   etc/a
>f+++++++++ new
>f.s....... etc/b
>f..t...... etc/hl
.d...p..... usr/
cL+++++++++ usr/lib/libgpu.so
hf+++++++++ usr/lib/libgpu-hard.so
cd+++++++++ opt/new dir/
.d..t...... var/
>f+++++++++ usr/lib/sp ace

Number of files: 10 (reg: 4, dir: 5, link: 1)
Number of created files: 1 (reg: 1)
Number of deleted files: 2 (reg: 2)
Number of regular files transferred: 3
Total file size: 13 bytes
Total transferred file size: 10 bytes
Literal data: 0 bytes
Matched data: 0 bytes
File list size: 0
File list generation time: 0.001 seconds
File list transfer time: 0.000 seconds
Total bytes sent: 1,274
Total bytes received: 53

sent 274 bytes  received 53 bytes  654.00 bytes/sec
total size is 13  speedup is 0.04 (DRY RUN)
"""


def test_itemized_changes_and_stats_are_parsed() -> None:
    changes = sync.parse_changes(RECORDED.splitlines())
    assert [(c.kind, c.path) for c in changes] == [
        ("delete", "extra"),
        ("delete", "etc/a"),
        ("create", "new"),
        ("update", "etc/b"),
        ("update", "etc/hl"),
        ("attrs", "usr/"),
        ("create", "usr/lib/libgpu.so"),
        ("create", "usr/lib/libgpu-hard.so"),
        ("create", "opt/new dir/"),
        ("attrs", "var/"),
        ("create", "usr/lib/sp ace"),
    ]
    assert sync.parse_stats(RECORDED) == {
        "files": 10,
        "created": 1,
        "deleted": 2,
        "transferred": 3,
        "total_bytes": 13,
        "transferred_bytes": 10,
        "literal_bytes": 0,
        "sent_bytes": 1274,
    }
    result = sync.NodeSync("n1", "/t/", changes, sync.parse_stats(RECORDED), 1.5)
    assert result.counts() == {"create": 5, "update": 2, "attrs": 2, "delete": 2}
    assert result.detail(dry_run=True) == "would change 11: 5 new, 2 changed, 2 deleted, 2 attributes"
    data = result.data(image="img", revision=3, dry_run=True)
    assert data["changes"][0] == ["delete", "extra"]
    assert (data["changes_total"], data["revision"], data["deleted"]) == (11, 3, 2)


def test_the_rsync_command_for_each_kind_of_target(tmp_path: Path) -> None:
    settings = load_settings(
        client_file=tmp_path / "none.toml",
        data_dir=tmp_path,
        image_sync_excludes=["/scratch/*"],
        image_sync_ssh_key=tmp_path / "id key",
        image_sync_ssh_port=2222,
        image_sync_ssh_options=["BatchMode=yes", f"UserKnownHostsFile={tmp_path}/known hosts"],
    )
    config = SyncConfig.of(settings)
    source = Path("/srv/images/hgx")
    local = sync.rsync_argv(source, Target("/srv/chroots/node01/", "local"), config, exclude_file=Path("/x.exclude"))
    assert local[:5] == ("rsync", "--archive", "--sparse", "--hard-links", "--acls")
    assert {"--xattrs", "--numeric-ids", "--delete", "--itemize-changes", "--stats"} <= set(local)
    assert "--dry-run" not in local
    assert local[-2:] == ("/srv/images/hgx/", "/srv/chroots/node01/")
    excluded = [a.removeprefix("--exclude=") for a in local if a.startswith("--exclude=")]
    assert excluded[:3] == ["/proc/*", "/sys/*", "/dev/*"]
    assert {"/var/log/*", "/var/lib/gpufleet-agent", "/etc/ssh/ssh_host_*", "/scratch/*"} <= set(excluded)
    assert "--exclude-from=/x.exclude" in local
    assert "--rsh" not in local

    ssh = sync.rsync_argv(source, sync.parse_target("root@10.141.0.2:/"), config, mode="dry-run")
    assert "--dry-run" in ssh
    assert ssh[-1] == "root@10.141.0.2:/"
    remote_shell = ssh[ssh.index("--rsh") + 1]
    # rsync splits -e itself, honouring quotes, as shlex does: the key's space stays in one word
    assert shlex.split(remote_shell) == [
        "ssh", "-p", "2222", "-i", f"{tmp_path}/id key", "-o", "IdentitiesOnly=yes",
        "-o", "BatchMode=yes", "-o", f"UserKnownHostsFile={tmp_path}/known hosts",
    ]  # fmt: skip

    drift = sync.rsync_argv(source, sync.parse_target("rsync://node01/root/"), config, mode="drift")
    assert {"--checksum", "--dry-run", "--perms", "--owner", "--group", "--links"} <= set(drift)
    assert "--archive" not in drift  # without --times: a file only touched is no drift
    assert "--rsh" not in drift
    with pytest.raises(InvalidInput, match="KEY=VALUE"):
        SyncConfig.of(settings.model_copy(update={"image_sync_ssh_options": ["-oProxyCommand x"]}))


def test_sync_targets_are_checked_before_anything_runs(tmp_path: Path) -> None:
    assert sync.render_target("root@{address}:/", node="n1", address="10.0.0.5") == Target("root@10.0.0.5:/", "ssh")
    assert sync.render_target("/srv/nodes/{node}", node="n1", address=None) == Target("/srv/nodes/n1/", "local")
    assert sync.render_target("rsync://{node}/root", node="n1", address=None).kind == "daemon"
    assert sync.parse_target("node01:/").kind == "ssh"
    bad = {
        "root@{address}:/": "has no address",
        "/srv/{hostname}": "unknown field",
        "-e sh:/": "not an absolute path",
        "host:relative": "not an absolute path",
        "host::module/x": "not an absolute path",
        "/srv/../etc": "'..' components",
        "/srv/a\nb": "control characters",
    }
    for template, message in bad.items():
        with pytest.raises(InvalidInput, match=message):
            sync.render_target(template, node="n1", address=None)
    protected = [tmp_path / "data" / "images", tmp_path / "data"]
    for target in ("/", str(tmp_path), str(tmp_path / "data"), str(tmp_path / "data" / "images" / "hgx")):
        with pytest.raises(InvalidInput):
            sync.check_local(sync.parse_target(target), protected, tmp_path)
    sync.check_local(sync.parse_target(str(tmp_path / "nodes" / "n1")), protected, tmp_path)
    sync.check_local(sync.parse_target(str(tmp_path / "data" / "chroots" / "n1")), protected, tmp_path)


def test_local_targets_lie_under_the_configured_root(tmp_path: Path) -> None:
    root = tmp_path / "nodes"
    (root / "n1").mkdir(parents=True)
    os.symlink("/etc", root / "escape")  # a link inside the root that leads to the head's own files
    os.symlink("..", root / "up")
    protected = [tmp_path / "images"]
    sync.check_local(sync.parse_target(str(root / "n1")), protected, root)
    sync.check_local(sync.parse_target(str(root / "new" / "n2")), protected, root)  # made by the sync
    with pytest.raises(InvalidInput, match="refused unless the head's image_sync_local_root"):
        sync.check_local(sync.parse_target(str(root / "n1")), protected, None)
    for target in ("/etc/", str(root), str(root / "escape"), str(root / "escape" / "ssh"), str(root / "up" / "x")):
        with pytest.raises(InvalidInput, match="is not inside"):
            sync.check_local(sync.parse_target(target), protected, root)
    with pytest.raises(InvalidInput, match="image_sync_local_root cannot be /"):
        sync.check_local(sync.parse_target("/etc/"), protected, Path("/"))
    os.symlink(root, tmp_path / "link-to-nodes")  # the root named through a link is the same root
    sync.check_local(sync.parse_target(str(root / "n1")), protected, tmp_path / "link-to-nodes")


class RecordingRunner:
    def __init__(self) -> None:
        self.steps: list[Step] = []

    def run(self, step: Step, *, on_line: object = None, ok_codes: frozenset[int] = frozenset({0})) -> Completed:
        self.steps.append(step)
        return Completed(step.argv, 0, "", "", 0.0)


def test_a_drift_report_runs_under_its_own_short_timeout() -> None:
    runner = RecordingRunner()
    target = sync.parse_target("n1:/")
    for config, timeout in ((SyncConfig(timeout_s=3600), 120.0), (SyncConfig(timeout_s=30), 30.0)):
        sync.drift(runner, config, node="n1", image="i", revision=1, source=Path("/srv/i"), target=target)
        assert runner.steps[-1].timeout_s == timeout
    settings = load_settings(client_file=Path("/nonexistent.toml"), image_drift_timeout_s=45)
    assert SyncConfig.of(settings).drift_timeout_s == 45


def test_which_image_goes_where(sqlite_sessions: sessionmaker[Session], clock: FakeClock) -> None:
    with transaction(sqlite_sessions) as s:
        for name, state in (("plan-img", "ready"), ("plan-busy", "changing")):
            s.add(Image(name=name, path=f"/srv/{name}", source="test", state=state, created_at=to_datetime(0),
                        created_by=ACTOR, revision=1))  # fmt: skip
        categories.create_category(s, clock, "plan-cat", settings={"software_image": "plan-img"})
        nodes = inventory.add_nodes(s, clock, ["plan[1-3]"], NodeSettings(category="plan-cat"))
        networks.assign(s, nodes[:2], networks.create_network(s, NetworkSpec("plan-net", "10.9.0.0/24")))
        inventory.add_nodes(s, clock, ["bare1"], NodeSettings())
    with transaction(sqlite_sessions) as s:
        with_address = inventory.list_nodes(s, ["plan[1-2]"])
        plans = sync.plan(s, with_address)
        srv = Path("/srv")
        assert [(p.node, p.image, p.target) for p in plans] == [
            ("plan1", "plan-img", "root@10.9.0.2:/"),
            ("plan2", "plan-img", "root@10.9.0.3:/"),
        ]
        with pytest.raises(InvalidInput, match="plan3 has no address"):
            sync.plan(s, inventory.list_nodes(s, ["plan[1-3]"]))
        local = sync.plan(s, inventory.list_nodes(s, ["plan[1-3]"]), target="/srv/nodes/{node}", local_root=srv)
        assert [p.target for p in local] == ["/srv/nodes/plan1/", "/srv/nodes/plan2/", "/srv/nodes/plan3/"]
        with pytest.raises(InvalidInput, match="no software_image for bare1"):
            sync.plan(s, inventory.list_nodes(s, ["bare1"]), target="/srv/nodes/{node}", local_root=srv)
        with pytest.raises(InvalidInput, match="would both be written to /srv/one/"):
            sync.plan(s, with_address, target="/srv/one", local_root=srv)
        with pytest.raises(Conflict, match="plan-busy is changing"):
            sync.plan(s, with_address, image="plan-busy")
        with pytest.raises(InvalidInput, match="cannot be /"):
            sync.plan(s, with_address[:1], target="/", local_root=srv)
        with pytest.raises(InvalidInput, match="refused unless"):
            sync.plan(s, with_address[:1], target="/srv/nodes/{node}")
        node = inventory.get_node(s, "plan1")
        node.settings = {"sync_target": "/srv/own/{node}", "software_image": "plan-busy"}
        with pytest.raises(Conflict, match="plan-busy"):
            sync.plan(s, [node], local_root=srv)
        assert images.users(s)["plan-busy"] == ["node plan1"]


def test_changes_kinds_are_what_rsync_itemizes() -> None:
    assert sync.parse_changes([">fcsT...... usr/lib/x", ".f...p..... etc/shadow", "not an item line"]) == [
        Change("update", "usr/lib/x", ">fcsT......"),
        Change("attrs", "etc/shadow", ".f...p....."),
    ]
