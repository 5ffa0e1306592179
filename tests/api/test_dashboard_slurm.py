"""Under Slurm the dashboard shows Slurm's side next to gpufleet's: each node's Slurm state and who drained
it, each job's Slurm id and partition."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from fastapi.testclient import TestClient

from gpufleet.core.db import transaction
from gpufleet.jobs.models import Job, JobState
from tests.api.dashboard_helpers import logged_in
from tests.jobs.helpers import cluster, set_node

# Pages, forms and input parsing: HTTP translation, the same on both databases (the domain tests run both).
pytestmark = pytest.mark.one_database


def test_nodes_and_jobs_show_slurms_side(client: TestClient) -> None:
    ctx = client.app.state.ctx  # type: ignore[attr-defined]
    cluster(ctx.sessions, ctx.clock, nodes=2, gpus=4)
    when = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)
    set_node(ctx.sessions, "n1", wlm_state="drained", drained_at=when, drain_reason="bad fan", drained_by="slurm:root")
    set_node(ctx.sessions, "n2", wlm_state="mixed")
    with transaction(ctx.sessions) as s:
        job = Job(
            name="by-hand",
            user="nobody",
            submitted_by="slurm",
            state=JobState.RUNNING,
            reason="running in Slurm as job 812",
            nodes=1,
            gpus_per_node=2,
            time_limit_s=600,
            argv=[],
            env={},
            backend="slurm",
            external_id="812",
            partition="gpu",
            allocation={"n2": [0, 1]},
            submitted_at=when,
            started_at=when,
        )
        s.add(job)
        s.flush()
        job_id = job.id
    browser = logged_in(client, "admin", "ada")

    nodes = browser.get("/nodes").text
    assert '<span class="pill wlm" title="Slurm\'s state for the node">slurm: drained</span>' in nodes
    assert "slurm: mixed" in nodes
    assert 'title="bad fan (slurm:root)">drained</span>' in nodes
    node = browser.get("/nodes/n1").text
    assert '<dd id="wlm-state">drained</dd>' in node
    assert "by slurm:root: bad fan" in node

    jobs = browser.get("/jobs").text
    assert (
        f'<a href="/jobs/{job_id}">{job_id}</a> <span class="muted small" title="Slurm\'s job id">slurm 812</span>'
        in jobs
    )
    detail = browser.get(f"/jobs/{job_id}").text
    assert '<dd id="slurm-job">812 <span class="muted">in partition gpu</span></dd>' in detail
