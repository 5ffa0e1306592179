"""Each simulated fault changes what the agent's real collectors report, and heal undoes it."""

from __future__ import annotations

import asyncio
import csv
from pathlib import Path

import pytest

from gpufleet.agent.gpu.nvml import NvmlReader
from gpufleet.agent.metrics.gpu import GpuCollector
from gpufleet.agent.metrics.infiniband import IbCollector
from gpufleet.agent.metrics.sampler import Sampler
from gpufleet.agent.metrics.xid import XidBook, XidWatcher
from gpufleet.core.errors import InvalidInput
from gpufleet.protocol.metrics import NodeEvent
from gpufleet.sim.faults import SimulatedFaults
from gpufleet.sim.infiniband import SimulatedInfiniband
from gpufleet.sim.nvml import SimulatedNvml
from gpufleet.sim.runner import SimOptions, Simulation

SNAPSHOT = Path(__file__).resolve().parent.parent / "fixtures" / "infiniband" / "ib-sysfs-h100-snapshot.csv"
THERMAL = 0x20 | 0x40  # nvmlClocksEventReasonSwThermalSlowdown | HwThermalSlowdown


class Node:
    """One simulated node read through the agent's own collectors, as the simulator wires them."""

    def __init__(self) -> None:
        self.nvml = SimulatedNvml("sim001")
        self.ib = SimulatedInfiniband(4)
        self.faults = SimulatedFaults(self.nvml, self.ib)
        xids = XidBook()
        self.watcher = XidWatcher(self.nvml, xids, blocking=False)
        self.sampler = Sampler([GpuCollector(self.nvml, xids=xids), IbCollector(self.ib)])
        self.watcher.poll(0)
        self.sample()

    def sample(self) -> tuple[dict[str, dict[str, float]], list[NodeEvent]]:
        sample, events = self.sampler.collect()
        return {e.entity: e.values for e in sample.entities}, events

    def xids(self) -> list[tuple[int | None, int | None]]:
        return [(e.gpu, e.code) for e in self.watcher.poll(0)]

    def inventory_gpus(self) -> int:
        return len(NvmlReader(self.nvml, source="simulated").read())


@pytest.fixture
def node() -> Node:
    return Node()


def test_xid79_the_gpu_falls_off_the_bus(node: Node) -> None:
    node.faults.inject("xid79", 5)

    assert node.xids() == [(5, 79)]
    values, events = node.sample()
    assert "gpu:5" not in values
    assert [(e.kind, e.gpu) for e in events] == [("gpu_lost", 5)]
    assert node.inventory_gpus() == 7  # the inventory lists the GPUs that still answer
    assert node.sample()[1] == []  # said once

    node.faults.heal()
    values, _ = node.sample()
    assert "gpu:5" in values
    assert values["gpu:5"]["xid_last"] == 79  # the agent remembers what it saw
    assert node.inventory_gpus() == 8


def test_ecc_dbe_counts_rise_and_a_row_remap_waits(node: Node) -> None:
    node.faults.inject("ecc-dbe", 2)

    assert node.xids() == [(2, 48)]
    gpu = node.sample()[0]["gpu:2"]
    assert (gpu["ecc_dbe_volatile"], gpu["ecc_dbe_aggregate"]) == (1, 1)
    assert (gpu["remapped_rows_uncorrectable"], gpu["remapped_rows_pending"]) == (1, 1)
    assert node.sample()[0]["gpu:3"]["ecc_dbe_volatile"] == 0

    node.faults.heal()
    gpu = node.sample()[0]["gpu:2"]
    assert (gpu["ecc_dbe_volatile"], gpu["ecc_dbe_aggregate"], gpu["remapped_rows_pending"]) == (0, 1, 0)


def test_thermal_hot_and_slowed_down_for_as_long_as_it_lasts(node: Node) -> None:
    normal = node.sample()[0]["gpu:0"]
    node.faults.inject("thermal", None)  # GPU 0 by default

    for _ in range(3):
        gpu = node.sample()[0]["gpu:0"]
        assert gpu["gpu_temp_c"] >= 90
        assert gpu["mem_temp_c"] >= 90
        assert int(gpu["clocks_event_reasons"]) & THERMAL == THERMAL
        assert gpu["sm_clock_mhz"] < normal["sm_clock_mhz"]
    assert node.xids() == []

    node.faults.heal()
    gpu = node.sample()[0]["gpu:0"]
    assert gpu["gpu_temp_c"] < 50
    assert int(gpu["clocks_event_reasons"]) & THERMAL == 0


def test_nvlink_down_takes_links_out(node: Node) -> None:
    node.faults.inject("nvlink-down", 7)

    assert node.xids() == [(7, 74)]
    gpu = node.sample()[0]["gpu:7"]
    assert (gpu["nvlink_links_up"], gpu["nvlink_links_total"]) == (16, 18)
    assert gpu["nvlink_recovery_errors"] > 0

    node.faults.heal()
    assert node.sample()[0]["gpu:7"]["nvlink_links_up"] == 18


def test_ib_down_puts_a_port_in_polling(node: Node) -> None:
    node.faults.inject("ib-down", 1)  # the second port

    port = node.sample()[0]["ib:mlx5_1/1"]
    assert (port["ib_state"], port["ib_phys_state"], port["ib_link_downed"]) == (1, 2, 1)
    assert node.sample()[0]["ib:mlx5_0/1"]["ib_state"] == 4

    node.faults.heal()
    port = node.sample()[0]["ib:mlx5_1/1"]
    assert (port["ib_state"], port["ib_phys_state"], port["ib_link_downed"]) == (4, 5, 1)  # counters keep counting


def test_gpu_missing_the_count_drops_by_one(node: Node) -> None:
    node.faults.inject("gpu-missing", 6)

    values, events = node.sample()
    assert sorted(k for k in values if k.startswith("gpu:")) == [f"gpu:{i}" for i in range(7)]
    assert [(e.kind, e.gpu) for e in events] == [("gpu_lost", 6)]
    assert "no longer listed" in events[0].message
    assert node.inventory_gpus() == 7

    node.faults.heal()
    assert len([k for k in node.sample()[0] if k.startswith("gpu:")]) == 8


@pytest.mark.parametrize(
    ("kind", "gpu", "message"),
    [
        ("meltdown", 0, "no fault 'meltdown'"),
        ("thermal", 8, "no GPU 8"),
        ("ib-down", 4, "no InfiniBand port 4"),
        ("node-crash", 0, "no fault 'node-crash'"),  # the agent's own fault, never the hardware's
    ],
)
def test_faults_the_node_cannot_take_are_refused(node: Node, kind: str, gpu: int, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        node.faults.inject(kind, gpu)


def test_a_gone_gpu_takes_no_second_fault(node: Node) -> None:
    node.faults.inject("xid79", 1)

    with pytest.raises(InvalidInput, match="already gone"):
        node.faults.inject("ecc-dbe", 1)


def test_a_healthy_simulated_port_reads_like_the_real_h100_ports() -> None:
    with SNAPSHOT.open() as f:
        real = next(csv.DictReader(f))
    ib = SimulatedInfiniband(1)

    assert [ib.read("mlx5_0", 1, a).strip() for a in ("state", "phys_state", "rate")] == [  # type: ignore[union-attr]
        real["state"],
        real["phys_state"],
        real["rate"],
    ]


def test_the_simulator_gives_each_node_collectors_and_a_fault_target() -> None:
    simulation = Simulation(SimOptions(server="http://127.0.0.1:9", join_token=None, nodes=2))
    quiet = Simulation(SimOptions(server="http://127.0.0.1:9", join_token=None, nodes=1, metrics_interval_s=None))
    simulation.build()
    quiet.build()

    options = simulation.agents["sim001"].options
    assert options.metrics is not None
    assert options.events is not None
    assert not options.events.blocking  # polled on the loop, not a thread per node
    assert options.faults is not None
    sample, _ = options.metrics.collect()
    assert {e.entity for e in sample.entities} >= {"host", "disk:/", "nic:eth0", "gpu:0", "gpu:7", "ib:mlx5_3/1"}
    assert quiet.agents["sim001"].options.metrics is None
    assert quiet.agents["sim001"].options.faults is not None  # node-crash and agent-hang still work
    asyncio.run(simulation.close())
    asyncio.run(quiet.close())
