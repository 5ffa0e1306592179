"""NaN, Infinity and -Infinity in a JSON body are a 400 on every route, before the route runs (api.finite_json)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fastapi import params
from fastapi.routing import APIRoute, iter_route_contexts
from fastapi.testclient import TestClient

from gpufleet.api.finite_json import non_finite

# One database: numbers refused at the HTTP edge, before any write (test_channel_bounds runs both).
pytestmark = pytest.mark.one_database


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    """SQLite only: pages, forms and input parsing are HTTP translation, the same on both databases (the
    domain tests run both)."""
    return f"sqlite:///{tmp_path / 'gpufleet.db'}"


CONSTANTS = ("NaN", "Infinity", "-Infinity")
JSON = {"content-type": "application/json"}


def json_body_routes(client: TestClient) -> list[tuple[str, str]]:
    """(method, path with its parameters filled) of every route of the app that takes a JSON body: a
    route added later is covered without naming it here."""
    found = []
    for context in iter_route_contexts(client.app.routes):  # type: ignore[attr-defined]
        route = context.original_route
        if not isinstance(route, APIRoute) or route.body_field is None:
            continue
        if isinstance(route.body_field.field_info, params.Form):
            continue  # the login and logout forms: no JSON
        path = re.sub(r"\{[^}]+\}", "1", context.path or "")
        found += [(method, path) for method in sorted(context.methods or ())]
    return found


@pytest.mark.parametrize("constant", CONSTANTS)
def test_every_json_body_route_refuses_a_non_finite_number(client: TestClient, constant: str) -> None:
    routes = json_body_routes(client)
    assert len(routes) > 40  # the enumeration found the API's routes
    for method, path in routes:
        body = f'{{"value": {constant}, "nested": [1, {{"x": {constant}}}]}}'
        answer = client.request(method, path, content=body, headers=JSON)
        assert answer.status_code == 400, (method, path, answer.status_code, answer.text[:200])
        assert answer.json() == {"detail": f"the request body holds {constant}: JSON numbers must be finite"}


@pytest.mark.parametrize(
    "media", ["application/json; charset=utf-8", "application/merge-patch+json", "APPLICATION/JSON"]
)
def test_every_json_media_type_is_checked(client: TestClient, media: str) -> None:
    answer = client.post("/api/v1/silences", content='{"for_s": NaN}', headers={"content-type": media})
    assert answer.status_code == 400


def test_a_utf16_body_is_checked_as_fastapi_reads_it(client: TestClient) -> None:
    answer = client.post("/api/v1/silences", content='{"for_s": NaN}'.encode("utf-16-le"), headers=JSON)
    assert answer.status_code == 400
    assert "NaN" in answer.json()["detail"]


def test_a_nan_threshold_stores_nothing_and_a_word_in_a_string_is_text(client: TestClient) -> None:
    rule = {"name": "hot", "metric": "gpu_temp_c", "entity_kind": "gpu", "op": ">", "threshold": 85}
    for constant in CONSTANTS:
        fields = '"name": "hot", "metric": "gpu_temp_c", "entity_kind": "gpu", "op": ">"'
        body = f'{{{fields}, "threshold": {constant}}}'
        answer = client.post("/api/v1/alert-rules", content=body, headers=JSON)
        assert (answer.status_code, constant in answer.json()["detail"]) == (400, True)
    assert "hot" not in [r["name"] for r in client.get("/api/v1/alert-rules").json()]
    created = client.post("/api/v1/alert-rules", json=rule | {"name": "NaN_Infinity"})  # words, not numbers
    assert created.status_code == 201, created.text
    assert created.json()["threshold"] == 85


@pytest.mark.parametrize(
    ("body", "found"),
    [
        (b'{"a": NaN}', "NaN"),
        (b"[1, -Infinity]", "-Infinity"),
        (b'{"a": "NaN", "b": "Infinity"}', None),  # strings
        (b'{"a": 1.5e308, "b": -0.0}', None),  # large but finite
        (b'{"a": "NaN"', None),  # not JSON: FastAPI's own 422 says so
        (b"\xff\xfe NaN", None),
        # UTF-16 and UTF-32, which json.loads (and so FastAPI) detects and reads: no NUL-free byte search.
        ('{"a": NaN}'.encode("utf-16-le"), "NaN"),
        ('{"a": Infinity}'.encode("utf-32"), "Infinity"),
        ('{"a": "NaN"}'.encode("utf-16"), None),
        (b"[" * 50_000 + b"NaN" + b"]" * 50_000, None),  # past the parser's depth: FastAPI answers 400 itself
    ],
)
def test_non_finite(body: bytes, found: str | None) -> None:
    assert non_finite(body) == found
