"""Burn-in steps on a simulated node: what `gpufleet-burnin KIND --seconds N [--option value ...]` says there.

A step job's argv (lifecycle.profiles.Step.argv) reaches `sim.jobs.SimulatedExecutor` like any job's.
`parse_step` reads it with the real runner's own parser (agent.burnin.main: an unknown kind or option is a
usage error, exit 2, so a profile that runs on real nodes runs here, and one that fails there fails here), and
`measure` answers with what a healthy node of its GPU model measures (GPU_FIGURES, HOST_FIGURES), moved
by a jitter of a few percent fixed by the node's name and the GPU's index (so a test sees the same
figures on every run, and a fleet view still has a spread), and by the node's faults. Healthy figures sit
clearly above the built-in profiles' thresholds, which are set about 15% under healthy nodes.

Three faults exist only here (WEAK_FAULTS): a weak GPU that is slow, one that computes wrong results, and
a weak network link. NVML and the node's telemetry never show them, as on real hardware such a part looks
healthy until a burn-in loads and checks it. A weak link lowers its own rank's figure in a pair or a group
of any size (`group = N`): the head judges a multi-node step by its worst rank, so a group measures at its
weakest member's pace, as a real ring all-reduce does (where every rank would see the slow ring). The
NVML faults a real step would notice show too: a lost or missing GPU fails every GPU step that holds it,
a hot GPU fails thermal and computes at half its clock, NVLinks down slow its peer copies, a gpu-slow GPU
does a fifth of the work, and DCGM's diagnostic fails the tests that catch ECC errors, NVLinks down, heat
and lost GPUs. DCGM does not see the weak faults: they stand for what only the dedicated steps catch, so
each fails only the steps meant to catch it.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gpufleet.agent.burnin.common import Run, Usage, bounded
from gpufleet.agent.burnin.main import UNITS, parse_args
from gpufleet.core.errors import InvalidInput
from gpufleet.protocol.burnin import GPU_KINDS, StepResult
from gpufleet.sim.burnin_figures import GPU_FIGURES, HOST_FIGURES, GpuFigures
from gpufleet.sim.host import simulated_host
from gpufleet.sim.nvml import HOT_GPU_C, MODELS, SLOW_SHARE, THERMAL_REASONS, SimulatedNvml

USAGE_EXIT = 2  # a bad command line (agent.burnin.main)
FAILED_EXIT = 1  # the step saw something no threshold excuses (result ok=False)

# Each figure moves by at most this share either way, fixed by (node, GPU, kind).
JITTER = 0.02
THERMAL_JITTER_C = 1.0
WEAK_SHARE = 0.55  # what a weak-gpu-slow GPU measures in gemm, gpu-memory and gpu-peer (thresholds sit at ~85%)
LINK_SHARE = 0.30  # what a weak link measures in network and allreduce

WEAK_FAULTS = {
    "weak-gpu-slow": "the GPU's gemm, gpu-memory and gpu-peer figures fall to about 55%; its telemetry looks healthy",
    "weak-gpu-wrong": "the GPU's matrix multiply fails its checksum in the gemm step; its telemetry looks healthy",
    "weak-link": "the node's network and all-reduce figures fall to about 30% (its own rank's); ports look healthy",
}


# dcgmi diag -r LEVEL: the tests each level runs (DCGM 3's plugins, a level running those below it too).
_DCGM_TESTS = {
    1: ("software",),
    2: ("software", "pcie", "memory"),
    3: ("software", "pcie", "memory", "diagnostic", "targeted_stress", "targeted_power", "memory_bandwidth"),
    4: (
        "software",
        "pcie",
        "memory",
        "diagnostic",
        "targeted_stress",
        "targeted_power",
        "memory_bandwidth",
        "memtest",
        "pulse_test",
    ),
}
# Dense BF16 and FP16 run on the tensor cores at one rate; FP32 on the CUDA cores at about a fifteenth of it
# (H100 SXM: 66.9 of 989.4 TFLOPS; A100: 19.5 of 312).
_DTYPE_SHARE = {"bf16": 1.0, "fp16": 1.0, "fp32": 1 / 15}


def parse_step(argv: Sequence[str]) -> Run:
    """Read `gpufleet-burnin KIND [--seconds N] [--OPTION VALUE ...]` as the real runner does, defaults filled
    in. Raises Usage with the runner's own message."""
    return parse_args(list(argv[1:]))


def uses_gpus(step: Run, gpu_indexes: Sequence[int]) -> bool:
    """Whether the step loads its GPUs while it runs (GPU kinds, and all-reduce over NCCL)."""
    if not gpu_indexes:
        return False
    return step.kind in GPU_KINDS or (step.kind == "allreduce" and step.options["backend"] != "gloo")


class BurninFaults:
    """The faults only burn-in steps reveal, on one node of `gpu_count` GPUs (board positions)."""

    def __init__(self, gpu_count: int) -> None:
        self.gpu_count = gpu_count
        self.slow: set[int] = set()
        self.wrong: set[int] = set()
        self.weak_link = False

    def inject(self, kind: str, gpu: int | None) -> str:
        """Apply `kind` (one of WEAK_FAULTS; the GPU ones to GPU `gpu`, default 0) and say what changed.
        Raises InvalidInput for another kind or a GPU the node lacks."""
        if kind not in WEAK_FAULTS:
            raise InvalidInput(f"no burn-in fault {kind!r}; known: {', '.join(WEAK_FAULTS)}")
        if kind == "weak-link":
            self.weak_link = True
            return "the network link is weak: network and all-reduce steps measure about 30%"
        index = 0 if gpu is None else gpu
        if not 0 <= index < self.gpu_count:
            raise InvalidInput(f"this node has no GPU {index} (it has {self.gpu_count})")
        if kind == "weak-gpu-slow":
            self.slow.add(index)
            return f"GPU {index} is weak: its gemm, memory and peer figures fall to about 55%"
        self.wrong.add(index)
        return f"GPU {index} computes wrong results: the gemm step's checksum fails"

    def heal(self) -> str:
        """Replace the weak parts; say how many there were."""
        gpus, link = len(self.slow | self.wrong), self.weak_link
        self.slow.clear()
        self.wrong.clear()
        self.weak_link = False
        return f"{gpus} weak GPU(s) replaced" + ("; the weak link replaced" if link else "")


@dataclass(frozen=True, slots=True)
class Measured:
    """A step's outcome: what it printed before its result line, the result, and its exit code."""

    lines: tuple[str, ...]
    result: StepResult
    exit_code: int


def measure(
    step: Run,
    nvml: SimulatedNvml,
    faults: BurninFaults,
    gpu_indexes: Sequence[int],
    *,
    rank: int = 0,
    world_size: int = 1,
) -> Measured:
    """What `step` measures on this node now, on the GPUs it holds (board positions), as rank `rank` of
    `world_size` nodes. Raises Usage for a request the node cannot serve (NCCL without GPUs), as the real
    runner does."""
    return _Bench(step, nvml, faults, list(gpu_indexes), rank, world_size).run()


def model_key(nvml: SimulatedNvml) -> str | None:
    """The node's GPU model as GPU_FIGURES keys it, or None for a node without GPUs."""
    if not nvml.gpus:
        return None
    return next(key for key, model in MODELS.items() if model == nvml.model)


def _ends(pair: str) -> tuple[int, int]:
    source, target = pair.split("->")
    return int(source), int(target)


def _jitter(node: str, gpu: int, kind: str) -> float:
    """A number in -1..1, fixed by (node, GPU, kind): figures differ a little between GPUs and nodes."""
    return 2 * zlib.crc32(f"{node}/{gpu}/{kind}".encode()) / 0xFFFFFFFF - 1


class _Bench:
    """One step's measurement; one method per kind."""

    def __init__(
        self, step: Run, nvml: SimulatedNvml, faults: BurninFaults, gpus: list[int], rank: int, world: int
    ) -> None:
        self.step, self.nvml, self.faults = step, nvml, faults
        self.node = nvml.node_name
        self.gpus = gpus
        self.rank, self.world = rank, world
        key = model_key(nvml)
        self.figures = GPU_FIGURES[key] if key is not None else None
        self.evidence: dict[str, Any] = {"simulated": True, "seconds": step.seconds}
        if key is not None:
            self.evidence["gpu_model"] = key
        self.lines: list[str] = []

    def run(self) -> Measured:
        kind = self.step.kind
        if kind in GPU_KINDS:
            if self.figures is None or not self.gpus:
                why = "this node has no GPU" if self.figures is None else "no GPU was allocated to the step"
                return self._skipped(why)
            if len(self._unusable()) == len(self.gpus):
                return self._done({})  # nothing to measure on: each GPU's problem is named
        handler: Callable[[], Measured] = getattr(self, "_" + kind.replace("-", "_"))
        return handler()

    # -- GPU kinds: per GPU, the node's value the worst ---------------------------------------------

    @property
    def gpu(self) -> GpuFigures:
        """The model's figures; GPU kinds ask (run() skips them on a node without GPUs), and NCCL."""
        if self.figures is None:
            raise Usage("this step needs GPUs; the node has none")
        return self.figures

    def _gemm(self) -> Measured:
        dtype = str(self.step.options["dtype"])
        self.evidence["dtype"] = dtype
        values = self._per_gpu(lambda i: self.gpu.gemm_tflops * _DTYPE_SHARE[dtype] * self._work_share(i, True))
        wrong = sorted(i for i in self.gpus if i in self.faults.wrong and i not in self._unusable())
        problems = [f"GPU {i}: checksum mismatch, its product differs from the reference" for i in wrong]
        if wrong:
            self.evidence["checksum_mismatch"] = wrong
        return self._done(values, problems=problems)

    def _gpu_memory(self) -> Measured:
        return self._done(self._per_gpu(lambda i: self.gpu.memory_gbs * self._work_share(i, False)))

    def _host_copy(self) -> Measured:
        return self._done(self._per_gpu(lambda i: self.gpu.host_copy_gbs))

    def _gpu_peer(self) -> Measured:
        usable = [i for i in self.gpus if i not in self._unusable()]
        if len(usable) < 2:
            return self._skipped("one GPU: no pair to copy between")
        links = self.nvml.model.nvlinks

        def own(index: int) -> float:
            # What a GPU can copy at: NVLinks down slow it by the share of links lost, a weak GPU more.
            up = links - len(self.nvml.gpus[index].links_down)
            return self.gpu.peer_gbs * up / links * self._work_share(index, False)

        # Every ordered pair, as the real step measures them; a copy goes at its slower end's pace.
        pairs = {
            f"{i}->{j}": round(min(own(i), own(j)) * (1 + JITTER * _jitter(self.node, 1000 * i + j, "gpu-peer")), 1)
            for i in usable
            for j in usable
            if i != j
        }
        slowest = min(pairs, key=lambda k: pairs[k])
        # Each GPU's figure is its slowest pair's (the real step's), so a weak GPU pulls down every GPU's;
        # the pairs name it: it is in every slow one.
        values = {g: min(v for k, v in pairs.items() if g in _ends(k)) for g in usable}
        self.evidence |= {"pairs_gb_s": pairs, "slowest": slowest}
        self.lines.append(f"gpu-peer: slowest pair {slowest}: {pairs[slowest]:g} GB/s\n")
        return self._done(values)

    def _thermal(self) -> Measured:
        usable = [i for i in self.gpus if i not in self._unusable()]
        temps = {
            i: HOT_GPU_C if self.nvml.gpus[i].hot else self.gpu.thermal_c + THERMAL_JITTER_C * self._jit(i)
            for i in usable
        }
        hot = sorted(i for i in usable if self.nvml.gpus[i].hot)
        problems = [
            f"GPU {i}: thermal slowdown at {HOT_GPU_C} C (clocks-event reasons {THERMAL_REASONS:#x})" for i in hot
        ]
        if hot:
            self.evidence["throttled"] = hot
        for i, temp in temps.items():
            self.lines.append(f"GPU {i}: {temp:.0f} C under load\n")
        return self._done({i: round(t, 1) for i, t in temps.items()}, problems=problems, worst=max, lines=False)

    def _dcgm(self) -> Measured:
        level = int(self.step.options["level"])
        tests = _DCGM_TESTS[level]
        failed: list[str] = []
        shares: dict[int, float] = {}
        for i in self.gpus:
            gpu = self.nvml.gpus[i]
            broken = {
                "memory": gpu.remap_pending or gpu.ecc_dbe_volatile > 0,
                "pcie": bool(gpu.links_down),
                "diagnostic": gpu.hot,
            }
            per_gpu = [t for t in tests if t != "software"]
            bad = per_gpu if gpu.lost or gpu.hidden else [t for t in per_gpu if broken.get(t, False)]
            failed += [f"GPU {i}: {t}" for t in bad]
            shares[i] = (len(per_gpu) - len(bad)) / len(per_gpu) if per_gpu else 1.0
        run = 1 + sum(len(tests) - 1 for _ in self.gpus)  # the software test runs once for the node
        value = (run - len(failed)) / run
        self.evidence |= {"level": level, "tests": list(tests), "run": run, "failed": failed}
        self.lines.append(f"dcgmi diag -r {level}: {run - len(failed)} of {run} passed\n")
        problems = [f"DCGM: {', '.join(failed)} failed"] if failed else []
        result = StepResult(
            kind="dcgm",
            value=round(value, 4),
            unit=UNITS["dcgm"],
            ok=not problems,
            detail="; ".join(problems)[:1024],
            per_gpu={str(i): round(s, 4) for i, s in shares.items()},
            evidence=bounded(self.evidence),
        )
        return Measured(tuple(self.lines), result, FAILED_EXIT if problems else 0)

    # -- host and network kinds: one value for the node (its own side, for a pair) ----------------

    def _cpu_stress(self) -> Measured:
        cpus = simulated_host(self.node, len(self.nvml.gpus)).cpus
        self.evidence["workers"] = cpus
        return self._node_value(HOST_FIGURES.cpu_ops_per_cpu * cpus, digits=0)

    def _memory_stress(self) -> Measured:
        cpus = simulated_host(self.node, len(self.nvml.gpus)).cpus
        self.evidence["workers"] = cpus
        return self._node_value(HOST_FIGURES.vm_ops_per_cpu * cpus, digits=0)

    def _disk(self) -> Measured:
        return self._node_value(HOST_FIGURES.disk_mbs)

    def _allreduce(self) -> Measured:
        backend = str(self.step.options["backend"])
        gpus = len(self.gpus) if self.figures is not None else 0
        if backend == "auto":
            backend = "nccl" if gpus else "gloo"
        if backend == "nccl" and not gpus:
            raise Usage("--backend nccl needs GPUs, and this node has none visible")  # the runner's words
        processes = gpus if backend == "nccl" else 1
        self.evidence |= {"backend": backend, "rank": self.rank, "ranks": self.world, "processes": processes}
        if self.world < 2 and processes < 2:
            return self._skipped("one process in all: nothing to all-reduce with (one node, at most one GPU)")
        if self.world < 2:
            # One node: NVLink bounds the ring, so the bus bandwidth lands near one GPU's peer copy rate
            # (an estimate; the built-in profiles pair nodes, and their thresholds are for two).
            return self._node_value(self.gpu.peer_gbs)
        figure = self.gpu.allreduce_gbs if backend == "nccl" else HOST_FIGURES.gloo_gbs
        return self._node_value(figure * (LINK_SHARE if self.faults.weak_link else 1.0))

    def _network(self) -> Measured:
        if self.world < 2:
            return self._skipped("no partner node (WORLD_SIZE is 1): the network step runs in pairs")
        wanted = str(self.step.options["transport"])
        if wanted == "ib" and self.figures is None:
            return self._skipped("no InfiniBand device with an active port and ib_write_bw")
        if wanted == "tcp" or self.figures is None:
            figure, transport = HOST_FIGURES.tcp_gbits, "tcp"
        else:
            figure, transport = self.figures.network_gbits, "ib"
        self.evidence |= {"transport": transport, "rank": self.rank, "ranks": self.world}
        return self._node_value(figure * (LINK_SHARE if self.faults.weak_link else 1.0))

    # -- helpers -----------------------------------------------------------------------------------

    def _jit(self, gpu: int) -> float:
        return _jitter(self.node, gpu, self.step.kind)

    def _unusable(self) -> dict[int, str]:
        """The step's GPUs that CUDA cannot use, and why."""
        gone: dict[int, str] = {}
        for i in self.gpus:
            gpu = self.nvml.gpus[i]
            if gpu.lost:
                gone[i] = f"GPU {i} fell off the bus"
            elif gpu.hidden:
                gone[i] = f"GPU {i} is not visible to the driver"
        return gone

    def _work_share(self, index: int, clock_bound: bool) -> float:
        """The share of a healthy GPU's figure that GPU `index` reaches, by its faults."""
        gpu = self.nvml.gpus[index]
        share = WEAK_SHARE if index in self.faults.slow else 1.0
        if gpu.slow:
            share *= SLOW_SHARE
        if clock_bound and gpu.hot:
            share *= 0.5  # a hot GPU's SM clock is halved (sim.nvml)
        return share

    def _per_gpu(self, figure: Callable[[int], float]) -> dict[int, float]:
        unusable = self._unusable()
        return {i: round(figure(i) * (1 + JITTER * self._jit(i)), 1) for i in self.gpus if i not in unusable}

    def _done(
        self,
        values: dict[int, float],
        *,
        problems: Sequence[str] = (),
        worst: Callable[..., float] = min,
        lines: bool = True,
    ) -> Measured:
        """A per-GPU result: the node's value is the worst GPU's; the step fails on any problem or unusable GPU."""
        unit = UNITS[self.step.kind]
        problems = [*self._unusable().values(), *problems]
        if lines:
            self.lines += [f"GPU {i}: {v:g} {unit}\n" for i, v in values.items()]
        self.lines += [f"error: {p}\n" for p in problems]
        result = StepResult(
            kind=self.step.kind,
            value=worst(values.values()) if values else 0.0,
            unit=unit,
            ok=not problems,
            detail="; ".join(problems)[:1024],
            per_gpu={str(i): v for i, v in values.items()},
            evidence=bounded(self.evidence),
        )
        return Measured(tuple(self.lines), result, FAILED_EXIT if problems else 0)

    def _node_value(self, figure: float, digits: int = 1) -> Measured:
        value = round(figure * (1 + JITTER * _jitter(self.node, -1, self.step.kind)), digits)
        unit = UNITS[self.step.kind]
        self.lines.append(f"{self.step.kind}: {value:g} {unit}\n")
        result = StepResult(kind=self.step.kind, value=value, unit=unit, evidence=bounded(self.evidence))
        return Measured(tuple(self.lines), result, 0)

    def _skipped(self, why: str) -> Measured:
        self.lines.append(f"skipped: {why}\n")
        result = StepResult(
            kind=self.step.kind,
            value=0.0,
            unit=UNITS[self.step.kind],
            skipped=True,
            detail=why,
            evidence=bounded(self.evidence),
        )
        return Measured(tuple(self.lines), result, 0)
