"""The Jobs pages (`/jobs`, `/jobs/{id}`, `/jobs/usage`) and a job's charts' JSON
(`/api/v1/jobs/{id}/gpu-charts`), over HTTP, with jobs placed by the real scheduler tick."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from gpufleet.api.dashboard import jobs as dashboard_jobs
from gpufleet.api.routers import job_metrics
from gpufleet.api.served_routes import API_PREFIX
from gpufleet.core.db import transaction
from gpufleet.jobs import output
from gpufleet.jobs.models import JobState
from gpufleet.protocol.jobs import JobOutput
from tests.api.dashboard_helpers import csrf_header, logged_in, stat, write_gpu_sample
from tests.jobs.helpers import cluster, job, node_id, project, ranks, report, submit, tick, users

# Pages, forms and input parsing: HTTP translation, the same on both databases (the domain tests run both).
pytestmark = pytest.mark.one_database


@pytest.fixture
def app(client: TestClient) -> FastAPI:
    """The test app, with the job charts' router served under /api/v1 should app.py not serve it yet."""
    app: FastAPI = client.app  # type: ignore[assignment]
    served = {getattr(r, "path", "") for r in app.routes}
    if f"{API_PREFIX}/jobs/{{job_id}}/gpu-charts" not in served:
        app.include_router(job_metrics.router, prefix=API_PREFIX)
    return app


@dataclass(frozen=True)
class Queue:
    """A: mia's, running on 2 GPUs. C: alice's, running on 1 GPU. D: mia's, completed. B: mia's,
    waiting for resources (2 nodes x 4 GPUs on a cluster of 2 x 4 with 3 GPUs in use). `mia` is
    her logged-in browser (a member)."""

    a: int
    b: int
    c: int
    d: int
    mia: TestClient


@pytest.fixture
def queue(client: TestClient) -> Queue:
    ctx = client.app.state.ctx  # type: ignore[attr-defined]
    sessions, clock = ctx.sessions, ctx.clock
    cluster(sessions, clock, nodes=2, gpus=4)
    mia = logged_in(client, "member", "mia")
    users(sessions, clock, "alice")
    project(sessions, clock, "vision", "mia")
    project(sessions, clock, "speech", "alice")
    a = submit(sessions, clock, user="mia", project="vision", name="train-a", gpus_per_node=2)
    tick(sessions, clock)
    c = submit(sessions, clock, user="alice", project="speech", gpus_per_node=1)
    tick(sessions, clock)
    d = submit(sessions, clock, user="mia", project="vision", name="quick", gpus_per_node=1)
    tick(sessions, clock)
    clock.advance(60)
    report(sessions, clock, d)
    clock.advance(60)
    b = submit(sessions, clock, user="mia", project="vision", name="big", nodes=2, gpus_per_node=4)
    tick(sessions, clock)
    assert [job(sessions, i).state for i in (a, b, c, d)] == [
        JobState.RUNNING,
        JobState.PENDING,
        JobState.RUNNING,
        JobState.COMPLETED,
    ]
    return Queue(a, b, c, d, mia)


def job_ids(html: str) -> list[int]:
    body = html.split('id="jobs"', 1)[1].split("</table>", 1)[0]
    return [int(i) for i in re.findall(r'<tr id="job-(\d+)" data-job', body)]


def cancel_buttons(html: str) -> set[int]:
    return {int(i) for i in re.findall(r'data-action="/api/v1/jobs/(\d+)/cancel"', html)}


def test_the_queue_lists_running_then_pending_then_ended_with_the_pending_reason(
    client: TestClient, queue: Queue
) -> None:
    browser = logged_in(client, "viewer", "vera")
    page = browser.get("/jobs")
    assert page.status_code == 200
    html = page.text
    assert job_ids(html) == [queue.c, queue.a, queue.b, queue.d]  # running, pending, ended; newest first
    assert 'aria-current="page">Jobs' in html
    row = html.split(f'<tr id="job-{queue.b}"', 1)[1].split("</tr>", 1)[0]
    assert '<span class="pill reason reason-resources">resources</span>' in row
    assert "not enough free GPUs on schedulable nodes" in row
    assert "2 × 4" in row
    running = html.split(f'<tr id="job-{queue.a}"', 1)[1].split("</tr>", 1)[0]
    assert re.search(r'<span class="mono">n[12]</span>', running)
    assert "00:02:00 / 01:00:00" in running
    assert 'data-tab="all" aria-current="page"' in html
    assert "4 jobs" in html
    assert 'hx-trigger="every 5s, refresh from:body"' in html


def test_the_queue_filters_on_the_server_and_the_address_follows(client: TestClient, queue: Queue) -> None:
    browser = logged_in(client)
    assert job_ids(browser.get("/jobs?state=running").text) == [queue.c, queue.a]
    assert job_ids(browser.get("/jobs?state=pending").text) == [queue.b]
    assert job_ids(browser.get("/jobs?state=ended").text) == [queue.d]
    assert job_ids(browser.get("/jobs?state=completed").text) == [queue.d]
    assert job_ids(browser.get("/jobs?state=failed").text) == []
    assert job_ids(browser.get("/jobs?user=alice").text) == [queue.c]
    assert job_ids(browser.get("/jobs?project=vision&state=running").text) == [queue.a]
    assert job_ids(browser.get("/jobs?user=nobody").text) == []
    filtered = browser.get("/jobs?project=vision&state=completed").text
    assert 'data-tab="ended" aria-current="page"' in filtered  # a final state is under Recent
    assert 'href="/jobs?project=vision&amp;state=pending"' in filtered  # tabs keep the other filters
    assert "1 matching, of 3 jobs" in filtered
    assert "<option selected>vision</option>" in filtered
    fragment = browser.get("/jobs?state=pending", headers={"HX-Request": "true"})
    assert fragment.text.lstrip().startswith('<section id="live"')
    assert "<html" not in fragment.text
    assert fragment.headers["vary"] == "HX-Request"
    for url, message in (("/jobs?state=maybe", "state is one of"), ("/jobs?page=2", "page is a number from 1 to 1")):
        answer = browser.get(url)
        assert answer.status_code == 400, url
        assert message in answer.text


def test_the_queue_pages_through_what_matched(
    client: TestClient, queue: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dashboard_jobs, "PAGE_SIZE", 3)
    browser = logged_in(client)
    first = browser.get("/jobs").text
    assert job_ids(first) == [queue.c, queue.a, queue.b]
    assert "1–3 of 4 jobs" in first
    assert 'rel="next" href="/jobs?page=2"' in first
    last = browser.get("/jobs?page=2").text
    assert job_ids(last) == [queue.d]
    assert 'rel="prev"' in last


def test_cancel_is_offered_to_the_jobs_user_and_job_admins_only(client: TestClient, queue: Queue) -> None:
    viewer = logged_in(client, "viewer", "vera")
    operator = logged_in(client, "operator", "otto")  # may submit jobs, but these are not his
    admin = logged_in(client, "admin", "ada")
    other = logged_in(client, "member", "max")
    assert cancel_buttons(viewer.get("/jobs").text) == set()
    assert cancel_buttons(operator.get("/jobs").text) == set()
    assert cancel_buttons(other.get("/jobs").text) == set()
    assert cancel_buttons(admin.get("/jobs").text) == {queue.a, queue.b, queue.c}  # not the ended one
    owner_browser = queue.mia
    shown = owner_browser.get("/jobs").text
    assert cancel_buttons(shown) == {queue.a, queue.b}
    assert 'data-confirm="Cancel job' in shown
    assert cancel_buttons(owner_browser.get(f"/jobs/{queue.a}").text) == {queue.a}
    assert cancel_buttons(owner_browser.get(f"/jobs/{queue.c}").text) == set()
    refused = operator.post(f"/api/v1/jobs/{queue.a}/cancel", headers=csrf_header(operator))
    assert refused.status_code == 403
    done = owner_browser.post(f"/api/v1/jobs/{queue.a}/cancel", headers=csrf_header(owner_browser))
    assert done.status_code == 200, done.text
    after = owner_browser.get("/jobs?state=cancelled").text
    assert job_ids(after) == [queue.a]
    assert cancel_buttons(after) == set()
    assert "cancelled by user:mia" in after


def _output(client: TestClient, job_id: int, *chunks: tuple[str, str]) -> None:
    """Output of the job's rank 0 of run 1, as its agent sends it: (stream, text) in order."""
    ctx = client.app.state.ctx  # type: ignore[attr-defined]
    rank = ranks(ctx.sessions, job_id)[0]
    node = node_id(ctx.sessions, rank.node)
    offsets: dict[str, int] = {}
    sent = []
    for stream, text in chunks:
        sent.append(
            (
                node,
                JobOutput(job_id=job_id, run=1, rank=0, stream=stream, offset=offsets.get(stream, 0), data=text),
            )
        )
        offsets[stream] = offsets.get(stream, 0) + len(text)
    with transaction(ctx.sessions) as s:
        assert output.store(s, ctx.clock, sent, 1_000_000) == len(sent)


def test_a_job_page_shows_its_request_ranks_and_output_to_its_user(client: TestClient, queue: Queue) -> None:
    lines = "".join(f"line {i:04d}\n" for i in range(250))
    _output(client, queue.a, ("stdout", lines[:1000]), ("stdout", lines[1000:]), ("stderr", "<b>oops</b>\n"))
    rank = ranks(client.app.state.ctx.sessions, queue.a)[0]  # type: ignore[attr-defined]
    page = queue.mia.get(f"/jobs/{queue.a}")
    assert page.status_code == 200
    html = page.text
    assert 'aria-current="page">Jobs' in html
    assert f'<tr data-run="1" data-rank="0" data-node="{rank.node}">' in html
    assert f'<a href="/nodes/{rank.node}">{rank.node}</a>' in html
    assert "<code>sleep 60</code>" in html
    shown = html.split('id="output"', 1)[1].split("</pre>", 1)[0]
    assert "line 0249" in shown
    assert "line 0051" in shown
    assert "line 0050" not in shown  # the last 200 lines: stderr's and 0051 to 0249
    assert "&lt;b&gt;oops&lt;/b&gt;" in shown
    assert 'id="output-earlier"' in html
    for metric in ("gpu_util", "fb_used_pct", "power_w"):
        assert f'data-chart="/api/v1/jobs/{queue.a}/gpu-charts?metric={metric}&amp;node={rank.node}&amp;run=1"' in html
    assert "line 0249" in logged_in(client, "admin", "ada").get(f"/jobs/{queue.a}").text

    viewer = logged_in(client, "viewer", "vera").get(f"/jobs/{queue.a}").text
    assert "The output is visible to its user (mia) and job admins." in viewer
    assert "line 0249" not in viewer
    assert "sleep 60" not in viewer
    assert "shown to its user and job admins" in viewer
    assert "data-action" not in viewer

    fragment = queue.mia.get(f"/jobs/{queue.a}", headers={"HX-Request": "true"})
    assert fragment.text.lstrip().startswith('<section id="live" class="job-detail"')
    assert "data-chart" not in fragment.text  # the charts are outside the live part


def test_a_pending_job_says_why_and_has_no_charts_yet_and_unknown_jobs_are_404(
    client: TestClient, queue: Queue
) -> None:
    html = queue.mia.get(f"/jobs/{queue.b}").text
    reason = html.split('id="job-reason"', 1)[1].split("</span></span>", 1)[0]
    assert '<span class="pill reason reason-resources">resources</span>' in reason
    assert 'id="no-charts"' in html
    assert "data-chart" not in html
    assert 'id="output-none"' in html
    for url in ("/jobs/999999", "/jobs/abc", "/jobs/0", f"/jobs/{2**64}"):
        answer = queue.mia.get(url)
        assert answer.status_code == 404, url
        assert "no such job" in answer.text
    assert queue.mia.get("/jobs/999999", headers={"HX-Request": "true"}).status_code == 404


def _chart(client: TestClient, job_id: int, **params: str) -> dict[str, list[float | None]]:
    answer = client.get(f"{API_PREFIX}/jobs/{job_id}/gpu-charts", params=params)
    assert answer.status_code == 200, answer.text
    chart = answer.json()
    return {s["label"]: s["values"] for s in chart["series"]}


def _seen(values: list[float | None]) -> set[float]:
    return {v for v in values if v is not None}


def test_a_jobs_charts_hold_only_its_gpus_while_it_held_them(client: TestClient, app: FastAPI, queue: Queue) -> None:
    ctx = app.state.ctx
    rank_a, rank_c = ranks(ctx.sessions, queue.a)[0], ranks(ctx.sessions, queue.c)[0]
    assert rank_a.node == rank_c.node  # packed onto one node, on different GPUs
    node = node_id(ctx.sessions, rank_a.node)
    placed = rank_a.assigned_at.timestamp()
    write_gpu_sample(client, node, [99.0] * 4, ts=placed - 30)  # before the job: not its time
    for ago in (20, 10):
        write_gpu_sample(client, node, [10.0, 20.0, 30.0, 40.0], ts=ctx.clock.now() - ago)
    utils = {0: 10.0, 1: 20.0, 2: 30.0, 3: 40.0}

    a = _chart(client, queue.a)
    assert list(a) == [f"GPU {i}" for i in rank_a.gpu_indexes]
    assert all(_seen(a[f"GPU {i}"]) == {utils[i]} for i in rank_a.gpu_indexes)
    c = _chart(client, queue.c, node=rank_c.node, run="1")
    assert list(c) == [f"GPU {i}" for i in rank_c.gpu_indexes]
    power = client.get(f"{API_PREFIX}/jobs/{queue.a}/gpu-charts", params={"metric": "power_w"}).json()
    assert (power["title"], power["unit"]) == ("GPU power", "W")
    times = power["t"]
    assert times[0] == placed
    assert times == sorted(times)
    assert times[-1] < ctx.clock.now()

    pending = client.get(f"{API_PREFIX}/jobs/{queue.b}/gpu-charts").json()
    assert (pending["t"], pending["series"]) == ([], [])
    for params, status, detail in (
        ({"metric": "password"}, 400, "no GPU chart"),
        ({"node": "elsewhere"}, 404, "has no rank on elsewhere"),
        ({"step": "1s", "metric": "gpu_util"}, 200, ""),
    ):
        answer = client.get(f"{API_PREFIX}/jobs/{queue.a}/gpu-charts", params=params)
        assert answer.status_code == status, (params, answer.text)
        assert detail in answer.text
    assert client.get(f"{API_PREFIX}/jobs/999999/gpu-charts").status_code == 404
    assert client.get(f"{API_PREFIX}/jobs/abc/gpu-charts").status_code == 422
    assert TestClient(app).get(f"{API_PREFIX}/jobs/{queue.a}/gpu-charts").status_code == 401

    # Cancelled (never started on its node, so its GPUs are free at once): what comes later is not its.
    for job_id in (queue.a, queue.c):
        assert client.post(f"{API_PREFIX}/jobs/{job_id}/cancel").status_code == 200
    ctx.clock.advance(30)
    write_gpu_sample(client, node, [77.0] * 4)
    ctx.clock.advance(30)
    assert 77.0 not in set().union(*(_seen(v) for v in _chart(client, queue.a).values()))

    # The big job now gets both nodes: charted together, each series is named by its node.
    tick(ctx.sessions, ctx.clock)
    assert job(ctx.sessions, queue.b).state is JobState.RUNNING
    both = _chart(client, queue.b)
    assert sorted(both) == sorted(f"{n} GPU {i}" for n in ("n1", "n2") for i in range(4))
    html = queue.mia.get(f"/jobs/{queue.b}").text
    assert html.count('class="rank-heading"') == 2


def test_usage_per_project_and_user_and_the_idle_gpus_jobs_hold(client: TestClient, queue: Queue) -> None:
    ctx = client.app.state.ctx  # type: ignore[attr-defined]
    report(ctx.sessions, ctx.clock, queue.a, state="running", outcome=None)
    rank_a = ranks(ctx.sessions, queue.a)[0]
    utils = [80.0] * 4
    utils[rank_a.gpu_indexes[0]] = 1.0  # one of the two GPUs mia's job holds does nothing
    write_gpu_sample(client, node_id(ctx.sessions, rank_a.node), utils)
    browser = logged_in(client, "viewer", "vera")
    page = browser.get("/jobs/usage")
    assert page.status_code == 200
    html = page.text
    assert 'aria-current="page">Jobs' in html
    table = html.split('id="usage"', 1)[1].split("</table>", 1)[0]
    assert re.findall(r'<tr data-key="([^"]+)"', table) == ["vision", "speech"]  # most GPU-hours first
    assert '<a href="/jobs?project=vision">vision</a>' in table
    idle = html.split('id="idle"', 1)[1].split("</table>", 1)[0]
    assert re.findall(r'data-job="(\d+)" data-node="([^"]+)" data-gpu="(\d+)"', idle) == [
        (str(queue.a), rank_a.node, str(rank_a.gpu_indexes[0]))
    ]
    assert '<span class="badge down" id="idle-count">1</span>' in html
    by_user = browser.get("/jobs/usage?by=user&range=30d").text
    assert re.findall(r'<tr data-key="([^"]+)"', by_user.split('id="usage"', 1)[1]) == ["mia", "alice"]
    assert 'data-range="30d" aria-current="page"' in by_user
    assert browser.get("/jobs/usage", headers={"HX-Request": "true"}).text.lstrip().startswith('<section id="live"')
    for url, message in (("/jobs/usage?range=1y", "range is one of"), ("/jobs/usage?by=node", "by is one of")):
        answer = browser.get(url)
        assert answer.status_code == 400, url
        assert message in answer.text


def test_the_overview_counts_jobs_and_the_top_bar_links_to_them(client: TestClient, queue: Queue) -> None:
    browser = logged_in(client, "viewer", "vera")
    html = browser.get("/").text
    assert (stat(html, "jobs-running"), stat(html, "jobs-pending")) == ("2", "1")
    assert 'href="/jobs?state=pending"' in html
    assert re.search(r'<nav aria-label="Main">.*<a href="/jobs">Jobs</a>', html, re.S)
    anonymous = TestClient(client.app)
    for path in ("/jobs", f"/jobs/{queue.a}", "/jobs/usage"):
        assert anonymous.get(path, follow_redirects=False).headers["location"] == "/login"
    assert anonymous.get("/jobs", headers={"HX-Request": "true"}).headers["hx-redirect"] == "/login"


def test_a_job_arrays_pending_tasks_are_one_row_that_cancels_the_array(client: TestClient, queue: Queue) -> None:
    ctx = client.app.state.ctx  # type: ignore[attr-defined]
    sessions, clock = ctx.sessions, ctx.clock
    first = submit(sessions, clock, user="mia", project="vision", name="sweep", gpus_per_node=4, array="0-4%2")
    html = queue.mia.get("/jobs?state=pending").text
    # B and one row for the array's five pending tasks, as squeue shows them; the tab counts rows.
    assert job_ids(html) == [first, queue.b] or job_ids(html) == [queue.b, first]
    assert f"{first}_[0-4%2]</a>" in html
    assert 'data-tab="pending"' in html
    assert re.search(r'data-tab="pending"[^>]*>Pending <span class="badge">2</span>', html)
    assert f'data-action="/api/v1/jobs/arrays/{first}/cancel"' in html  # mia's array: she may cancel it all
    assert f'data-action="/api/v1/jobs/{first}/cancel"' not in html
    cancelled = queue.mia.post(f"/api/v1/jobs/arrays/{first}/cancel", headers=csrf_header(queue.mia))
    assert cancelled.status_code == 200, cancelled.text
    ended = queue.mia.get("/jobs?state=ended").text
    assert f"{first}_[" not in ended  # ended tasks are listed one by one...
    assert f"{first + 4}</a>" not in ended
    assert f"{first}_4</a>" in ended  # ...each with its place in the array
