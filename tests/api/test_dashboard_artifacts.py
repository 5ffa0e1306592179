"""The Models and Datasets pages (`/models`, `/datasets`): every registered version with its size,
framework and format, licence, source, owner and the projects it is shared with, and the nodes whose
cache holds it; and the node page's Cache section (what the node's agent last reported)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gpufleet.auth.projects import create_project
from gpufleet.core.db import transaction
from gpufleet.jobs import artifacts
from gpufleet.jobs.schemas import ArtifactIn
from gpufleet.protocol.artifacts import CacheEntry, NodeCache
from tests.api.dashboard_helpers import logged_in, up_node

# Pages, forms and input parsing: HTTP translation, the same on both databases (the domain tests run both).
pytestmark = pytest.mark.one_database

T0 = 1_800_000_000.0  # FakeClock's start: 2027-01-15 08:00:00 UTC
SHA_LLAMA = "a" * 64
SHA_LLAMA2 = "b" * 64
SHA_WIKI = "c" * 64
SHA_GONE = "d" * 64


def _register(client: TestClient, kind: str, name: str, version: str, sha256: str, **fields: Any) -> None:
    ctx = client.app.state.ctx  # type: ignore[attr-defined]
    spec = ArtifactIn.model_validate(
        {"kind": kind, "name": name, "version": version, "sha256": sha256, "location": f"/shared/{name}"}
        | {"size_bytes": 1_500_000_000}
        | fields
    )
    with transaction(ctx.sessions) as session:
        artifacts.register(session, ctx.clock, "user:alice", spec)


def _cache(client: TestClient, node_id: int, *entries: tuple[str, int, float, float, int]) -> None:
    ctx = client.app.state.ctx  # type: ignore[attr-defined]
    report = NodeCache(
        limit_bytes=10**12,
        entries=[
            CacheEntry(sha256=sha, size_bytes=size, copied_at=copied, last_used_at=used, uses=uses)
            for sha, size, copied, used, uses in entries
        ],
    )
    with transaction(ctx.sessions) as session:
        artifacts.record_cache(session, node_id, report)


def _projects(client: TestClient, *names: str) -> None:
    ctx = client.app.state.ctx  # type: ignore[attr-defined]
    with transaction(ctx.sessions) as session:
        for name in names:
            create_project(session, ctx.clock, name)


def _row(html: str, kind: str, ref: str) -> str:
    found = re.search(rf'<tr id="{kind}-[^"]*" data-artifact="{re.escape(ref)}">.*?</tr>', html, re.DOTALL)
    assert found is not None, f"no row for {kind} {ref}"
    return found.group(0)


def _nav(html: str) -> list[str]:
    nav = html.split('aria-label="Main"', 1)[1].split("</nav>", 1)[0]
    return re.findall(r'href="([^"]+)"', nav)


def test_the_models_page_lists_every_version_with_its_owner_and_the_nodes_caching_it(client: TestClient) -> None:
    _projects(client, "nlp", "vision", "speech")
    _register(
        client,
        "model",
        "llama",
        "3.1-8b",
        SHA_LLAMA,
        framework="pytorch",
        format="safetensors",
        licence="llama3.1",
        source="meta-llama/Llama-3.1-8B",
        project="nlp",
        shared_with=["vision", "speech"],
        description="the base model",
    )
    _register(client, "model", "llama", "3.1-70b", SHA_LLAMA2, size_bytes=140_000_000_000, licence="llama3.1")
    _register(client, "dataset", "wiki", "2024", SHA_WIKI, format="parquet")
    names = [f"gpu{i:02d}" for i in range(1, 8)]
    for name in names:
        node = up_node(client, name)
        _cache(client, node, (SHA_LLAMA, 1_500_000_000, T0 - 600, T0 - 60, 3))
    _cache(client, up_node(client, "gpu99"), (SHA_WIKI, 1_500_000_000, T0, T0, 1))

    page = logged_in(client).get("/models")  # a viewer: jobs:read is enough
    assert page.status_code == 200
    text = page.text
    assert 'aria-current="page">Models<' in text
    assert "<title>Models — gpufleet</title>" in text
    assert "2 models." in text
    assert "gpufleet job submit --model NAME[:VERSION]" in text
    rows = re.findall(r'data-artifact="([^"]+)"', text)
    assert sorted(rows) == ["llama:3.1-70b", "llama:3.1-8b"]
    assert "wiki" not in text  # a dataset, not a model

    row = _row(text, "model", "llama:3.1-8b")
    assert 'id="model-llama-3.1-8b"' in row
    assert f'title="sha256 {SHA_LLAMA}"' in row
    assert "the base model" in row
    assert "1,500.0 MB" in row
    assert "pytorch, safetensors" in row
    assert "llama3.1" in row
    assert "meta-llama/Llama-3.1-8B" in row
    assert '<td class="owner">nlp</td>' in row
    assert '<td class="shared">speech, vision</td>' in row
    assert 'data-cached="7"' in row
    assert "7 nodes" in row
    assert f'title="{", ".join(names)}"' in row  # every name on hover
    assert f'data-nodes="{",".join(names)}"' in row
    assert "gpu01, gpu02, gpu03, gpu04, gpu05, ..." in row  # five shown
    assert "gpu99" not in row

    open_row = _row(text, "model", "llama:3.1-70b")
    assert "140,000.0 MB" in open_row
    assert '<td class="owner"><span class="muted">none</span></td>' in open_row
    assert '<td class="shared"><span class="muted">every project</span></td>' in open_row
    assert 'data-cached="0"' in open_row
    assert "0 nodes" in open_row
    assert "data-nodes" not in open_row


def test_the_datasets_page_lists_datasets_only(client: TestClient) -> None:
    _register(client, "model", "llama", "1", SHA_LLAMA, framework="pytorch")
    _register(client, "dataset", "wiki", "2024", SHA_WIKI, format="parquet", licence="cc-by-sa-4.0")
    _cache(client, up_node(client, "gpu01"), (SHA_WIKI, 1_500_000_000, T0, T0, 1))

    page = logged_in(client, "member", "mia").get("/datasets")
    assert page.status_code == 200
    assert 'aria-current="page">Datasets<' in page.text
    assert "1 dataset." in page.text
    assert "gpufleet job submit --dataset NAME[:VERSION]" in page.text
    assert re.findall(r'data-artifact="([^"]+)"', page.text) == ["wiki:2024"]
    row = _row(page.text, "dataset", "wiki:2024")
    assert 'id="dataset-wiki-2024"' in row
    assert "parquet" in row
    assert "cc-by-sa-4.0" in row
    assert "1 node" in row
    assert 'data-nodes="gpu01"' in row


@pytest.mark.parametrize("kind", ["model", "dataset"])
def test_an_empty_registry_says_how_to_register_one(client: TestClient, kind: str) -> None:
    page = logged_in(client).get(f"/{kind}s")
    assert page.status_code == 200
    assert f"0 {kind}s." in page.text
    assert f"No {kind}s yet: <code>gpufleet {kind} register NAME:VERSION PATH</code>" in page.text


def test_the_live_part_alone_answers_htmx(client: TestClient) -> None:
    _register(client, "model", "llama", "1", SHA_LLAMA)
    fragment = logged_in(client).get("/models", headers={"HX-Request": "true"})
    assert fragment.status_code == 200
    assert fragment.text.lstrip().startswith("<section")
    assert 'id="live"' in fragment.text
    assert 'hx-get="/models"' in fragment.text
    assert 'data-artifact="llama:1"' in fragment.text
    assert "<html" not in fragment.text
    assert 'aria-label="Main"' not in fragment.text


@pytest.mark.parametrize("role", ["viewer", "member", "operator", "admin"])
def test_every_role_sees_models_and_datasets_after_environments(client: TestClient, role: str) -> None:
    browser = logged_in(client, role, "root" if role == "admin" else "bob")
    nav = _nav(browser.get("/").text)
    at = nav.index("/environments")
    assert nav[at + 1 : at + 3] == ["/models", "/datasets"]
    for path in ("/models", "/datasets"):
        assert browser.get(path).status_code == 200


def test_without_a_session_the_pages_redirect_to_the_login(client: TestClient) -> None:
    anonymous = TestClient(client.app)
    for path in ("/models", "/datasets"):
        assert anonymous.get(path, follow_redirects=False).headers["location"] == "/login"
        fragment = anonymous.get(path, headers={"HX-Request": "true"})
        assert fragment.status_code == 401
        assert fragment.headers["hx-redirect"] == "/login"


def _cache_rows(html: str) -> list[str]:
    body = html.split('<table id="cache"', 1)[1].split("</table>", 1)[0]
    return re.findall(r"<tr data-sha256=.*?</tr>", body, re.DOTALL)


def test_the_node_page_shows_its_cache_newest_use_first(client: TestClient) -> None:
    _register(client, "model", "llama", "3.1-8b", SHA_LLAMA)
    _register(client, "dataset", "wiki", "2024", SHA_WIKI)
    _register(client, "dataset", "wiki-copy", "1", SHA_WIKI)  # the same bytes under another name
    node = up_node(client, "gpu01")
    _cache(
        client,
        node,
        (SHA_LLAMA, 16_000_000_000, T0 - 7200, T0 - 3600, 4),
        (SHA_WIKI, 2_500_000, T0 - 600, T0 - 60, 1),
        (SHA_GONE, 1_000_000, T0 - 86_400, T0 - 86_400, 9),  # its artifact was removed since
    )
    _cache(client, up_node(client, "gpu02"), (SHA_LLAMA2, 1, T0, T0, 1))

    page = logged_in(client).get("/nodes/gpu01")
    assert page.status_code == 200
    heading = r'id="cache-heading">Cache <span class="badge">3</span>\s*<span class="muted small">16,003.5 MB<'
    assert re.search(heading, page.text)
    wiki, llama, gone = _cache_rows(page.text)
    assert f'data-sha256="{SHA_WIKI}"' in wiki
    assert '<a href="/datasets#dataset-wiki-2024">dataset wiki:2024</a>' in wiki
    assert '<a href="/datasets#dataset-wiki-copy-1">dataset wiki-copy:1</a>' in wiki
    assert "2.5 MB" in wiki
    assert "2027-01-15 07:50:00" in wiki  # copied
    assert "2027-01-15 07:59:00" in wiki  # last used
    assert '<td class="num">1</td>' in wiki
    assert '<a href="/models#model-llama-3.1-8b">model llama:3.1-8b</a>' in llama
    assert "16,000.0 MB" in llama
    assert '<td class="num">4</td>' in llama
    assert f"not registered now ({SHA_GONE[:12]})" in gone
    assert SHA_LLAMA2 not in page.text  # gpu02's

    fragment = logged_in(client, "member", "mia").get("/nodes/gpu01", headers={"HX-Request": "true"})
    assert len(_cache_rows(fragment.text)) == 3


def test_a_node_with_nothing_cached_says_so(client: TestClient) -> None:
    up_node(client, "gpu01")
    page = logged_in(client).get("/nodes/gpu01").text
    assert 'id="cache-heading">Cache <span class="badge">0</span>' in page
    assert _cache_rows(page) == []
    assert "Nothing cached." in page
