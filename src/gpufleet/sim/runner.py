"""`gpufleet sim`: many agents in one process, each with a simulated NVML; the agent code is the real one.

All agents share one event loop and one HTTP connection pool, which is what lets 1,000 nodes run on
two cores: a heartbeat is one small WebSocket frame, and an idle agent costs a sleeping coroutine.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import ssl
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from gpufleet.agent.artifacts import ArtifactCache
from gpufleet.agent.credentials import CredentialStore
from gpufleet.agent.daemon import Agent, AgentOptions
from gpufleet.agent.faults import AGENT_FAULTS
from gpufleet.agent.gpu.nvml import NvmlReader
from gpufleet.agent.inventory import inventory_source
from gpufleet.agent.jobs.supervisor import JobSupervisor
from gpufleet.agent.logs import LogWatcher, pci_index
from gpufleet.agent.metrics.gpu import GpuCollector
from gpufleet.agent.metrics.infiniband import IbCollector
from gpufleet.agent.metrics.ports import Collector
from gpufleet.agent.metrics.sampler import Sampler
from gpufleet.agent.metrics.xid import XidBook, XidWatcher
from gpufleet.agent.slurm.mapping import SlurmJobMap
from gpufleet.agent.storage.checks import StorageChecks
from gpufleet.agent.storage.collector import StorageCollector
from gpufleet.client import AgentHttp
from gpufleet.core.errors import GpufleetError, InvalidInput
from gpufleet.protocol.inventory import MAX_GPUS_PER_NODE
from gpufleet.protocol.messages import check_node_name
from gpufleet.protocol.metrics import FAULT_KINDS
from gpufleet.sim.burnin import BurninFaults
from gpufleet.sim.checks import SimulatedChecks
from gpufleet.sim.faults import SimulatedFaults
from gpufleet.sim.host import simulated_host
from gpufleet.sim.host_metrics import SimulatedHostMetrics
from gpufleet.sim.infiniband import SimulatedInfiniband
from gpufleet.sim.jobs import BURNIN_MAX_S, BURNIN_TIME_SCALE, SimulatedExecutor
from gpufleet.sim.nvml import DRIVER_VERSION, SimulatedNvml
from gpufleet.sim.software import SimulatedSoftware
from gpufleet.sim.storage import SimulatedStorage

log = logging.getLogger(__name__)
MAX_NODES = 10_000


def default_state_dir() -> Path:
    """Where `gpufleet sim` keeps its nodes' credentials unless told: per user, in the XDG state directory
    ($XDG_STATE_HOME/gpufleet/sim, else ~/.local/state/gpufleet/sim), so a run never depends on, or
    litters, the working directory."""
    base = os.environ.get("XDG_STATE_HOME", "")
    # The XDG spec says a relative XDG_STATE_HOME is invalid and to be ignored.
    root = Path(base) if os.path.isabs(base) else Path.home() / ".local" / "state"
    return root / "gpufleet" / "sim"


@dataclass(frozen=True, slots=True)
class NodeFault:
    """A fault a simulated node has from the start, as if it had been injected before it joined."""

    node: str
    kind: str
    gpu: int | None = None


def parse_fault(spec: str) -> NodeFault:
    """`NODE:KIND[:GPU]`, e.g. `sim003:weak-gpu-slow:2` or `sim007:weak-link`. Raises InvalidInput."""
    parts = spec.split(":")
    if len(parts) not in (2, 3):
        raise InvalidInput(f"fault {spec!r} must read NODE:KIND or NODE:KIND:GPU")
    node, kind = parts[0], parts[1]
    try:
        check_node_name(node)
    except ValueError as exc:
        raise InvalidInput(f"fault {spec!r}: {exc}") from None
    if kind in AGENT_FAULTS:
        # These are the agent's behaviour, not the node's hardware: a node that starts crashed never joins.
        raise InvalidInput(f"fault {spec!r}: {kind} cannot be set at start; inject it once the node runs")
    if kind not in FAULT_KINDS:
        raise InvalidInput(f"fault {spec!r}: unknown kind {kind!r}; one of {', '.join(FAULT_KINDS)}")
    gpu = None
    if len(parts) == 3:
        if not parts[2].isdigit() or len(parts[2]) > 3:
            raise InvalidInput(f"fault {spec!r}: GPU must be a number, 0 or more")
        gpu = int(parts[2])
    return NodeFault(node, kind, gpu)


def node_names(count: int, prefix: str = "sim") -> list[str]:
    width = max(3, len(str(count)))
    return [f"{prefix}{i:0{width}d}" for i in range(1, count + 1)]


@dataclass
class SimOptions:
    server: str
    join_token: str | None
    nodes: int
    gpus_per_node: int = 8
    gpu_model: str = "H200"
    driver_version: str | None = None  # None: the probed H200's driver (sim.nvml.DRIVER_VERSION)
    state_dir: Path = field(default_factory=default_state_dir)
    cache_limit_bytes: int = 10 * 10**9  # each node's artifact cache
    prefix: str = "sim"
    heartbeat_interval_s: float | None = None
    ramp_s: float | None = None  # spread the joins; default: 5 ms a node
    tls_context: ssl.SSLContext | None = None  # the head's pinned CA (agent.trust), for https servers
    metrics_interval_s: float | None = 5.0  # None: no metrics (heartbeats only)
    metrics_backlog: int = 12  # samples each node keeps while the head is away (1,000 nodes hold them all)
    ib_ports: int = 4  # simulated InfiniBand ports per node
    # Simulated nodes run no host checks; a number gives each a SimulatedChecks (no results until a test sets some).
    checks_interval_s: float | None = None
    # Node name -> a Slurm job map directory its samples report (the test Slurm's node is named after a
    # simulated node, so the real prolog's map lands on that node's GPUs); other nodes have no Slurm.
    slurm_job_maps: dict[str, Path] = field(default_factory=dict)
    # Report simulated software (sim.software): every node the current image, every `older_every`-th
    # node an older one. Off by default: a 1,000-node benchmark has no use for it.
    software: bool = False
    older_every: int = 4
    # How long a simulated burn-in step lasts: its seconds times the scale, at most burnin_max_s (sim.jobs).
    burnin_time_scale: float = BURNIN_TIME_SCALE
    burnin_max_s: float = BURNIN_MAX_S
    # Faults nodes have before they join (`gpufleet sim --fault NODE:KIND[:GPU]`): e.g. two weak GPUs and a
    # weak link among 16 nodes, for burn-in admission to find.
    faults: list[NodeFault] = field(default_factory=list)
    # Shared mounts every node has and requires (an NFS export of a simulated server each, sim.storage):
    # watched by the agent's real storage collector and checks; `mount-hang` and friends act on them.
    shared_mounts: list[str] = field(default_factory=list)
    storage_probe_timeout_s: float = 5.0


@dataclass
class Simulation:
    """The running agents, by node name; tests and benchmarks stop and restart single nodes."""

    options: SimOptions
    agents: dict[str, Agent] = field(default_factory=dict)
    tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)
    _http: httpx.AsyncClient | None = None

    def build(self) -> None:
        """Create the agents. Raises InvalidInput for a bad node count or an unknown GPU model."""
        opts = self.options
        if not 1 <= opts.nodes <= MAX_NODES:
            raise InvalidInput(f"--nodes must be between 1 and {MAX_NODES}")
        if not 0 <= opts.gpus_per_node <= MAX_GPUS_PER_NODE:
            raise InvalidInput(f"--gpus-per-node must be between 0 and {MAX_GPUS_PER_NODE}")
        self._http = httpx.AsyncClient(
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=64),
            verify=opts.tls_context if opts.tls_context is not None else True,
        )
        http = AgentHttp(opts.server, self._http)
        names = node_names(opts.nodes, opts.prefix)
        strangers = sorted({f.node for f in opts.faults} - set(names))
        if strangers:
            raise InvalidInput(
                f"--fault names node(s) {', '.join(strangers)} not simulated here ({names[0]} to {names[-1]})"
            )
        for i, name in enumerate(names):
            try:
                nvml = SimulatedNvml(
                    name,
                    gpu_count=opts.gpus_per_node,
                    gpu_model=opts.gpu_model,
                    driver_version=opts.driver_version or DRIVER_VERSION,
                )
            except ValueError as exc:
                raise InvalidInput(str(exc)) from None
            burnin = BurninFaults(opts.gpus_per_node)
            host = functools.partial(simulated_host, name, opts.gpus_per_node)
            gpus = NvmlReader(nvml, source="simulated")
            read = inventory_source(host, [gpus])
            agent_opts = AgentOptions(
                mig=gpus,
                server=opts.server,
                name=name,
                join_token=opts.join_token,
                heartbeat_interval_s=opts.heartbeat_interval_s,
                tls_context=opts.tls_context,
                # Jobs placed here run in simulated time: GPUs load up, nothing is executed.
                jobs=JobSupervisor(
                    SimulatedExecutor(
                        nvml,
                        burnin_faults=burnin,
                        burnin_time_scale=opts.burnin_time_scale,
                        burnin_max_s=opts.burnin_max_s,
                    ),
                    # Staging is real: models and datasets are copied into the node's own cache directory.
                    cache=ArtifactCache(opts.state_dir / "nodes" / f"{name}.cache", opts.cache_limit_bytes),
                ),
            )
            if opts.software:
                variant = "older" if opts.older_every and (i + 1) % opts.older_every == 0 else "current"
                root = opts.state_dir / "nodes" / f"{name}.root"
                agent_opts.software = SimulatedSoftware(root, nvml, variant)
            target = self._add_metrics(agent_opts, name, nvml, burnin)
            for fault in (f for f in opts.faults if f.node == name):
                try:
                    target.inject(fault.kind, fault.gpu)
                except InvalidInput as exc:
                    raise InvalidInput(f"--fault {name}:{fault.kind}: {exc}") from None
            store = CredentialStore(opts.state_dir / "nodes" / f"{name}.json")
            self.agents[name] = Agent(agent_opts, store, http, read)

    def _add_metrics(
        self, options: AgentOptions, name: str, nvml: SimulatedNvml, burnin: BurninFaults
    ) -> SimulatedFaults:
        """The real collectors over the node's simulated NVML and ports, and those (with the weak parts
        burn-in steps measure) as its fault target, which this returns."""
        infiniband = SimulatedInfiniband(self.options.ib_ports)
        storage = None
        if self.options.shared_mounts:
            storage = SimulatedStorage(
                self.options.shared_mounts, node=name, timeout_s=self.options.storage_probe_timeout_s
            )
        options.faults = target = SimulatedFaults(nvml, infiniband, burnin, storage)
        if self.options.metrics_interval_s is None:
            return target
        xids = XidBook()
        collectors: list[Collector] = [GpuCollector(nvml, xids=xids), SimulatedHostMetrics(name, nvml)]
        collectors.append(IbCollector(infiniband))
        if storage is not None:
            mounts = self.options.shared_mounts
            collectors.append(StorageCollector(storage, shared_mounts=mounts, required=mounts))
        if name in self.options.slurm_job_maps:
            collectors.append(SlurmJobMap(self.options.slurm_job_maps[name]))
        options.metrics = Sampler(collectors)
        # The simulated event set answers at once: polled on the loop, not from a thread per node.
        options.events = XidWatcher(nvml, xids, blocking=False)
        # The node's "kernel log": a file anyone may append driver lines to (`kernel_log(name)`).
        buses = {gpu.index: gpu.pci.busId.decode() for gpu in nvml.gpus}
        nodes = self.options.state_dir / "nodes"
        options.logs = LogWatcher(
            [self.kernel_log(name)], nodes / f"{name}.log-cursors.json", pci_index(buses), blocking=False
        )
        options.metrics_interval_s = self.options.metrics_interval_s
        options.metrics_backlog = self.options.metrics_backlog
        if self.options.checks_interval_s is not None:
            real = None
            if storage is not None:
                mounts = self.options.shared_mounts
                real = StorageChecks(storage, required=mounts, shared_mounts=mounts)
            options.checks = SimulatedChecks(real)
            options.checks_interval_s = self.options.checks_interval_s
        return target

    def kernel_log(self, name: str) -> Path:
        """Where node `name`'s simulated kernel log is: its agent follows and classifies what is written there."""
        return self.options.state_dir / "nodes" / f"{name}.kern.log"

    def start_node(self, name: str) -> None:
        task = self.tasks.get(name)
        if task is not None and not task.done():
            return
        self.tasks[name] = asyncio.create_task(self._run_one(name), name=f"agent-{name}")

    async def stop_node(self, name: str) -> None:
        """Stop one node's agent as if the node died: its channel just goes away."""
        task = self.tasks.pop(name, None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run_one(self, name: str) -> None:
        try:
            await self.agents[name].run()
        except GpufleetError as exc:
            self.failures[name] = str(exc)
            log.error("node %s stopped: %s", name, exc)
        except Exception as exc:  # one simulated node's bug must not take the others down
            self.failures[name] = repr(exc)
            log.exception("node %s crashed", name)

    async def run(self) -> None:
        """Start every agent (ramped) and run until cancelled. Raises the first error if no node could run."""
        if not self.agents:
            self.build()
        ramp = self.options.ramp_s if self.options.ramp_s is not None else 0.005 * len(self.agents)
        step = ramp / max(len(self.agents), 1)
        try:
            for name in self.agents:
                self.start_node(name)
                if step:
                    await asyncio.sleep(step)
            while True:
                await asyncio.sleep(1.0)
                if self.failures and len(self.failures) == len(self.agents):
                    first = next(iter(self.failures.values()))
                    raise GpufleetError(f"no simulated node could run: {first}")
        finally:
            await self.close()

    async def close(self) -> None:
        for name in list(self.tasks):
            await self.stop_node(name)
        if self._http is not None:
            await self._http.aclose()
            self._http = None
