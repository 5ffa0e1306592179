"""Burn-in steps on simulated nodes: healthy figures pass the built-in profiles' thresholds for each GPU model,
each weak part fails exactly the step that should catch it, heal restores, and bad command lines exit 2."""

from __future__ import annotations

import asyncio
import json
import re
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest
from typer.testing import CliRunner

from gpufleet.agent.jobs.ports import RankResult
from gpufleet.cli.app import app
from gpufleet.core.errors import InvalidInput
from gpufleet.lifecycle.profiles import Profile, Step, load_profiles
from gpufleet.protocol.burnin import GPU_KINDS, KINDS, MULTI_NODE_KINDS, BadResult, StepResult, parse_result
from gpufleet.protocol.jobs import JobStart
from gpufleet.protocol.metrics import FAULT_KINDS
from gpufleet.sim.burnin import WEAK_FAULTS, BurninFaults
from gpufleet.sim.burnin_figures import GPU_FIGURES
from gpufleet.sim.faults import SimulatedFaults
from gpufleet.sim.infiniband import SimulatedInfiniband
from gpufleet.sim.jobs import BURNIN_TIME_SCALE, SimulatedExecutor
from gpufleet.sim.nvml import SimulatedNvml
from gpufleet.sim.runner import NodeFault, SimOptions, Simulation, node_names, parse_fault

PROBE = Path(__file__).resolve().parents[1] / "fixtures" / "h200" / "nvml-probe.json"
PROFILES, PROBLEMS = load_profiles()
MODELS = ("H200", "H100", "A100")


class FakeTime:
    """An asyncio.sleep stand-in: time moves by what is slept, at once."""

    def __init__(self) -> None:
        self.now = 0.0

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        await asyncio.sleep(0)


class Node:
    """One simulated node with its executor and fault target, as the simulator wires them."""

    def __init__(self, name: str = "sim001", gpus: int = 8, model: str = "H200", **executor: Any) -> None:
        self.nvml = SimulatedNvml(name, gpu_count=gpus, gpu_model=model)
        self.faults = SimulatedFaults(self.nvml, SimulatedInfiniband(4), BurninFaults(gpus))
        self.time = FakeTime()
        self.executor = SimulatedExecutor(
            self.nvml, clock_sleep=self.time.sleep, burnin_faults=self.faults.burnin, **executor
        )

    @classmethod
    def of(cls, executor: SimulatedExecutor, faults: SimulatedFaults) -> Node:
        """A node the simulator built, its time made fake."""
        node = cls.__new__(cls)
        node.nvml, node.executor, node.faults, node.time = executor.nvml, executor, faults, FakeTime()
        executor.sleep = node.time.sleep
        return node

    @property
    def gpu_model(self) -> str | None:
        """The model name the head keys thresholds by (None: no GPU)."""
        return self.nvml.model.name if self.nvml.gpus else None

    def run(self, argv: Sequence[str], gpus: Sequence[int] | None = None, **fields: Any) -> Ran:
        indexes = list(range(len(self.nvml.gpus))) if gpus is None else list(gpus)
        return Ran(self, list(argv), indexes, fields)

    def step(self, step: Step, **fields: Any) -> Ran:
        """Run a profile's step; a pair step as rank 0 of two, as the head pairs nodes."""
        if step.multi_node:
            fields = {"rank": 0, "world_size": 2} | fields
        return self.run(step.argv(), **fields)


class Ran:
    """One rank of a step job run to its end: what it wrote, how it ended, the GPUs' load meanwhile."""

    def __init__(self, node: Node, argv: list[str], gpus: list[int], fields: dict[str, Any]) -> None:
        base: dict[str, Any] = {"job_id": 7, "run": 1, "rank": 0, "world_size": 1, "user": "root"}
        self.launch = JobStart(**(base | {"argv": argv, "gpu_indexes": gpus, "time_limit_s": 600} | fields))
        self.node = node
        self.out: dict[str, str] = {"stdout": "", "stderr": ""}
        self.loads: list[tuple[float, ...]] = []
        self.started = 0
        self.cancel = asyncio.Event()
        self.end: RankResult = asyncio.run(node.executor.run(self.launch, self._started, self._output, self.cancel))

    def _started(self) -> None:
        self.started += 1

    def _output(self, stream: str, text: str) -> None:
        self.out[stream] += text
        self.loads.append(tuple(gpu.load for gpu in self.node.nvml.gpus))

    @property
    def result(self) -> StepResult:
        return parse_result(self.out["stdout"])


def step_of(profile: str, kind: str) -> Step:
    return next(s for s in PROFILES[profile].steps if s.kind == kind)


def failing(node: Node, profile: Profile) -> dict[str, Ran]:
    """The profile's steps that fail on the node, as the head judges them: not ok, or past the threshold."""
    failed = {}
    for step in profile.steps:
        ran = node.step(step)
        result = ran.result
        threshold = step.threshold_for(node.gpu_model)
        if not result.skipped and not (result.ok and step.passes(result.value, threshold)):
            failed[step.name] = ran
    return failed


def test_the_built_in_profiles_load() -> None:
    assert PROBLEMS == []
    assert {"quick", "full", "cpu"} <= set(PROFILES)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("profile", ["quick", "full", "cpu"])
def test_every_step_of_every_built_in_profile_passes_on_healthy_nodes(model: str, profile: str) -> None:
    # Several nodes, so that the jitter of each is covered, not only one node's.
    for name in node_names(6):
        node = Node(name, model=model)
        assert failing(node, PROFILES[profile]) == {}
        for step in PROFILES[profile].steps:
            ran = node.step(step)
            assert ran.end == RankResult("completed", 0)
            result = ran.result
            assert result.kind == step.kind
            assert not result.skipped
            assert result.evidence["simulated"] is True
            if step.kind in GPU_KINDS and step.kind != "dcgm":
                assert sorted(result.per_gpu, key=int) == [str(i) for i in range(8)]
            threshold = step.threshold_for(node.gpu_model)
            if threshold is not None and step.kind in GPU_KINDS - {"dcgm"}:
                # Clearly above (or below, for heat) the threshold: a healthy node never sits on the edge.
                margin = result.value / threshold if step.better == "higher" else threshold / result.value
                assert margin > 1.1, (step.name, result.value, threshold)


def test_every_kind_answers_a_readable_result_with_a_unit() -> None:
    node = Node()
    for kind in KINDS:
        ran = node.run(["gpufleet-burnin", kind, "--seconds", "10"], world_size=2 if kind in MULTI_NODE_KINDS else 1)
        assert ran.end.outcome == "completed", (kind, ran.out)
        result = ran.result
        assert result.kind == kind
        assert result.unit
        assert result.value > 0
        assert ran.out["stdout"].endswith("\n")


def test_the_figures_differ_a_little_between_gpus_and_nodes_but_not_between_runs() -> None:
    gemm = step_of("quick", "gemm")
    first = Node("sim001").step(gemm).result.per_gpu
    again = Node("sim001").step(gemm).result.per_gpu
    other = Node("sim002").step(gemm).result.per_gpu
    assert first == again
    assert first != other
    values = list(first.values()) + list(other.values())
    assert len(set(values)) > 8
    nominal = GPU_FIGURES["H200"].gemm_tflops
    assert all(0.97 * nominal <= v <= 1.03 * nominal for v in values)


@pytest.mark.parametrize("profile", ["quick", "full", "cpu"])
def test_a_node_without_gpus_skips_the_gpu_steps_and_passes_the_rest(profile: str) -> None:
    node = Node(gpus=0)
    assert failing(node, PROFILES[profile]) == {}
    for step in PROFILES[profile].steps:
        result = node.step(step).result
        assert result.skipped == (step.kind in GPU_KINDS), step.name
        if result.skipped:
            assert result.detail == "this node has no GPU"
    network = node.step(step_of("cpu", "network")).result
    assert network.evidence["transport"] == "tcp"
    assert node.step(step_of("cpu", "allreduce")).result.evidence["backend"] == "gloo"


def test_a_gpu_step_given_no_gpu_is_skipped_and_gpu_peer_needs_two() -> None:
    node = Node()
    assert node.step(step_of("quick", "gemm"), gpu_indexes=[]).result.skipped
    peer = node.step(step_of("quick", "gpu-peer"), gpu_indexes=[3]).result
    assert peer.skipped
    assert peer.detail == "one GPU: no pair to copy between"


def test_the_gpus_look_busy_while_a_gpu_step_runs_and_idle_after() -> None:
    node = Node(gpus=4)
    ran = node.run(["gpufleet-burnin", "gemm", "--seconds", "60"], gpus=[1, 2])
    assert ran.started == 1
    assert set(ran.loads) == {(0.0, 1.0, 1.0, 0.0)}
    assert [gpu.load for gpu in node.nvml.gpus] == [0.0] * 4
    assert ran.out["stdout"].count("gemm: ") >= 4  # progress while it runs
    host = node.run(["gpufleet-burnin", "disk", "--seconds", "60"], gpus=[1, 2])
    assert set(host.loads) == {(0.0, 0.0, 0.0, 0.0)}  # a host step leaves the GPUs alone


def test_a_simulated_step_lasts_its_seconds_scaled_and_bounded() -> None:
    default = Node()
    default.run(["gpufleet-burnin", "gemm", "--seconds", "60"])
    assert default.time.now == pytest.approx(60 * 0.005)
    default.time.now = 0
    default.run(["gpufleet-burnin", "dcgm", "--seconds", "1800"])
    assert default.time.now == pytest.approx(0.5)
    scaled = Node(burnin_time_scale=0.1, burnin_max_s=100)
    scaled.run(["gpufleet-burnin", "thermal", "--seconds", "900"])
    assert scaled.time.now == pytest.approx(90)
    with pytest.raises(ValueError, match="scale"):
        SimulatedExecutor(default.nvml, burnin_time_scale=-1)


def test_a_step_cancelled_while_it_runs_ends_at_once_and_frees_its_gpus() -> None:
    node = Node(gpus=2)

    async def cancel_soon(ran_cancel: asyncio.Event) -> None:
        await asyncio.sleep(0)
        ran_cancel.set()

    async def run() -> RankResult:
        cancel = asyncio.Event()
        launch = JobStart(
            job_id=1, run=1, rank=0, world_size=1, user="root", time_limit_s=60, gpu_indexes=[0, 1],
            argv=["gpufleet-burnin", "gemm", "--seconds", "60"],
        )  # fmt: skip
        executor = SimulatedExecutor(node.nvml, burnin_time_scale=1, burnin_max_s=60)  # real sleeps: cancelled first
        task = asyncio.ensure_future(executor.run(launch, lambda: None, lambda s, t: None, cancel))
        await cancel_soon(cancel)
        return await task

    assert asyncio.run(run()).outcome == "cancelled"
    assert [gpu.load for gpu in node.nvml.gpus] == [0.0, 0.0]


# -- the weak parts --------------------------------------------------------------------------------


def test_the_weak_faults_are_fault_kinds_the_head_and_cli_accept() -> None:
    assert set(WEAK_FAULTS) <= set(FAULT_KINDS)


def test_a_slow_weak_gpu_fails_gemm_memory_and_peer_naming_itself() -> None:
    node = Node()
    assert "GPU 2" in node.faults.inject("weak-gpu-slow", 2)
    failed = failing(node, PROFILES["quick"])
    assert set(failed) == {"gemm", "gpu-memory", "gpu-peer"}
    for name, ran in failed.items():
        step = step_of("quick", name)
        threshold = step.threshold_for(node.gpu_model)
        assert threshold is not None
        result = ran.result
        assert result.ok  # slow, not wrong: the threshold judges it
        assert ran.end == RankResult("completed", 0)
        assert result.value == min(result.per_gpu.values())
        if name == "gpu-peer":
            # As the real step: each GPU's figure is its slowest pair's; the pairs name the weak one.
            pairs = result.evidence["pairs_gb_s"]
            below = {pair for pair, value in pairs.items() if not step.passes(value, threshold)}
            assert below == {p for p in pairs if "2" in p.split("->")}
            assert "2" in result.evidence["slowest"].split("->")
            continue
        below = {gpu for gpu, value in result.per_gpu.items() if not step.passes(value, threshold)}
        assert below == {"2"}, (name, result.per_gpu)
        assert 0.5 < result.per_gpu["2"] / statistics.median(result.per_gpu.values()) < 0.6
    # The weak GPU hides from NVML: the node's telemetry is the same as a healthy one's.
    assert not any(gpu.slow or gpu.hot for gpu in node.nvml.gpus)


def test_a_gpu_computing_wrong_results_fails_gemm_with_its_checksum() -> None:
    node = Node()
    node.faults.inject("weak-gpu-wrong", 5)
    failed = failing(node, PROFILES["full"])
    assert set(failed) == {"gemm"}
    ran = failed["gemm"]
    assert ran.end.outcome == "failed"
    assert ran.end.exit_code == 1
    assert "GPU 5" in ran.end.message
    result = ran.result
    assert not result.ok
    assert "GPU 5" in result.detail
    assert "checksum" in result.detail
    assert result.evidence["checksum_mismatch"] == [5]
    assert step_of("full", "gemm").passes(result.value, step_of("full", "gemm").threshold_for(node.gpu_model))


@pytest.mark.parametrize("gpus", [8, 0])
def test_a_weak_link_fails_network_and_allreduce_on_its_own_rank(gpus: int) -> None:
    weak, partner = Node("sim001", gpus=gpus), Node("sim002", gpus=gpus)
    weak.faults.inject("weak-link", None)
    profile = PROFILES["quick" if gpus else "cpu"]
    for kind in MULTI_NODE_KINDS:
        step = step_of(profile.name, kind)
        mine = weak.step(step, rank=0, world_size=2).result
        theirs = partner.step(step, rank=1, world_size=2).result
        assert mine.evidence["rank"] == 0
        assert mine.evidence["ranks"] == 2
        assert 0.28 < mine.value / theirs.value < 0.32
    if gpus:
        assert set(failing(weak, profile)) == {"allreduce", "network"}
        assert failing(partner, profile) == {}
    # CPU-only nodes: the built-in cpu profile's 1 Gbit/s floor does not catch a 30% link (7 Gbit/s of 23.5).


def test_a_group_all_reduce_over_a_weak_link_runs_at_its_weakest_members_pace() -> None:
    # A group of 4 (`group = 4`): the head judges the worst rank's value (verdicts.pair_results), so the
    # group is as fast as its weak member, whichever rank that node holds.
    step = Step("allreduce", "allreduce", 20, {"backend": "auto", "size": "256M"}, {"h200": 35.0}, 4)
    nodes = [Node(f"sim00{i}") for i in range(1, 5)]
    nodes[2].faults.inject("weak-link", None)
    values = [n.step(step, rank=i, world_size=4).result for i, n in enumerate(nodes)]
    assert all(v.evidence["ranks"] == 4 for v in values)
    group = min(v.value for v in values)
    assert group == values[2].value
    assert not step.passes(group, step.threshold_for(nodes[0].gpu_model))
    healthy = min(v.value for i, v in enumerate(values) if i != 2)
    assert step.passes(healthy, step.threshold_for(nodes[0].gpu_model))
    assert 0.28 < group / healthy < 0.32


def test_heal_replaces_the_weak_parts() -> None:
    node = Node()
    for kind, gpu in (("weak-gpu-slow", 1), ("weak-gpu-wrong", 4), ("weak-link", None)):
        node.faults.inject(kind, gpu)
    assert set(failing(node, PROFILES["quick"])) == {"gemm", "gpu-memory", "gpu-peer", "allreduce", "network"}
    assert "2 weak GPU(s) replaced; the weak link replaced" in node.faults.heal()
    assert failing(node, PROFILES["quick"]) == {}


def test_a_weak_fault_on_a_gpu_the_node_lacks_is_refused() -> None:
    node = Node(gpus=2)
    with pytest.raises(InvalidInput, match="no GPU 2"):
        node.faults.inject("weak-gpu-slow", 2)
    with pytest.raises(InvalidInput, match="no GPU 0"):
        Node(gpus=0).faults.inject("weak-gpu-wrong", None)


# -- what the NVML faults do to the steps ----------------------------------------------------------


def test_the_nvml_faults_show_in_the_steps_that_would_see_them() -> None:
    node = Node()
    node.faults.inject("thermal", 3)
    thermal = node.step(step_of("quick", "thermal"))
    assert thermal.end.exit_code == 1
    assert not thermal.result.ok
    assert "GPU 3" in thermal.result.detail
    assert thermal.result.value == 92
    assert node.step(step_of("quick", "gemm")).result.per_gpu["3"] < 400  # its clock is halved
    node.faults.heal()

    node.faults.inject("nvlink-down", 6)
    peer = node.step(step_of("quick", "gpu-peer")).result
    assert "6" in peer.evidence["slowest"].split("->")
    pairs = peer.evidence["pairs_gb_s"]
    with_6 = [v for p, v in pairs.items() if "6" in p.split("->")]
    without = [v for p, v in pairs.items() if "6" not in p.split("->")]
    assert statistics.median(with_6) == pytest.approx(statistics.median(without) * 16 / 18, rel=0.03)
    assert peer.ok  # 16 of 18 links still pass the threshold: DCGM is what notices
    assert not node.step(step_of("full", "dcgm")).result.ok  # DCGM's PCIe/NVLink test fails
    node.faults.heal()

    node.faults.inject("ecc-dbe", 0)
    dcgm = node.step(step_of("full", "dcgm")).result
    assert not dcgm.ok
    assert "GPU 0: memory" in dcgm.detail
    assert dcgm.value < 1.0
    node.faults.heal()

    node.faults.inject("xid79", 7)
    gemm = node.step(step_of("quick", "gemm"))
    assert gemm.end.exit_code == 1
    assert "GPU 7 fell off the bus" in gemm.result.detail
    assert "7" not in gemm.result.per_gpu
    node.faults.heal()
    assert failing(node, PROFILES["full"]) == {}


# -- bad command lines -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["gpufleet-burnin"], "a kind is needed"),
        (["gpufleet-burnin", "gpu-burn"], "unknown kind 'gpu-burn'"),
        (["gpufleet-burnin", "gemm", "--seconds"], "--seconds needs a value"),
        (["gpufleet-burnin", "gemm", "--seconds", "soon"], "--seconds: 'soon' is not a number"),
        (["gpufleet-burnin", "gemm", "--seconds", "nan"], "--seconds must be above 0"),
        (["gpufleet-burnin", "gemm", "--dtype", "int4"], "--dtype: 'int4' is not one of bf16, fp16, fp32"),
        (["gpufleet-burnin", "disk", "--bogus", "1"], "disk has no option --bogus; it takes --seconds, --dir"),
        (["gpufleet-burnin", "dcgm", "--level", "9"], "--level: 9 is not from 1 to 4"),
        (["gpufleet-burnin", "gemm", "dtype", "bf16"], "unexpected argument 'dtype'"),
    ],
)
def test_a_bad_command_line_fails_the_rank_with_exit_2_and_says_why(argv: list[str], says: str) -> None:
    ran = Node(gpus=2).run(argv)
    assert ran.end.outcome == "failed"
    assert ran.end.exit_code == 2
    assert says in ran.end.message
    assert says in ran.out["stderr"]
    assert ran.started == 1
    with pytest.raises(BadResult, match="printed no result"):
        parse_result(ran.out["stdout"])


def test_nccl_on_a_node_without_gpus_is_a_usage_error() -> None:
    ran = Node(gpus=0).run(["gpufleet-burnin", "allreduce", "--seconds", "5", "--backend", "nccl"], world_size=2)
    assert ran.end.exit_code == 2
    assert "--backend nccl needs GPUs" in ran.out["stderr"]
    assert ran.started == 1


def test_the_real_runners_options_are_taken_even_where_the_simulation_ignores_them() -> None:
    # One parser for both (agent.burnin.main), so a profile that runs on real nodes runs here.
    node = Node()
    ran = node.run(["gpufleet-burnin", "disk", "--seconds", "5", "--dir", "/scratch", "--ioengine", "libaio"])
    assert ran.end == RankResult("completed", 0)
    assert node.run(["gpufleet-burnin", "gemm", "--size", "4096"]).end == RankResult("completed", 0)


def test_a_pair_step_alone_runs_as_the_real_one_does() -> None:
    network = Node().run(["gpufleet-burnin", "network", "--seconds", "5"]).result
    assert network.skipped
    assert "WORLD_SIZE is 1" in network.detail
    one_node = Node().run(["gpufleet-burnin", "allreduce", "--seconds", "5"]).result
    assert not one_node.skipped  # eight GPUs all-reduce among themselves, over NVLink
    assert one_node.evidence["processes"] == 8
    assert Node(gpus=0).run(["gpufleet-burnin", "allreduce", "--seconds", "5"]).result.skipped
    tcp = Node().run(["gpufleet-burnin", "network", "--transport", "tcp"], world_size=2).result
    assert tcp.evidence["transport"] == "tcp"
    assert tcp.value < 30


def test_a_gpu_outside_the_node_is_an_error_as_for_any_job() -> None:
    ran = Node(gpus=2).run(["gpufleet-burnin", "gemm"], gpus=[5])
    assert ran.end.outcome == "error"
    assert ran.started == 0


def test_gemm_in_fp32_runs_on_the_cuda_cores_at_a_fifteenth() -> None:
    node = Node()
    bf16 = node.run(["gpufleet-burnin", "gemm", "--dtype", "bf16"]).result
    fp32 = node.run(["gpufleet-burnin", "gemm", "--dtype", "fp32"]).result
    assert fp32.value == pytest.approx(bf16.value / 15, rel=0.01)


# -- where the H200's figures come from ------------------------------------------------------------


def test_the_h200_figures_agree_with_the_real_h200_capture() -> None:
    probe = json.loads(PROBE.read_text())
    gpu = probe["gpus"][0]
    columns = probe["series_columns"]
    loaded = [dict(zip(columns, row, strict=True)) for row in probe["series"] if row[columns.index("util_gpu")] >= 99]
    figures = GPU_FIGURES["H200"]
    # Heat: the hottest GPU under load sits where the probe's bf16 matmul held it.
    temps = [row["temp_c"] for row in loaded]
    thermal = Node().step(step_of("quick", "thermal")).result
    assert min(temps) <= thermal.value <= max(temps)
    # Host copies: under the raw rate of the capture's PCIe link (Gen5 x16 = 63 GB/s each way), above 80% of it.
    gen, width = gpu["nvmlDeviceGetCurrPcieLinkGeneration"], gpu["nvmlDeviceGetCurrPcieLinkWidth"]
    raw = {4: 16, 5: 32}[gen] * width * 128 / 130 / 8
    assert 0.8 * raw < figures.host_copy_gbs < raw
    # Memory: under the HBM peak the capture's bus width and memory clock give.
    peak = gpu["nvmlDeviceGetMemoryBusWidth"] * gpu["maxclock_mem"] * 1e6 * 2 / 8 / 1e9
    assert 0.8 * peak < figures.memory_gbs < peak
    # Compute: under the tensor-core peak at the clock the probe held under load.
    clock = statistics.median(row["clock_sm_mhz"] for row in loaded)
    assert 0.8 * 132 * 4 * 1024 * clock * 1e6 / 1e12 < figures.gemm_tflops < 132 * 4 * 1024 * clock * 1e6 / 1e12


# -- starting nodes with faults --------------------------------------------------------------------


def test_parse_fault_reads_node_kind_and_gpu() -> None:
    assert parse_fault("sim003:weak-gpu-slow:2") == NodeFault("sim003", "weak-gpu-slow", 2)
    assert parse_fault("sim007:weak-link") == NodeFault("sim007", "weak-link", None)
    assert parse_fault("gpu-01:thermal:0") == NodeFault("gpu-01", "thermal", 0)


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("sim003", "must read NODE:KIND"),
        ("sim003:weak-gpu-slow:2:1", "must read NODE:KIND"),
        ("sim003:melted", "unknown kind 'melted'"),
        ("sim003:node-crash", "cannot be set at start"),
        ("sim003:weak-gpu-slow:two", "GPU must be a number"),
        ("sim003:weak-gpu-slow:-1", "GPU must be a number"),
        (":weak-link", "fault ':weak-link'"),
    ],
)
def test_parse_fault_refuses_what_it_cannot_read(spec: str, says: str) -> None:
    with pytest.raises(InvalidInput, match=says):
        parse_fault(spec)


def test_a_simulation_starts_its_nodes_with_the_faults_asked() -> None:
    faults = [parse_fault(s) for s in ("sim003:weak-gpu-slow:2", "sim011:weak-gpu-wrong:6", "sim014:weak-link")]
    simulation = Simulation(SimOptions(server="http://127.0.0.1:9", join_token=None, nodes=16, faults=faults))
    simulation.build()
    try:
        failed: dict[str, set[str]] = {}
        for name, agent in simulation.agents.items():
            assert agent.options.jobs is not None
            executor = agent.options.jobs.executor
            assert isinstance(executor, SimulatedExecutor)
            assert isinstance(agent.options.faults, SimulatedFaults)
            assert agent.options.faults.burnin is executor.burnin_faults  # one set of weak parts per node
            names = set(failing(Node.of(executor, agent.options.faults), PROFILES["quick"]))
            if names:
                failed[name] = names
        assert failed == {
            "sim003": {"gemm", "gpu-memory", "gpu-peer"},
            "sim011": {"gemm"},
            "sim014": {"allreduce", "network"},
        }
    finally:
        asyncio.run(simulation.close())


@pytest.mark.parametrize(
    ("spec", "says"),
    [("sim099:weak-link", "sim099 not simulated here (sim001 to sim004)"), ("sim002:weak-gpu-slow:8", "no GPU 8")],
)
def test_a_simulation_refuses_a_fault_it_cannot_place(spec: str, says: str) -> None:
    simulation = Simulation(
        SimOptions(server="http://127.0.0.1:9", join_token=None, nodes=4, faults=[parse_fault(spec)])
    )
    try:
        with pytest.raises(InvalidInput, match=re.escape(says)):
            simulation.build()
    finally:
        asyncio.run(simulation.close())


class RecordedSimulation:
    """Stands in for Simulation: keeps the options `gpufleet sim` built and runs nothing."""

    built: ClassVar[list[SimOptions]] = []

    def __init__(self, options: SimOptions) -> None:
        self.built.append(options)

    def build(self) -> None:
        pass

    async def run(self) -> None:
        pass


def test_gpufleet_sim_takes_faults_and_the_burn_in_time_scale(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import gpufleet.entry  # noqa: F401  (adds `sim` to the CLI)
    from gpufleet.sim import runner

    monkeypatch.setattr(runner, "Simulation", RecordedSimulation)
    monkeypatch.setattr(RecordedSimulation, "built", [])
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("GPUFLEET_CLIENT_CONFIG", str(tmp_path / "client.toml"))
    monkeypatch.setenv("GPUFLEET_SIM_BURNIN_MAX_SECONDS", "2")
    argv = ["sim", "--server", "http://127.0.0.1:9", "--nodes", "16"]
    faults = ["--fault", "sim003:weak-gpu-slow:2", "--fault", "sim014:weak-link", "--burnin-time-scale", "0.01"]
    result = CliRunner().invoke(app, [*argv, *faults])
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    chosen, default = RecordedSimulation.built
    assert chosen.faults == [NodeFault("sim003", "weak-gpu-slow", 2), NodeFault("sim014", "weak-link")]
    assert (chosen.burnin_time_scale, chosen.burnin_max_s) == (0.01, 2)
    assert default.faults == []
    assert (default.burnin_time_scale, default.burnin_max_s) == (BURNIN_TIME_SCALE, 2)
    result = CliRunner().invoke(app, [*argv, "--fault", "sim003:melted"])
    assert result.exit_code != 0
    assert isinstance(result.exception, InvalidInput)
    assert len(RecordedSimulation.built) == 2  # refused before anything was built
