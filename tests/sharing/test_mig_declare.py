"""Declaring MIG layouts (sharing.service.declare): a layout some GPU cannot take is refused and nothing is
stored; with `now`, a layout that would change a GPU a running job holds is refused naming the jobs; without
it, the same is stored and waits for the GPUs to go idle; None unsets. Then the same over HTTP."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.auth import service as auth
from gpufleet.auth.policy import Role
from gpufleet.core.clock import FakeClock, to_datetime
from gpufleet.core.db import transaction
from gpufleet.core.errors import Conflict, InvalidInput, NotFound
from gpufleet.inventory.models import Category, Node
from gpufleet.sharing import service
from tests.jobs.helpers import report, users
from tests.sharing.helpers import (
    ALL_1G,
    H200,
    SEVEN_1G,
    T4,
    add_node,
    category,
    hold,
    hold_instance,
    send,
)

# Above the database: tests/sharing/test_mig_reconcile.py runs the MIG queries on both.
pytestmark = pytest.mark.one_database


@pytest.fixture
def fleet(sessions: sessionmaker[Session], clock: FakeClock) -> sessionmaker[Session]:
    """Category `gpu`: node a (GPU 0 sliced 7 x 1g.18gb, GPU 1 whole) and node b (one whole GPU), H200s.
    Category `mixed`: an H200 node m and a T4 node t4. User alice."""
    category(sessions, clock, "gpu", None)
    category(sessions, clock, "mixed", None)
    add_node(sessions, clock, "a", [(H200, SEVEN_1G), (H200, None)], category="gpu")
    add_node(sessions, clock, "b", [(H200, None)], category="gpu")
    add_node(sessions, clock, "m", [(H200, None)], category="mixed")
    add_node(sessions, clock, "t4", [(T4, None)], category="mixed")
    users(sessions, clock, "alice")
    return sessions


def settings_of(session: Session, category_name: str | None = None, node: str | None = None) -> dict[str, object]:
    if node is not None:
        return dict(session.scalars(select(Node).where(Node.name == node)).one().settings or {})
    return dict(session.scalars(select(Category).where(Category.name == category_name)).one().settings or {})


def snapshot(session: Session) -> list[dict[str, object]]:
    """Every category's and node's stored settings."""
    return [settings_of(session, "gpu"), settings_of(session, "mixed")] + [
        settings_of(session, node=n) for n in ("a", "b", "m", "t4")
    ]


def marks(session: Session, node: str) -> tuple[datetime | None, dict[str, str]]:
    row = session.scalars(select(Node).where(Node.name == node)).one()
    return row.mig_sent_at, dict(row.mig_errors or {})


def set_marks(sessions: sessionmaker[Session], clock: FakeClock, *nodes: str) -> None:
    """The nodes as if asked and refused: what a new declaration clears, and a refused one must not."""
    with transaction(sessions) as s:
        for row in s.scalars(select(Node).where(Node.name.in_(nodes))):
            row.mig_sent_at = to_datetime(clock.now())
            row.mig_errors = {"0": "in use"}


def declared(found: list[service.NodeMig]) -> dict[str, list[tuple[str | None, bool]]]:
    return {n.node: [(g.declared, g.in_sync) for g in n.gpus] for n in found}


# -- refusals -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "layout", "match"),
    [
        ({"category": "mixed"}, ALL_1G, "Tesla T4 has no MIG"),  # one node of the category cannot
        ({"node": "t4"}, ALL_1G, "Tesla T4 has no MIG"),
        ({"category": "gpu"}, "all-1g.10gb", "no MIG profile 1g.10gb"),  # an H100's profile
        ({"category": "gpu"}, "2x4g.71gb", "compute slices"),
        ({"category": "gpu"}, "3g.71gb+3g.71gb+1g.18gb", "does not fit"),  # 7 slices, but no room left
        ({"node": "a"}, "banana", "banana"),
        ({"node": "a"}, "all-2x1g.18gb", "all-PROFILE"),
    ],
)
def test_declare_refuses_a_layout_a_gpu_cannot_take_and_stores_nothing(
    fleet: sessionmaker[Session], clock: FakeClock, target: dict[str, str], layout: str, match: str
) -> None:
    set_marks(fleet, clock, "a", "b", "m", "t4")
    with transaction(fleet) as s:
        before = snapshot(s)
        asked = {n: marks(s, n) for n in ("a", "b", "m", "t4")}
    with transaction(fleet) as s:
        with pytest.raises(InvalidInput, match=re.escape(match)):
            service.declare(s, clock, layout, now=False, **{"node": None, "category": None, **target})
        # Nothing changed in this very session, before any rollback could hide it.
        assert snapshot(s) == before
        assert {n: marks(s, n) for n in asked} == asked
    with transaction(fleet, readonly=True) as s:
        assert snapshot(s) == before


def test_none_fits_every_gpu_even_one_without_mig(fleet: sessionmaker[Session], clock: FakeClock) -> None:
    with transaction(fleet) as s:
        found = service.declare(s, clock, "none", node=None, category="mixed", now=True)
    assert declared(found) == {"m": [("none", True)], "t4": [("none", True)]}
    with transaction(fleet, readonly=True) as s:
        assert settings_of(s, "mixed") == {"mig_layout": "none"}


@pytest.mark.parametrize(
    ("node", "category_name", "error"),
    [("a", "gpu", InvalidInput), (None, None, InvalidInput), ("nope", None, NotFound), (None, "nope", NotFound)],
)
def test_declare_needs_exactly_one_existing_node_or_category(
    fleet: sessionmaker[Session], clock: FakeClock, node: str | None, category_name: str | None, error: type[Exception]
) -> None:
    with transaction(fleet) as s, pytest.raises(error):
        service.declare(s, clock, ALL_1G, node=node, category=category_name, now=False)
    with transaction(fleet, readonly=True) as s:
        assert settings_of(s, "gpu") == {}
        assert settings_of(s, node="a") == {}


def test_declare_now_refuses_naming_the_jobs_on_gpus_it_would_change(
    fleet: sessionmaker[Session], clock: FakeClock
) -> None:
    on_a = hold(fleet, clock, "a", [1])  # a's GPU 1 is whole: all-1g.18gb would change it
    report(fleet, clock, on_a, state="running", outcome=None)
    on_b = hold(fleet, clock, "b", [0])  # assigned, not yet running: it holds the GPU too
    done = hold(fleet, clock, "b", [0])
    report(fleet, clock, done)  # exited: holds nothing
    set_marks(fleet, clock, "a", "b")
    with transaction(fleet) as s:
        asked = {n: marks(s, n) for n in ("a", "b")}
        with pytest.raises(Conflict) as refused:
            service.declare(s, clock, ALL_1G, node=None, category="gpu", now=True)
        message = str(refused.value)
        assert "a GPU 1" in message
        assert "b GPU 0" in message
        assert "a GPU 0" not in message  # in the layout already
        named = re.search(r"jobs ([0-9, ]+)\)", message)
        assert named is not None, message
        assert {int(j) for j in named[1].split(",")} == {on_a, on_b}
        assert settings_of(s, "gpu") == {}
        assert {n: marks(s, n) for n in asked} == asked
    with transaction(fleet, readonly=True) as s:
        assert settings_of(s, "gpu") == {}
        assert all(g.declared is None for n in service.status(s, category="gpu") for g in n.gpus)


def test_declare_now_on_a_category_ignores_nodes_whose_own_layout_wins(
    fleet: sessionmaker[Session], clock: FakeClock
) -> None:
    with transaction(fleet) as s:
        service.declare(s, clock, "none", node="b", category=None, now=False)  # b keeps whole GPUs
    busy = hold(fleet, clock, "b", [0])
    report(fleet, clock, busy, state="running", outcome=None)
    with transaction(fleet) as s:
        found = service.declare(s, clock, ALL_1G, node=None, category="gpu", now=True)
    assert declared(found)["b"] == [("none", True)]  # b's GPU does not change: its job is not in the way


def test_declare_without_now_stores_the_same_and_waits_for_the_gpus(
    fleet: sessionmaker[Session], clock: FakeClock
) -> None:
    busy = hold(fleet, clock, "a", [1])
    report(fleet, clock, busy, state="running", outcome=None)
    set_marks(fleet, clock, "a", "b")
    with transaction(fleet) as s:
        found = service.declare(s, clock, ALL_1G, node=None, category="gpu", now=False)
    assert declared(found) == {"a": [(ALL_1G, True), (ALL_1G, False)], "b": [(ALL_1G, False)]}
    with transaction(fleet, readonly=True) as s:
        assert settings_of(s, "gpu") == {"mig_layout": ALL_1G}
        assert settings_of(s, "mixed") == {}
        assert marks(s, "a") == (None, {})  # a new declaration is sent at once
        assert marks(s, "b") == (None, {})
        assert [n.in_sync for n in service.status(s, category="gpu")] == [False, False]
    # a's GPU 1 waits for its job; b's idle GPU goes now.
    assert send(fleet, clock) == {"b": {0: ALL_1G}}


def test_declare_now_is_accepted_when_the_busy_gpus_would_not_change(
    fleet: sessionmaker[Session], clock: FakeClock
) -> None:
    sliced = hold_instance(fleet, clock, "a", "MIG-a-0-2")  # on a's GPU 0, already 7 x 1g.18gb
    report(fleet, clock, sliced, state="running", outcome=None)
    with transaction(fleet) as s:
        found = service.declare(s, clock, ALL_1G, node="a", category=None, now=True)
    assert declared(found) == {"a": [(ALL_1G, True), (ALL_1G, False)]}
    # A whole job on a's GPU 1: `none` would change GPU 0 (held by the 1g job) but not GPU 1.
    whole = hold(fleet, clock, "a", [1])
    report(fleet, clock, whole, state="running", outcome=None)
    with transaction(fleet) as s, pytest.raises(Conflict, match=f"jobs {sliced}\\)"):
        service.declare(s, clock, "none", node="a", category=None, now=True)
    report(fleet, clock, sliced)
    with transaction(fleet) as s:
        found = service.declare(s, clock, "none", node="a", category=None, now=True)
    assert declared(found) == {"a": [("none", False), ("none", True)]}
    with transaction(fleet, readonly=True) as s:
        assert settings_of(s, node="a") == {"mig_layout": "none"}


def test_declare_none_unsets_and_the_category_shows_through(fleet: sessionmaker[Session], clock: FakeClock) -> None:
    with transaction(fleet) as s:
        service.declare(s, clock, ALL_1G, node=None, category="gpu", now=False)
        found = service.declare(s, clock, "none", node="a", category=None, now=False)
    assert declared(found) == {"a": [("none", False), ("none", True)]}
    busy = hold(fleet, clock, "b", [0])
    report(fleet, clock, busy, state="running", outcome=None)
    with transaction(fleet) as s:
        found = service.declare(s, clock, None, node="a", category=None, now=True)  # unsetting changes no GPU
        assert settings_of(s, node="a") == {}
    assert declared(found) == {"a": [(ALL_1G, True), (ALL_1G, False)]}  # the category's again
    with transaction(fleet) as s:
        found = service.declare(s, clock, None, node=None, category="gpu", now=True)
        assert settings_of(s, "gpu") == {}
    assert declared(found) == {"a": [(None, True), (None, True)], "b": [(None, True)]}
    assert send(fleet, clock) == {}


def test_status_names_unknown_nodes_and_filters_by_category(fleet: sessionmaker[Session], clock: FakeClock) -> None:
    with transaction(fleet, readonly=True) as s:
        assert [n.node for n in service.status(s)] == ["a", "b", "m", "t4"]
        assert [n.node for n in service.status(s, category="mixed")] == ["m", "t4"]
        assert [g.actual for g in service.status(s, node="a")[0].gpus] == ["7x1g.18gb", "whole"]
        with pytest.raises(NotFound):
            service.status(s, node="nope")


# -- over HTTP ----------------------------------------------------------------------------------------


def _gpus(answer: list[dict[str, Any]]) -> dict[str, list[tuple[Any, ...]]]:
    return {n["node"]: [(g["index"], g["declared"], g["actual"], g["in_sync"]) for g in n["gpus"]] for n in answer}


def test_mig_layouts_over_http(
    client: TestClient, fleet: sessionmaker[Session], clock: FakeClock, sessions: sessionmaker[Session]
) -> None:
    with transaction(sessions) as s:
        viewer = auth.create_api_token(s, clock, "viewer token", Role.VIEWER, None)
        operator = auth.create_api_token(s, clock, "operator token", Role.OPERATOR, None)
        s.scalars(select(Node).where(Node.name == "b")).one().mig_errors = {"0": "GPU 0 is in use"}
    busy = hold(fleet, clock, "a", [1])
    report(fleet, clock, busy, state="running", outcome=None)

    shown = client.get("/api/v1/mig", params={"category": "gpu"})
    assert shown.status_code == 200, shown.text
    assert _gpus(shown.json()) == {
        "a": [(0, None, "7x1g.18gb", True), (1, None, "whole", True)],
        "b": [(0, None, "whole", True)],
    }
    b = next(n for n in shown.json() if n["node"] == "b")
    assert b["gpus"][0]["error"] == "GPU 0 is in use"
    assert b["in_sync"] is True
    assert b["asked"] is False
    assert client.get("/api/v1/mig", params={"node": "nope"}).status_code == 404

    # Refusals change nothing: jobs in the way with `now` (409), a layout the GPUs cannot take (400).
    refused = client.put("/api/v1/mig/layout", json={"layout": ALL_1G, "category": "gpu", "now": True})
    assert refused.status_code == 409, refused.text
    detail = refused.json()["detail"]
    assert "running jobs hold GPUs" in detail
    assert "a GPU 1" in detail
    assert f"jobs {busy})" in detail
    for body in (
        {"layout": "all-1g.99gb", "category": "gpu"},
        {"layout": ALL_1G, "category": "mixed"},
        {"layout": "banana", "node": "a"},
        {"layout": ALL_1G, "node": "a", "category": "gpu"},
    ):
        bad = client.put("/api/v1/mig/layout", json=body)
        assert bad.status_code == 400, (body, bad.text)
    assert client.put("/api/v1/mig/layout", json={"layout": "x" * 129, "node": "a"}).status_code == 422
    assert client.put("/api/v1/mig/layout", json={"layout": ALL_1G, "node": "nope"}).status_code == 404
    assert all(g[1] is None for gpus in _gpus(client.get("/api/v1/mig").json()).values() for g in gpus)

    # A viewer reads but may not declare; an operator may.
    as_viewer = {"Authorization": f"Bearer {viewer}"}
    assert client.get("/api/v1/mig", headers=as_viewer).status_code == 200
    forbidden = client.put("/api/v1/mig/layout", json={"layout": ALL_1G, "category": "gpu"}, headers=as_viewer)
    assert forbidden.status_code == 403, forbidden.text
    assert all(g[1] is None for gpus in _gpus(client.get("/api/v1/mig").json()).values() for g in gpus)
    done = client.put(
        "/api/v1/mig/layout",
        json={"layout": ALL_1G, "category": "gpu"},
        headers={"Authorization": f"Bearer {operator}"},
    )
    assert done.status_code == 200, done.text
    assert _gpus(done.json()) == {
        "a": [(0, ALL_1G, "7x1g.18gb", True), (1, ALL_1G, "whole", False)],
        "b": [(0, ALL_1G, "whole", False)],
    }
    assert next(n for n in done.json() if n["node"] == "b")["gpus"][0]["error"] is None  # cleared
    assert _gpus(client.get("/api/v1/mig", params={"category": "gpu"}).json()) == _gpus(done.json())

    unset = client.put("/api/v1/mig/layout", json={"layout": None, "category": "gpu"})
    assert unset.status_code == 200, unset.text
    assert all(g[1] is None and g[3] for gpus in _gpus(unset.json()).values() for g in gpus)
