"""The agent's optional local /metrics: the latest sample it sent, under dcgm-exporter's names, over
a real HTTP server on loopback."""

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.agent.exposition import INVENTORY_TTL_S, AgentMetrics, KeepLatest, serve
from gpufleet.core.config import load_settings
from gpufleet.core.errors import ConfigError
from gpufleet.protocol.inventory import GpuInfo, NodeInventory
from gpufleet.protocol.metrics import EntityValues, GpuJob, NodeEvent, Sample

INVENTORY = NodeInventory(
    hostname="gpu-a01.lab",
    cpus=8,
    memory_total_mib=1024,
    gpu_source="nvml",
    gpus=[GpuInfo(index=0, uuid="GPU-abc", model="NVIDIA H200", pci_bus_id="00000000:18:00.0", memory_total_mib=1)],
)


class Source:
    def __init__(self) -> None:
        self.rounds = 0

    def collect(self) -> tuple[Sample, list[NodeEvent]]:
        self.rounds += 1
        values = {"gpu_util": 10.0 * self.rounds, "energy_mj": 1e9}
        return Sample(ts=float(self.rounds), entities=[EntityValues(entity="gpu:0", values=values)]), []


class Inventory:
    def __init__(self, fail: bool = False) -> None:
        self.reads = 0
        self.fail = fail

    def __call__(self) -> NodeInventory:
        self.reads += 1
        if self.fail:
            raise RuntimeError("NVML: driver not loaded")
        return INVENTORY


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def served() -> Iterator[tuple[str, KeepLatest, Inventory, Clock]]:
    latest, inventory, clock = KeepLatest(Source()), Inventory(), Clock()
    server = serve(AgentMetrics("gpu-a01", latest, inventory, clock), "127.0.0.1:0")
    yield f"http://127.0.0.1:{server.server_address[1]}", latest, inventory, clock
    server.shutdown()
    server.server_close()


def test_it_serves_the_latest_sample_with_the_inventorys_labels(
    served: tuple[str, KeepLatest, Inventory, Clock],
) -> None:
    url, latest, inventory, clock = served
    empty = httpx.get(url + "/metrics")
    assert (empty.status_code, empty.text) == (200, "")  # nothing sampled yet
    latest.collect()
    sample, _ = latest.collect()  # passes the round through, keeps the latest
    assert latest.latest() == sample
    response = httpx.get(url + "/metrics")
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    families = {f.name: f for f in text_string_to_metric_families(response.text)}
    (util,) = families["DCGM_FI_DEV_GPU_UTIL"].samples
    assert util.value == 20.0
    assert util.labels["UUID"] == "GPU-abc"
    assert util.labels["Hostname"] == "gpu-a01.lab"
    assert util.labels["node"] == "gpu-a01"
    assert "\nDCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{" in response.text
    httpx.get(url + "/metrics")
    assert inventory.reads == 1  # GPU labels are read once, not per scrape
    clock.now += INVENTORY_TTL_S + 1
    httpx.get(url + "/metrics")
    assert inventory.reads == 2
    assert httpx.get(url + "/other").status_code == 404


def test_without_an_inventory_the_values_still_go_out() -> None:
    latest = KeepLatest(Source())
    latest.collect()
    text = AgentMetrics("gpu-a01", latest, Inventory(fail=True)).render().decode()
    (util,) = next(f for f in text_string_to_metric_families(text) if f.name == "DCGM_FI_DEV_GPU_UTIL").samples
    assert (util.value, util.labels["UUID"], util.labels["Hostname"]) == (10.0, "", "gpu-a01")


def test_gpus_held_by_slurm_jobs_carry_hpc_job_as_dcgm_exporter_labels_them() -> None:
    class Mapped(Source):
        def collect(self) -> tuple[Sample, list[NodeEvent]]:
            sample, events = super().collect()
            entities = [*sample.entities, EntityValues(entity="gpu:1", values={"gpu_util": 1.0})]
            jobs = [GpuJob(gpu=0, job="41"), GpuJob(gpu=0, job="42"), GpuJob(gpu=3, job="43")]
            return sample.model_copy(update={"entities": entities, "gpu_jobs": jobs}), events

    latest = KeepLatest(Mapped())
    latest.collect()
    text = AgentMetrics("gpu-a01", latest, Inventory()).render().decode()

    util = next(f for f in text_string_to_metric_families(text) if f.name == "DCGM_FI_DEV_GPU_UTIL").samples
    by_gpu = {s.labels["gpu"]: s.labels for s in util}
    assert by_gpu["0"]["hpc_job"] == "41"  # shared by two jobs: the first listed
    assert by_gpu["0"]["UUID"] == "GPU-abc"  # the inventory's labels stay
    assert "hpc_job" not in by_gpu["1"]


def test_the_listen_setting_is_checked(tmp_path: Path) -> None:
    none = tmp_path / "none.toml"
    assert load_settings(client_file=none, agent_metrics_listen="0.0.0.0:9400").agent_metrics_listen == "0.0.0.0:9400"
    assert load_settings(client_file=none).agent_metrics_listen is None
    with pytest.raises(ConfigError, match="agent_metrics_listen"):
        load_settings(client_file=none, agent_metrics_listen="9400")


def test_a_port_in_use_is_a_config_error(served: tuple[str, KeepLatest, Inventory, Clock]) -> None:
    taken = served[0].rsplit(":", 1)[1]
    with pytest.raises(ConfigError, match=f"agent_metrics_listen 127.0.0.1:{taken}: cannot listen there"):
        serve(AgentMetrics("gpu-a01", KeepLatest(Source()), Inventory()), f"127.0.0.1:{taken}")
