"""The node page (`/nodes/{name}`) and its charts' JSON (`/api/v1/nodes/{name}/gpu-charts`)."""

import json
import re
from datetime import UTC, datetime

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import delete, select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.api.served_routes import API_PREFIX
from gpufleet.core.clock import FakeClock
from gpufleet.core.db import transaction
from gpufleet.inventory import service as inventory
from gpufleet.inventory.models import Node
from gpufleet.inventory.states import NodeState
from gpufleet.monitoring import node_series, store
from gpufleet.monitoring.models import Alert, MetricSample
from gpufleet.protocol.inventory import GpuInfo, NodeInventory
from gpufleet.protocol.metrics import EntityValues, Sample
from tests.api.dashboard_helpers import logged_in

# Pages, forms and input parsing: HTTP translation, the same on both databases (the domain tests run both).
pytestmark = pytest.mark.one_database

T0 = 1_800_000_000.0  # FakeClock's start, a minute boundary
CHARTS = f"{API_PREFIX}/nodes/gpu001/gpu-charts"


@pytest.fixture
def app(client: TestClient) -> FastAPI:
    app: FastAPI = client.app  # type: ignore[assignment]
    return app


def _gpu(index: int) -> GpuInfo:
    return GpuInfo(
        index=index,
        uuid=f"GPU-0000000{index}-aaaa-bbbb-cccc-dddddddddddd",
        model="NVIDIA H100 80GB HBM3",
        pci_bus_id=f"00000000:{index + 0x18:02X}:00.0",
        memory_total_mib=81_559,
        driver_version="550.54.15",
        cuda_version="12.4",
        vbios_version="96.00.99.00.01",
        ecc_mode="enabled",
        mig_mode="disabled",
        power_limit_w=700.0,
    )


def _sample(ts: float, gpus: dict[int, tuple[float, float, float]]) -> Sample:
    """Per GPU index: (gpu_util, fb_used_mib, fb_free_mib); temperature and power follow utilization."""
    return Sample(
        ts=ts,
        entities=[EntityValues(entity="host", values={"cpu_util": 12.0})]
        + [
            EntityValues(
                entity=f"gpu:{i}",
                values={
                    "gpu_util": util,
                    "fb_used_mib": used,
                    "fb_free_mib": free,
                    "gpu_temp_c": 30 + util / 2,
                    "power_w": 100 + util,
                },
            )
            for i, (util, used, free) in gpus.items()
        ],
    )


def _add_node(sessions: sessionmaker[Session], clock: FakeClock, name: str = "gpu001", gpus: int = 2) -> int:
    with transaction(sessions) as s:
        node = inventory.join(s, clock, name)
        inventory.apply_inventory(
            s,
            clock,
            node,
            NodeInventory(
                hostname=f"{name}.cluster.example",
                cpus=96,
                cpu_model="AMD EPYC 9454",
                memory_total_mib=1_048_576,
                os_name="Ubuntu 22.04.4 LTS",
                kernel="5.15.0-105-generic",
                arch="x86_64",
                agent_version="0.9.1",
                gpu_source="nvml",
                gpus=[_gpu(i) for i in range(gpus)],
            ),
        )
        return node.id


def _hour_of_samples(sessions: sessionmaker[Session], node_id: int) -> None:
    """Every 5 s over [T0, T0 + 3600): GPU 0's utilization is the sample's number, GPU 1's is 50."""
    samples = [_sample(T0 + 5 * i, {0: (float(i), 20.0, 60.0), 1: (50.0, 40.0, 40.0)}) for i in range(720)]
    with transaction(sessions) as s:
        store.write_rows(s, store.sample_rows(node_id, samples))


@pytest.fixture
def gpu001(client: TestClient, app: FastAPI, sessions: sessionmaker[Session], clock: FakeClock) -> int:
    """gpu001: two GPUs of three expected (one fell off), failed because of GPU 1, an hour of samples,
    up then down, a resolved and a firing alert, drained by the admin; and gpu0011, drained too."""
    node_id = _add_node(sessions, clock)
    _add_node(sessions, clock, "gpu0011")
    _hour_of_samples(sessions, node_id)
    with transaction(sessions) as s:
        inventory.transition(s, clock, node_id, NodeState.NEW, NodeState.UP, "first heartbeat")
    clock.advance(600)
    with transaction(sessions) as s:
        node = s.get(Node, node_id)
        assert node is not None
        node.expected_gpus = 3
        node.health = "failed"
        node.health_reasons = ["GPU 1: Xid 79 (fallen off the bus)", "GPU 2 missing (3 expected, 2 found)"]
        node.health_since = datetime.fromtimestamp(clock.now(), UTC)
        s.add_all(
            [
                Alert(
                    fingerprint="a1",
                    rule="GpuTempHigh",
                    severity="warning",
                    status="resolved",
                    node_id=node_id,
                    node_name="gpu001",
                    gpu=0,
                    summary="GPU 0 at 91 C",
                    starts_at=datetime.fromtimestamp(T0 + 60, UTC),
                    ends_at=datetime.fromtimestamp(T0 + 300, UTC),
                ),
                Alert(
                    fingerprint="a2",
                    rule="NodeFailed",
                    severity="critical",
                    status="firing",
                    node_id=node_id,
                    node_name="gpu001",
                    summary="gpu001 failed: GPU 1: Xid 79",
                    starts_at=datetime.fromtimestamp(clock.now(), UTC),
                ),
            ]
        )
    clock.advance(60)
    assert client.post("/api/v1/nodes/gpu001/drain", json={"reason": "Xid 79 on GPU 1"}).status_code == 200
    assert client.post("/api/v1/nodes/gpu0011/drain", json={"reason": "another node"}).status_code == 200
    clock.advance(60)
    with transaction(sessions) as s:
        inventory.transition(s, clock, node_id, NodeState.UP, NodeState.DOWN, "no heartbeat for 30 s")
    return node_id


def _row(page: str, gpu: int) -> str:
    found = re.search(rf'<tr data-gpu="{gpu}".*?</tr>', page, re.DOTALL)
    assert found is not None, f"no row for GPU {gpu}"
    return found.group(0)


def test_the_node_page_shows_inventory_gpus_and_history(client: TestClient, app: FastAPI, gpu001: int) -> None:
    page = logged_in(client, "admin", "ann").get("/nodes/gpu001")
    assert page.status_code == 200
    text = page.text
    assert "<title>gpu001 — gpufleet</title>" in text
    assert 'aria-current="page">Nodes' in text
    for fact in ("gpu001.cluster.example", "96 × AMD EPYC 9454", "1024.0 GiB", "Ubuntu 22.04.4 LTS", "x86_64", "0.9.1"):
        assert fact in text
    assert 'id="node-state">down<' in text
    assert 'id="node-health">failed<' in text
    assert "<li>GPU 1: Xid 79 (fallen off the bus)</li>" in text
    assert re.search(r'id="drain">since 2027-01-15 08:11:00 .* by token:initial admin#1: Xid 79 on GPU 1</dd>', text)
    # GPUs: 0 is ok with its latest values (sample 719), 1 is faulty, 2 is missing.
    gpu0, gpu1, gpu2 = _row(text, 0), _row(text, 1), _row(text, 2)
    assert ">ok<" in gpu0
    assert "GPU-00000000-aaaa-bbbb-cccc-dddddddddddd" in gpu0
    assert "00000000:18:00.0" in gpu0
    assert "80 GiB" in gpu0
    assert "550.54.15" in gpu0
    assert "700 W" in gpu0
    assert "719 %" in gpu0  # the newest sample's utilization
    assert "25 %" in gpu0  # memory used: 20 of 80 MiB
    assert ">faulty<" in gpu1
    assert "Xid 79 (fallen off the bus)" in gpu1
    assert "50 %" in gpu1
    assert ">missing<" in gpu2
    assert "not in the inventory" in gpu2
    # Events, newest first: down, the drain (not gpu0011's), NodeFailed, resolved GpuTempHigh, ..., up.
    events = re.findall(r'<tr data-kind="(\w+)">\s*<td>[^<]*</td><td class="\w+">([^<]*)</td>', text)
    assert events[0] == ("state", "up → down")
    assert events[1] == ("audit", "monitoring.drain_node")
    assert events[2] == ("alert", "NodeFailed fired (firing)")
    assert events[3] == ("resolved", "GpuTempHigh resolved")
    assert events[4] == ("alert", "GpuTempHigh fired")
    assert events[-1] == ("state", "new → up")
    assert len(events) == 6
    assert "/api/v1/nodes/gpu001/drain" in text
    assert "gpu0011" not in text
    # Charts, outside the live part, for the hour unless asked otherwise.
    live_end = text.index("</section>", text.index('id="live"'))
    charts = re.findall(r'data-chart="([^"]+)"', text)
    assert len(charts) == 4
    assert all(text.index(url) > live_end for url in charts)
    assert f"{CHARTS}?metric=gpu_util&amp;since=1h" in charts
    assert "charts.js" in text
    assert 'data-range="1h" aria-current="page"' in text
    day = logged_in(client, "viewer", "dan").get("/nodes/gpu001?range=1d").text
    assert f"{CHARTS}?metric=power_w&amp;since=1d" in day
    assert 'data-range="1d" aria-current="page"' in day


def test_only_admins_see_the_audit_records_on_the_page(client: TestClient, app: FastAPI, gpu001: int) -> None:
    page = logged_in(client, "operator", "olga").get("/nodes/gpu001").text
    assert "monitoring.drain_node" not in page
    assert "NodeFailed fired" in page


def test_an_unknown_node_or_range_is_an_error_page(client: TestClient, app: FastAPI, gpu001: int) -> None:
    browser = logged_in(client, "viewer", "vic")
    missing = browser.get("/nodes/nope")
    assert missing.status_code == 404
    assert "no such node: nope" in missing.text
    assert "<html" in missing.text
    fragment = browser.get("/nodes/nope", headers={"HX-Request": "true"})
    assert fragment.status_code == 404
    assert "<html" not in fragment.text
    assert browser.get("/nodes/gpu001?range=1y").status_code == 400


def test_the_drain_button_is_for_those_who_may_drain(client: TestClient, app: FastAPI, gpu001: int) -> None:
    viewer = logged_in(client, "viewer", "vera").get("/nodes/gpu0011").text
    operator = logged_in(client, "operator", "otto").get("/nodes/gpu0011").text
    assert "gpu0011" in viewer
    assert "data-action=" not in viewer
    assert 'data-action="/api/v1/nodes/gpu0011/resume"' in operator  # drained: the button resumes
    assert client.post("/api/v1/nodes/gpu0011/resume").status_code == 200
    operator = logged_in(client, "operator", "oleg").get("/nodes/gpu0011").text
    assert 'data-action="/api/v1/nodes/gpu0011/drain"' in operator


def test_an_htmx_request_gets_the_live_part_alone(client: TestClient, app: FastAPI, gpu001: int) -> None:
    browser = logged_in(client, "viewer", "vi")
    fragment = browser.get("/nodes/gpu001", headers={"HX-Request": "true"})
    assert fragment.status_code == 200
    assert fragment.text.lstrip().startswith('<section id="live"')
    assert 'hx-get="/nodes/gpu001"' in fragment.text
    assert 'hx-trigger="every 5s' in fragment.text
    assert "<html" not in fragment.text
    assert "data-chart" not in fragment.text  # the charts are not redrawn with the live part
    assert "GPU-00000001-aaaa-bbbb-cccc-dddddddddddd" in fragment.text


def test_gpu_charts_have_one_series_per_gpu_averaged_per_step(client: TestClient, app: FastAPI, gpu001: int) -> None:
    clock: FakeClock = client.app.state.ctx.clock  # type: ignore[attr-defined]
    clock.advance(T0 + 3600 - clock.now())  # the samples are the last hour
    chart = client.get(CHARTS, params={"metric": "gpu_util", "since": "1h", "step": "1m"}).json()
    assert chart["title"] == "GPU utilization"
    assert chart["unit"] == "%"
    assert chart["t"] == [T0 + 60 * k for k in range(60)]
    assert [s["label"] for s in chart["series"]] == ["GPU 0", "GPU 1", "GPU 2"]  # 2: missing, reported nothing
    gpu0, gpu1, gpu2 = (s["values"] for s in chart["series"])
    assert gpu0 == [12 * k + 5.5 for k in range(60)]  # the mean of samples 12k .. 12k+11
    assert gpu1 == [50.0] * 60
    assert gpu2 == [None] * 60
    memory = client.get(CHARTS, params={"metric": "fb_used_pct", "step": "1m"}).json()
    assert memory["series"][0]["values"][:2] == [25.0, 25.0]
    assert memory["series"][1]["values"][:2] == [50.0, 50.0]
    default = client.get(CHARTS).json()  # gpu_util over the hour in about 120 steps (30 s)
    assert default["t"][:2] == [T0, T0 + 30]
    assert len(default["t"]) == 120
    assert default["series"][0]["values"][0] == 2.5  # the mean of samples 0..5
    clock.advance(120)
    later = client.get(CHARTS).json()
    assert later["t"][0] == T0 + 120  # steps stay on multiples of the step
    assert later["series"][0]["values"][-5] == 716.5  # samples 714 .. 719, the last of the hour
    assert later["series"][0]["values"][-4:] == [None] * 4  # nothing after the hour: gaps, not a line


def test_gpu_charts_read_rollups_where_they_are_written(
    client: TestClient, app: FastAPI, gpu001: int, sessions: sessionmaker[Session]
) -> None:
    clock: FakeClock = client.app.state.ctx.clock  # type: ignore[attr-defined]
    clock.advance(T0 + 3600 - clock.now())
    with transaction(sessions) as s:
        assert store.rollup(s, until=T0 + 3600) > 0
        s.execute(delete(MetricSample))  # what the chart shows now comes from the roll-ups alone
    chart = client.get(CHARTS, params={"metric": "gpu_util", "since": "1d"}).json()
    assert chart["t"][1] - chart["t"][0] == 720  # a day in 120 steps of 12 minutes
    assert T0 in chart["t"]
    at = chart["t"].index(T0)
    gpu0 = chart["series"][0]["values"]
    assert gpu0[:at] == [None] * at
    assert gpu0[at : at + 5] == [144 * k + 71.5 for k in range(5)]  # the mean of samples 144k .. 144k+143
    memory = client.get(CHARTS, params={"metric": "fb_used_pct", "since": "1d"}).json()
    assert memory["series"][0]["values"][at] == pytest.approx(25.0)


def test_raw_samples_fill_in_after_the_newest_rollup(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    node_id = _add_node(sessions, clock, "solo", gpus=1)
    with transaction(sessions) as s:
        store.write_rows(s, store.sample_rows(node_id, [_sample(T0 + 5 * i, {0: (10.0, 1, 1)}) for i in range(12)]))
        assert store.rollup(s, until=T0 + 60) == 1
        s.execute(delete(MetricSample))
        store.write_rows(
            s, store.sample_rows(node_id, [_sample(T0 + 60 + 5 * i, {0: (40.0, 1, 3)}) for i in range(12)])
        )
    retention = store.Retention()
    with transaction(sessions, readonly=True) as s:
        found = node_series.gpu_series(s, node_id, "gpu_util", T0, T0 + 120, 120, retention, T0 + 120)
        assert found == {"gpu:0": [(T0, 25.0)]}  # 12 rolled up at 10, 12 raw at 40
        found = node_series.gpu_series(s, node_id, "fb_used_pct", T0, T0 + 120, 60, retention, T0 + 120)
        assert found == {"gpu:0": [(T0, 50.0), (T0 + 60, 25.0)]}
        with pytest.raises(ValueError, match="no GPU series"):
            node_series.gpu_series(s, node_id, "energy_mj", T0, T0 + 120, 60, retention, T0 + 120)
        with pytest.raises(ValueError, match="larger step"):
            node_series.gpu_series(s, node_id, "gpu_util", T0, T0 + 86_400, 1, retention, T0)
        newest = node_series.latest(s, node_id, T0)
        assert newest is not None
        assert newest[0] == T0 + 115
        assert newest[1]["gpu:0"]["gpu_util"] == 40.0
        assert node_series.latest(s, node_id, T0 + 116) is None
        assert s.scalar(select(MetricSample.ts).order_by(MetricSample.ts).limit(1)) == T0 + 60


def test_gpu_charts_refuse_bad_input_and_anonymous_callers(client: TestClient, app: FastAPI, gpu001: int) -> None:
    bad_metric = client.get(CHARTS, params={"metric": "energy_mj"})
    assert bad_metric.status_code == 400
    assert "gpu_util" in bad_metric.json()["detail"]
    assert client.get(CHARTS, params={"since": "forever"}).status_code == 400
    assert client.get(CHARTS, params={"since": "365d"}).status_code == 400
    assert client.get(CHARTS, params={"since": "1d", "step": "1s"}).status_code == 400  # too many points
    assert client.get(f"{API_PREFIX}/nodes/nope/gpu-charts").status_code == 404
    anonymous = TestClient(app)
    assert anonymous.get(CHARTS).status_code == 401
    assert anonymous.get("/nodes/gpu001", follow_redirects=False).headers["location"] == "/login"
    viewer = logged_in(client, "viewer", "val")  # a browser's session is enough, as for charts.js
    assert viewer.get(CHARTS).status_code == 200


def test_rows_written_before_summaries_still_chart(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    """Rows stored before the `summary` column existed have only their full values: charts read those."""
    node_id = _add_node(sessions, clock, "old", gpus=1)
    row = {"gpu:0": {"fb_free_mib": 30.0, "gpu_util": 12.5, "fb_used_mib": 10.0}, "host": {"gpu_util": 77.0}}
    with transaction(sessions) as s:
        s.add(MetricSample(node_id=node_id, ts=T0, values=json.dumps(row)))
        store.write_rows(s, store.sample_rows(node_id, [_sample(T0 + 5, {0: (87.5, 10.0, 30.0)})]))
    with transaction(sessions, readonly=True) as s:
        args = (T0, T0 + 60, 60, store.Retention(), T0 + 60)
        assert node_series.gpu_series(s, node_id, "gpu_util", *args) == {"gpu:0": [(T0, 50.0)]}
        assert node_series.gpu_series(s, node_id, "fb_used_pct", *args) == {"gpu:0": [(T0, 25.0)]}
