"""The Services page (`/services`): every inference service with its endpoint, project, model, replicas
ready of wanted, revision, restarts and problem, the calls this head proxied to it in the last minute,
and its replicas (job, revision, state, node, health checks). Services are made through
`inference.create` and driven by the reconciler as in tests/jobs/test_inference.py; the call figures
come from real calls through the head's proxy to a replica on loopback."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.core.clock import FakeClock
from gpufleet.core.db import transaction
from gpufleet.jobs import artifacts, inference
from gpufleet.jobs.models import Job, JobState, ServiceReplica
from gpufleet.jobs.schemas import ArtifactIn, ServiceCreate
from tests.api.dashboard_helpers import logged_in
from tests.api.loopback_replica import echo_replica
from tests.jobs.helpers import LIMITS, as_user, cluster, project, report, tick, users

# Pages, forms and input parsing: HTTP translation, the same on both databases (the domain tests run both).
pytestmark = pytest.mark.one_database

ALICE = as_user("alice")


@pytest.fixture
def ready(client: TestClient, sessions: sessionmaker[Session], clock: FakeClock) -> None:
    """Two nodes with 2 GPUs each, alice in project ml, and a model ml may use."""
    cluster(sessions, clock, nodes=2, gpus=2)
    users(sessions, clock, "alice")
    project(sessions, clock, "ml", "alice")
    spec = ArtifactIn.model_validate(
        {"kind": "model", "name": "minilm", "version": "1", "sha256": "a" * 64, "location": "/shared/minilm"}
        | {"size_bytes": 90_000_000, "project": "ml"}
    )
    with transaction(sessions) as s:
        artifacts.register(s, clock, "user:alice", spec)


def _create(sessions: sessionmaker[Session], clock: FakeClock, name: str, replicas: int, **replica: Any) -> None:
    replica.setdefault("argv", ["serve"])
    replica.setdefault("project", "ml")
    replica.setdefault("gpus_per_node", 1)
    spec = ServiceCreate(name=name, replicas=replicas, startup_s=60, replica=replica)
    with transaction(sessions) as s:
        inference.create(s, clock, ALICE, spec, LIMITS)


def _replica_jobs(sessions: sessionmaker[Session], name: str) -> list[int]:
    with transaction(sessions, readonly=True) as s:
        return [j.id for j in inference.replica_jobs(s, inference.get(s, name))]


def _running(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    """A scheduler pass places the replicas; their agents say they run."""
    tick(sessions, clock)
    with transaction(sessions, readonly=True) as s:
        placed = list(s.scalars(select(Job.id).where(Job.state == JobState.RUNNING)))
    for job_id in placed:
        report(sessions, clock, job_id, "running")


def _reconcile(sessions: sessionmaker[Session], clock: FakeClock, healthy: dict[int, bool] | None = None) -> None:
    """One leader pass: the health checks' answers by job id, then the reconciler."""
    with transaction(sessions) as s:
        by_job = {r.job_id: r.id for r in s.scalars(select(ServiceReplica))}
        inference.record_probes(s, clock, {by_job[j]: ok for j, ok in (healthy or {}).items()})
        inference.reconcile(s, clock, LIMITS)


def _card(html: str, name: str) -> str:
    found = re.search(
        rf'<article class="card service" id="service-{name}" data-service="{name}">.*?</article>', html, re.S
    )
    assert found is not None, f"no card for service {name}"
    return found.group(0)


def _replica_rows(card: str) -> dict[int, str]:
    return {int(m.group(1)): m.group(0) for m in re.finditer(r'<tr data-job="(\d+)".*?</tr>', card, re.S)}


def _fact(card: str, cls: str) -> str:
    found = re.search(rf'<dd class="{cls}[^"]*"[^>]*>(.*?)</dd>', card, re.S)
    assert found is not None, f"no {cls}"
    return re.sub(r"<[^>]+>", "", found.group(1)).strip()


def _nav(html: str) -> list[str]:
    nav = html.split('aria-label="Main"', 1)[1].split("</nav>", 1)[0]
    return re.findall(r'href="([^"]+)"', nav)


@pytest.mark.usefixtures("ready")
def test_the_page_shows_each_service_and_its_replicas(
    client: TestClient, sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    _create(sessions, clock, "embed", 2, model="minilm:1")
    _create(sessions, clock, "chat", 1)
    _running(sessions, clock)
    _reconcile(sessions, clock)  # the running replicas get their addresses
    first, second = _replica_jobs(sessions, "embed")
    (chat,) = _replica_jobs(sessions, "chat")
    _reconcile(sessions, clock, {first: True, second: False, chat: True})

    page = logged_in(client).get("/services")  # a viewer: jobs:read is enough
    assert page.status_code == 200
    text = page.text
    assert 'aria-current="page">Services<' in text
    assert "<title>Services — gpufleet</title>" in text
    assert "2 services." in text
    assert re.findall(r'data-service="([^"]+)"', text) == ["chat", "embed"]  # by name

    embed = _card(text, "embed")
    assert '<code class="endpoint">/services/embed/</code>' in embed
    assert _fact(embed, "project") == "ml (alice)"
    assert _fact(embed, "model") == "minilm:1"
    assert '<dd class="ready warn" data-ready="1" data-wanted="2">1 of 2</dd>' in embed  # fewer ready than wanted
    assert _fact(embed, "revision") == "1"
    assert _fact(embed, "restarts") == "0"
    assert _fact(embed, "rate") == "0.00/s"
    assert _fact(embed, "latency") == "no calls"
    assert _fact(embed, "errors") == "no calls"
    assert 'class="problem' not in embed

    rows = _replica_rows(embed)
    assert sorted(rows) == [first, second]
    good, bad = rows[first], rows[second]
    assert f'<a href="/jobs/{first}">{first}</a>' in good
    assert 'data-state="running"' in good
    node = re.search(r'<a href="/nodes/(n\d)">n\d</a>', good)
    assert node is not None
    assert re.search(r'<span class="mono">n\d\.cluster:4\d{4}</span>', good)
    assert 'data-healthy="yes"' in good
    assert '<span class="up">yes</span>' in good
    assert "failed check" not in good
    assert "last checked 2027-01-15 08:00:00 UTC" in good
    assert 'data-healthy="no"' in bad
    assert '<span class="down">no</span> <span class="muted small">1 failed check</span>' in bad

    chat_card = _card(text, "chat")
    assert '<dd class="ready" data-ready="1" data-wanted="1">1 of 1</dd>' in chat_card
    assert _fact(chat_card, "model") == "none"
    assert list(_replica_rows(chat_card)) == [chat]


@pytest.mark.usefixtures("ready")
def test_a_crash_loop_shows_its_problem_and_a_pending_replica_its_place(
    client: TestClient, sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    _create(sessions, clock, "embed", 1, model="minilm:1")
    _running(sessions, clock)
    (crashed,) = _replica_jobs(sessions, "embed")
    report(sessions, clock, crashed, "exited", "failed", exit_code=1)  # before it ever passed a check
    _reconcile(sessions, clock)  # replaced: restarts 1, the next start backs off

    card = _card(logged_in(client, "member", "mia").get("/services").text, "embed")
    assert _fact(card, "restarts") == "1"
    assert '<dd class="ready warn" data-ready="0" data-wanted="1">0 of 1</dd>' in card
    problem = re.search(r'<p class="problem warn">(.*?)</p>', card, re.S)
    assert problem is not None
    assert f"replica job {crashed} ended before it was ever healthy" in problem.group(1)
    assert "1 in a row, the next starts in 2 s" in problem.group(1)
    assert "No replicas now." in card  # backing off: none started yet

    clock.advance(3)
    _reconcile(sessions, clock)  # the back-off is over: a new replica, not placed yet
    (pending,) = _replica_jobs(sessions, "embed")  # the crashed one's row is gone
    assert pending != crashed
    row = _replica_rows(_card(logged_in(client, "viewer", "vic").get("/services").text, "embed"))[pending]
    assert 'data-state="pending"' in row
    assert '<span class="muted">not placed</span>' in row
    assert "no, not checked yet" in row


@pytest.fixture
def loopback() -> Iterator[str]:
    with echo_replica() as address:  # 201 for any path, 500 for /fail
        yield address


@pytest.mark.usefixtures("ready")
def test_the_calls_the_head_proxied_show_as_rate_latency_and_errors(
    client: TestClient, sessions: sessionmaker[Session], clock: FakeClock, loopback: str
) -> None:
    _create(sessions, clock, "embed", 1)
    _running(sessions, clock)
    (job_id,) = _replica_jobs(sessions, "embed")
    _reconcile(sessions, clock, {job_id: True})
    with transaction(sessions) as s:  # the replica listens on loopback here, not on its node
        s.execute(update(ServiceReplica).where(ServiceReplica.job_id == job_id).values(address=loopback))

    for path in ("ok", "ok", "fail"):  # through the head's proxy, with the admin's token
        client.get(f"/services/embed/{path}")

    card = _card(logged_in(client).get("/services").text, "embed")
    assert _fact(card, "rate") == "0.05/s"  # 3 calls over the last minute
    assert re.fullmatch(r"[\d,]+\.\d / [\d,]+\.\d ms", _fact(card, "latency"))
    assert '<dd class="errors warn">33.3 %</dd>' in card


def test_no_services_says_how_to_create_one(client: TestClient) -> None:
    page = logged_in(client).get("/services")
    assert page.status_code == 200
    assert "0 services." in page.text
    assert "No services yet: <code>gpufleet service create NAME --model M -- COMMAND</code>" in page.text


@pytest.mark.usefixtures("ready")
def test_the_live_part_alone_answers_htmx(
    client: TestClient, sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    _create(sessions, clock, "embed", 1)
    fragment = logged_in(client).get("/services", headers={"HX-Request": "true"})
    assert fragment.status_code == 200
    assert fragment.text.lstrip().startswith("<section")
    assert 'id="live"' in fragment.text
    assert 'hx-get="/services"' in fragment.text
    assert 'data-service="embed"' in fragment.text
    assert "<html" not in fragment.text
    assert 'aria-label="Main"' not in fragment.text


@pytest.mark.parametrize("role", ["viewer", "member", "operator", "admin"])
def test_every_role_sees_services_after_datasets(client: TestClient, role: str) -> None:
    browser = logged_in(client, role, "root" if role == "admin" else "bob")
    nav = _nav(browser.get("/").text)
    assert nav[nav.index("/datasets") + 1] == "/services"
    assert browser.get("/services").status_code == 200


def test_without_a_session_the_page_redirects_to_the_login(client: TestClient) -> None:
    anonymous = TestClient(client.app)
    assert anonymous.get("/services", follow_redirects=False).headers["location"] == "/login"
    fragment = anonymous.get("/services", headers={"HX-Request": "true"})
    assert fragment.status_code == 401
    assert fragment.headers["hx-redirect"] == "/login"
