"""Images and image sync over HTTP: tasks with 202, a dry run's argv, history, refusals, audit
records, the Images page; sync, its dry run and the drift report against the real rsync."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner, Result

from gpufleet.cli.app import app as cli_app
from gpufleet.cli.state import CliState
from gpufleet.core.clock import to_datetime
from gpufleet.core.db import transaction
from gpufleet.core.errors import InvalidInput
from gpufleet.inventory import categories
from gpufleet.inventory import service as inventory
from gpufleet.inventory.schemas import NodeSettings
from gpufleet.provisioning import images
from gpufleet.provisioning.image_models import Image
from gpufleet.provisioning.runner import CommandFailed, Completed, ProcessRunner, Step
from tests.api.dashboard_helpers import logged_in
from tests.conftest import cli_through
from tests.provisioning.images_helpers import make_tree, tarball


def local_root(client: TestClient, root: Path) -> None:
    """The head's image_sync_local_root (the client fixture's settings have none)."""
    ctx = client.app.state.ctx  # type: ignore[attr-defined]
    ctx.settings = ctx.settings.model_copy(update={"image_sync_local_root": root})


def finished(client: TestClient, answer: Any) -> dict[str, Any]:
    """A 202's task, waited for to its end."""
    assert answer.status_code == 202, answer.text
    task_id = answer.json()["id"]
    client.app.state.ctx.tasks.wait(task_id, 60)  # type: ignore[attr-defined]
    task: dict[str, Any] = client.get(f"/api/v1/tasks/{task_id}").json()
    return task


class FakeApt:
    """chroot + apt faked: the install puts a file in the image (the real one: test_images_debootstrap)."""

    def __init__(self) -> None:
        self.real = ProcessRunner()

    def run(self, step: Step, *, on_line: Any = None, ok_codes: frozenset[int] = frozenset({0})) -> Completed:
        if step.argv[0] != "chroot":
            return self.real.run(step, on_line=on_line, ok_codes=ok_codes)
        if "install" in step.argv:
            (Path(step.argv[1]) / "usr" / "bin").mkdir(exist_ok=True)
            (Path(step.argv[1]) / "usr" / "bin" / step.argv[-1]).write_text("#!/bin/sh\n")
        return Completed(step.argv, 0, "", "", 0.0)


def test_images_over_http(client: TestClient, tmp_path: Path) -> None:
    tar = tarball(make_tree(tmp_path / "tree"), tmp_path / "base.tar")
    images_dir = tmp_path / "images"  # data_dir/images: images_dir is not set

    plan = client.post("/api/v1/images/plans", json={"name": "base", "tarball": str(tar)})
    assert plan.status_code == 200, plan.text
    assert plan.json()["argv"][0][:3] == ["tar", "--extract", f"--file={tar}"]
    assert client.get("/api/v1/images").json() == []  # a dry run records nothing

    task = finished(client, client.post("/api/v1/images", json={"name": "base", "tarball": str(tar)}))
    assert (task["kind"], task["state"], task["targets"][0]["state"]) == ("image.create", "succeeded", "ok")
    assert (images_dir / "base" / "etc" / "os-release").exists()
    task = finished(client, client.post("/api/v1/images/base/clone", json={"name": "hgx"}))
    assert (task["state"], task["params"]["clone_of"]) == ("succeeded", "base")  # what holds base while it runs

    client.app.state.image_runner = FakeApt()  # type: ignore[attr-defined]
    plan = client.post("/api/v1/images/plans", json={"name": "hgx", "packages": ["hello"]})
    assert plan.json()["steps"][1].endswith(
        f"chroot {images_dir}/hgx apt-get -q -y --no-install-recommends install hello"
    )
    task = finished(client, client.post("/api/v1/images/hgx/install", json={"packages": ["hello"]}))
    assert (task["kind"], task["params"]["packages"], task["state"]) == ("image.install", ["hello"], "succeeded"), task
    assert (images_dir / "hgx" / "usr" / "bin" / "hello").exists()

    listed = {i["name"]: i for i in client.get("/api/v1/images").json()}
    assert (listed["base"]["revision"], listed["hgx"]["revision"]) == (1, 2)
    assert listed["hgx"]["files"] == listed["base"]["files"] + 2  # usr/bin and hello
    shown = client.get("/api/v1/images/hgx").json()
    assert [(r["number"], r["change"]) for r in shown["history"]] == [
        (2, "installed hello"),
        (1, "created from clone of base"),
    ]
    assert shown["history"][0]["task_id"] == task["id"]
    assert shown["history"][0]["actor"].startswith("token:")

    refusals = [
        ("POST", "/api/v1/images", {"name": "base", "tarball": str(tar)}, 409),
        ("POST", "/api/v1/images", {"name": "x", "debootstrap": "bookworm", "tarball": str(tar)}, 400),
        ("POST", "/api/v1/images", {"name": "x", "tarball": "relative.tar"}, 400),
        ("POST", "/api/v1/images/nosuch/install", {"packages": ["hello"]}, 404),
        ("POST", "/api/v1/images/hgx/install", {"packages": ["--allow-unauthenticated"]}, 400),
        ("POST", "/api/v1/images", {"name": "x", "debootstrap": "bookworm", "mirror": "http://evil.example/d"}, 400),
        ("POST", "/api/v1/sync", {"nodes": "nosuch[1-2]", "target": "/srv/{node}"}, 404),
        ("POST", "/api/v1/sync", {"category": "nosuch"}, 404),  # as an Ansible run says
    ]
    for method, path, body, status in refusals:
        assert client.request(method, path, json=body).status_code == status, (path, body)

    with transaction(client.app.state.ctx.sessions) as s:  # type: ignore[attr-defined]
        categories.create_category(s, client.app.state.ctx.clock, "gpu", settings={"software_image": "hgx"})  # type: ignore[attr-defined]
    assert client.get("/api/v1/images/hgx").json()["used_by"] == ["category gpu"]
    assert client.delete("/api/v1/images/hgx").status_code == 409
    assert client.delete("/api/v1/images/base").status_code == 204
    assert not (images_dir / "base").exists()
    assert [i["name"] for i in client.get("/api/v1/images").json()] == ["hgx"]

    audit = client.get("/api/v1/audit", params={"limit": 100}).json()
    actions = [(r["action"], r["result"]) for r in audit]
    for action, status in (
        ("images.create_image", 202),
        ("images.clone_image", 202),
        ("images.install_packages", 202),
        ("images.remove_image", 204),
        ("images.remove_image", 409),
    ):
        assert (action, status) in actions
    targets = [r["target"] for r in audit if r["action"] == "images.install_packages" and r["result"] == 202]
    assert targets == [f"task {task['id']}: image hgx: install hello"]

    page = logged_in(client, "operator", "olga").get("/images")
    assert page.status_code == 200
    assert 'id="image-hgx" data-image="hgx" data-revision="2"' in page.text
    assert "installed hello" in page.text
    assert "category gpu" in page.text
    assert 'href="/images"' in page.text
    assert logged_in(client, "viewer", "vera").get("/images").status_code == 403


@pytest.mark.rsync
@pytest.mark.requires_tool("rsync")
def test_sync_dry_run_and_drift_over_http(client: TestClient, tmp_path: Path) -> None:
    tar = tarball(make_tree(tmp_path / "tree"), tmp_path / "base.tar")
    finished(client, client.post("/api/v1/images", json={"name": "base", "tarball": str(tar)}))
    ctx = client.app.state.ctx  # type: ignore[attr-defined]
    nodes_dir = tmp_path / "nodes"
    with transaction(ctx.sessions) as s:
        categories.create_category(
            s, ctx.clock, "cpu", settings={"software_image": "base", "sync_target": f"{nodes_dir}/{{node}}"}
        )
        categories.create_category(s, ctx.clock, "empty")
        inventory.add_nodes(s, ctx.clock, ["cpu[1-3]"], NodeSettings(category="cpu"))
    refused = client.post("/api/v1/sync", json={"category": "cpu", "dry_run": True})
    assert (refused.status_code, "image_sync_local_root" in refused.json()["detail"]) == (400, True)
    local_root(client, tmp_path)
    assert client.post("/api/v1/sync", json={"category": "empty"}).status_code == 400

    dry = finished(client, client.post("/api/v1/sync", json={"category": "cpu", "dry_run": True, "limit": 2}))
    assert (dry["kind"], dry["params"]["limit"], dry["state"]) == ("image.sync-dry-run", 2, "succeeded")
    changes = dry["targets"][0]["data"]["changes"]
    assert ["create", "etc/os-release"] in changes
    assert not nodes_dir.exists()

    done = finished(client, client.post("/api/v1/sync", json={"nodes": "cpu[1-3]"}))
    assert [t["state"] for t in done["targets"]] == ["ok", "ok", "ok"]
    assert done["params"]["limit"] == 8  # the image_sync_limit setting's default
    assert (nodes_dir / "cpu3" / "usr" / "lib" / "file19.txt").exists()

    assert client.get("/api/v1/nodes/cpu1/drift").json()["in_line"] is True
    (nodes_dir / "cpu1" / "etc" / "os-release").write_text("changed on the node\n")
    drift = client.get("/api/v1/nodes/cpu1/drift").json()
    assert (drift["differs"], drift["image"], drift["revision"]) == (["etc/os-release"], "base", 1)
    assert client.get("/api/v1/nodes/nosuch/drift").status_code == 404
    bad = client.post("/api/v1/sync", json={"nodes": "cpu1", "target": str(tmp_path / "images" / "x")})
    assert bad.status_code == 400
    assert "overlaps" in bad.json()["detail"]
    etc = client.post("/api/v1/sync", json={"nodes": "cpu1", "target": "/etc/"})
    assert (etc.status_code, "is not inside" in etc.json()["detail"]) == (400, True)


@pytest.mark.one_database  # HTTP translation: one backend
def test_drift_overrides_need_images_write_and_a_failed_rsync_is_502(client: TestClient, tmp_path: Path) -> None:
    ctx = client.app.state.ctx  # type: ignore[attr-defined]
    runner = Refusing()
    client.app.state.image_runner = runner  # type: ignore[attr-defined]
    with transaction(ctx.sessions) as s:
        s.add(Image(name="far", path=str(tmp_path / "far"), source="test", state="ready",
                    created_at=to_datetime(ctx.clock.now()), created_by="test", revision=1))  # fmt: skip
        categories.create_category(s, ctx.clock, "far", settings={"software_image": "far", "sync_target": "{node}:/"})
        inventory.add_nodes(s, ctx.clock, ["far1"], NodeSettings(category="far"))
    client.post("/api/v1/users", json={"username": "reader", "role": "admin"})
    read = client.post("/api/v1/tokens/user", json={"user": "reader", "scope": "read"}).json()["token"]
    as_reader = {"Authorization": f"Bearer {read}"}

    down = client.get("/api/v1/nodes/far1/drift", headers=as_reader)  # images:read is enough for its own
    assert (down.status_code, down.json()["detail"]) == (502, "rsync exited with status 255: connection refused")
    assert runner.timeouts == [120.0]  # image_drift_timeout_s, not the sync's hour: it runs in the request
    for query in ({"target": "/etc/"}, {"image": "far"}):
        assert client.get("/api/v1/nodes/far1/drift", params=query, headers=as_reader).status_code == 403
    assert client.get("/api/v1/nodes/far1/drift", params={"target": "/etc/"}).status_code == 400  # no local root
    assert len(runner.timeouts) == 1


class Refusing:
    """A node that cannot be reached: every rsync fails as ssh would make it."""

    def __init__(self) -> None:
        self.timeouts: list[float] = []

    def run(self, step: Step, *, on_line: Any = None, ok_codes: frozenset[int] = frozenset({0})) -> Completed:
        self.timeouts.append(step.timeout_s)
        raise CommandFailed("rsync exited with status 255: connection refused")


@pytest.mark.one_database  # HTTP translation: one backend
def test_a_task_that_cannot_start_leaves_nothing_marked(
    client: TestClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx = client.app.state.ctx  # type: ignore[attr-defined]
    tar = tarball(make_tree(tmp_path / "tree"), tmp_path / "base.tar")
    with transaction(ctx.sessions) as s:
        s.add(Image(name="old", path=str(tmp_path / "old"), source="test", state="ready",
                    created_at=to_datetime(ctx.clock.now()), created_by="test", revision=1))  # fmt: skip
        categories.create_category(s, ctx.clock, "st", settings={"software_image": "old", "sync_target": "{node}:/"})
        inventory.add_nodes(s, ctx.clock, ["st1"], NodeSettings(category="st"))

    def no_thread(*_: Any) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(ctx.tasks, "start", no_thread)
    for path, body in (
        ("/api/v1/images", {"name": "new", "tarball": str(tar)}),
        ("/api/v1/images/old/clone", {"name": "copy"}),
        ("/api/v1/images/old/install", {"packages": ["hello"]}),
        ("/api/v1/sync", {"nodes": "st1"}),
    ):
        with pytest.raises(RuntimeError, match="new thread"):
            client.post(path, json=body)
    listed = client.get("/api/v1/images").json()
    assert [(i["name"], i["state"]) for i in listed] == [("old", "ready")]
    tasks = client.get("/api/v1/tasks").json()
    assert len(tasks) == 4
    assert {t["state"] for t in tasks} == {"failed"}
    assert all(t["summary"] == "could not start: can't start new thread" for t in tasks)
    with transaction(ctx.sessions) as s:
        assert images.readers(s, "old") == []  # the failed sync and clone hold it no longer


def cli(*args: str) -> Result:
    return CliRunner().invoke(cli_app, list(args), obj=CliState())


@pytest.mark.rsync
@pytest.mark.requires_tool("rsync")
@pytest.mark.one_database  # the CLI over the API: one backend is enough
def test_the_image_commands(client: TestClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cli_through(client, monkeypatch)
    tar = tarball(make_tree(tmp_path / "tree"), tmp_path / "base.tar")
    dry = cli("image", "create", "base", "--tarball", str(tar), "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert dry.stdout.startswith(f"tar --extract --file={tar} --directory={tmp_path}/images/.base.building ")
    assert "dry run: nothing was run" in dry.stdout
    made = cli("image", "create", "base", "--tarball", str(tar))
    assert made.exit_code == 0, made.output
    assert "image base: revision 1" in made.stdout
    listed = json.loads(cli("image", "list", "-o", "json").stdout)
    assert [(i["name"], i["revision"], i["state"]) for i in listed] == [("base", 1, "ready")]
    history = json.loads(cli("image", "history", "base", "-o", "json").stdout)
    assert [r["change"] for r in history] == [f"created from tarball {tar}"]
    install = cli("image", "install", "base", "curl", "jq", "--dry-run")
    assert f"chroot {tmp_path}/images/base apt-get -q -y --no-install-recommends install curl jq" in install.stdout

    ctx = client.app.state.ctx  # type: ignore[attr-defined]
    local_root(client, tmp_path / "nodes")
    with transaction(ctx.sessions) as s:
        inventory.add_nodes(s, ctx.clock, ["cli[1-2]"], NodeSettings())
    target = f"{tmp_path}/nodes/{{node}}"
    preview = cli("image", "sync", "cli[1-2]", "--image", "base", "--target", target, "--dry-run")
    assert preview.exit_code == 0, preview.output
    assert "create  etc/os-release" in preview.stdout
    assert not (tmp_path / "nodes").exists()
    done = cli("image", "sync", "cli[1-2]", "--image", "base", "--target", target, "--limit", "1", "-o", "json")
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["params"]["limit"] == 1
    drift = cli("image", "drift", "cli1", "--image", "base", "--target", target)
    assert (drift.exit_code, drift.stdout.splitlines()[-1].strip()) == (0, "in line with the image")
    (tmp_path / "nodes" / "cli1" / "usr" / "lib" / "file00.txt").unlink()
    drift = cli("image", "drift", "cli1", "--image", "base", "--target", target)
    assert drift.exit_code == 1
    assert "missing    usr/lib/file00.txt" in drift.stdout
    both = cli("image", "sync", "cli1", "--category", "x")
    assert isinstance(both.exception, InvalidInput)
    removed = cli("image", "remove", "base")
    assert (removed.exit_code, removed.stdout) == (0, "image base removed\n")
