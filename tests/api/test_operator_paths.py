"""Paths and addresses operators give the head: an image tarball is read only inside the directories
the admin configured (image_import_dirs, links resolved), a Python prefix is a plain path, and a model
or dataset location is never a path that climbs with '..', a path outside artifact_dirs when that is
set, or a URL every node would fetch from itself or its cloud's metadata service. Each refusal is a
400 that says why and leaves nothing behind."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.provisioning.images_helpers import make_tree, tarball

# One database: path and address checks before any write.
pytestmark = pytest.mark.one_database

SHA = "a" * 64


def _settings(client: TestClient, **update: Any) -> None:
    ctx = client.app.state.ctx  # type: ignore[attr-defined]
    ctx.settings = ctx.settings.model_copy(update=update)


def _nothing_recorded(client: TestClient) -> None:
    assert client.get("/api/v1/images").json() == []
    assert client.get("/api/v1/tasks").json() == []


@pytest.mark.parametrize("route", ["/api/v1/images", "/api/v1/images/plans"])
def test_a_tarball_outside_the_import_directories_is_refused(client: TestClient, tmp_path: Path, route: str) -> None:
    imports = tmp_path / "imports"
    imports.mkdir()
    _settings(client, image_import_dirs=[imports])
    outside = tarball(make_tree(tmp_path / "tree"), tmp_path / "outside.tar")
    (imports / "shadow.tar").symlink_to("/etc/shadow")  # a link inside pointing out
    (imports / "out.tar").symlink_to(outside)
    cases = {
        "/etc/shadow": "not inside an import directory",
        str(outside): "not inside an import directory",
        f"{imports}/../outside.tar": "not inside an import directory",
        str(imports / "shadow.tar"): "not inside an import directory",
        str(imports / "out.tar"): "not inside an import directory",
        str(imports): "not inside an import directory",  # the directory itself
        str(imports / "none.tar"): "not a file",
        "relative.tar": "absolute path",
    }
    for path, message in cases.items():
        answer = client.post(route, json={"name": "base", "tarball": path})
        assert answer.status_code == 400, (path, answer.text)
        assert message in answer.json()["detail"], (path, answer.json())
        assert "image_import_dirs" in answer.json()["detail"] or message != "not inside an import directory"
    _nothing_recorded(client)


def test_without_import_directories_no_tarball_is_read(client: TestClient, tmp_path: Path) -> None:
    _settings(client, image_import_dirs=[])
    tar = tarball(make_tree(tmp_path / "tree"), tmp_path / "base.tar")
    answer = client.post("/api/v1/images", json={"name": "base", "tarball": str(tar)})
    assert answer.status_code == 400
    assert "image_import_dirs" in answer.json()["detail"]
    _nothing_recorded(client)


def test_a_tarball_inside_an_import_directory_through_a_link_is_imported(client: TestClient, tmp_path: Path) -> None:
    imports = tmp_path / "imports"
    (imports / "podman").mkdir(parents=True)
    tarball(make_tree(tmp_path / "tree"), imports / "podman" / "base.tar")
    linked = tmp_path / "linked-imports"
    linked.symlink_to(imports)  # the admin's setting may itself be a link: both sides are resolved
    _settings(client, image_import_dirs=[linked])
    answer = client.post("/api/v1/images", json={"name": "base", "tarball": f"{linked}/podman/base.tar"})
    assert answer.status_code == 202, answer.text
    client.app.state.ctx.tasks.wait(answer.json()["id"], 60)  # type: ignore[attr-defined]
    assert client.get("/api/v1/images/base").json()["state"] == "ready"


def test_a_python_prefix_with_dot_parts_is_refused(client: TestClient) -> None:
    body = {"name": "torch", "version": "1", "cuda": "12.4"}
    for prefix in ("/opt/envs/../../tmp/evil", "/opt/envs/./torch", "/opt//envs", "/opt/envs/torch/..", "/"):
        answer = client.post("/api/v1/environments", json=body | {"python_prefix": prefix})
        assert answer.status_code in (400, 422), (prefix, answer.text)
        assert "python_prefix" in answer.text or "python prefix" in answer.text
    assert client.get("/api/v1/environments").json() == []
    made = client.post("/api/v1/environments", json=body | {"python_prefix": "/opt/envs/torch-2.4"})
    assert made.status_code == 201, made.text


def _dataset(location: str, version: str = "1") -> dict[str, Any]:
    return {"kind": "dataset", "name": "d", "version": version, "location": location, "sha256": SHA, "size_bytes": 1}


REFUSED_URLS = [
    "http://169.254.169.254/latest/meta-data/iam/security-credentials/",  # AWS, GCP, Azure metadata
    "http://169.254.170.2/v2/credentials",  # ECS task credentials
    "http://[fe80::1]/x",
    "http://[fe80::a9fe:a9fe%25eth0]/x",
    "http://[fd00:ec2::254]/latest/meta-data/",  # AWS's metadata over IPv6
    "http://100.100.100.200/latest/meta-data/",  # Alibaba Cloud's
    "http://[::ffff:169.254.169.254]/x",
    "http://0xa9fea9fe/x",  # 169.254.169.254 as one hexadecimal number
    "http://2852039166/x",  # ... and as one decimal number
    "http://169.254.43518/x",
    "http://127.0.0.1:8080/admin",
    "http://127.1/x",
    "https://[::1]/x",
    "http://localhost/x",
    "http://LOCALHOST./x",
    "http://api.localhost/x",
    "http://0.0.0.0/x",
    "http://[::]/x",
    "http://224.0.0.1/x",
    "http://[fe80::1/x",  # not even a URL
]


def test_model_and_dataset_urls_to_the_node_itself_or_its_metadata_service_are_refused(client: TestClient) -> None:
    for i, url in enumerate(REFUSED_URLS):
        answer = client.post("/api/v1/datasets", json=_dataset(url, str(i)))
        assert answer.status_code == 400, (url, answer.text)
        assert url[:40] in answer.json()["detail"] or "URL" in answer.json()["detail"], answer.json()
    answer = client.post("/api/v1/models", json=_dataset("http://169.254.169.254/x") | {"kind": "model"})
    assert answer.status_code == 400
    assert "link-local" in answer.json()["detail"]
    assert client.get("/api/v1/datasets").json() == []
    for i, url in enumerate(
        ("https://objects.example.com/d.tar?X-Amz-Signature=x", "http://10.1.2.3:9000/d", "http://[2001:db8::1]/d")
    ):
        assert client.post("/api/v1/datasets", json=_dataset(url, f"ok{i}")).status_code == 201, url


def test_dataset_paths_climbing_with_dots_are_refused(client: TestClient) -> None:
    for i, location in enumerate(("/shared/../etc/shadow", "file:///shared/./x", "/shared/x/..")):
        answer = client.post("/api/v1/datasets", json=_dataset(location, str(i)))
        assert answer.status_code == 400, (location, answer.text)
        assert "'..'" in answer.json()["detail"]
    assert client.get("/api/v1/datasets").json() == []


def test_dataset_paths_lie_inside_artifact_dirs_when_set(client: TestClient, tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "escape").symlink_to("/etc")
    _settings(client, artifact_dirs=[shared])
    for i, location in enumerate(("/etc/shadow", f"{shared}/escape/shadow", f"file://{tmp_path}/other", str(shared))):
        answer = client.post("/api/v1/datasets", json=_dataset(location, str(i)))
        assert answer.status_code == 400, (location, answer.text)
        assert "artifact_dirs" in answer.json()["detail"]
    assert client.post("/api/v1/datasets", json=_dataset(f"{shared}/imagenet")).status_code == 201
