"""`gpufleet agent`: build the real agent (NVML, then nvidia-smi, then no GPUs) and run it."""

from __future__ import annotations

import asyncio
import functools
import logging
import shutil
import signal
from collections.abc import Callable

import httpx

from gpufleet.agent.accounts import AccountSync
from gpufleet.agent.artifacts import ArtifactCache
from gpufleet.agent.checks.runner import HostChecks
from gpufleet.agent.credentials import CredentialStore
from gpufleet.agent.daemon import Agent, AgentOptions, FabricSource, with_retry
from gpufleet.agent.exposition import AgentMetrics, KeepLatest, serve
from gpufleet.agent.gpu.nvml import NvmlReader
from gpufleet.agent.gpu.smi import NvidiaSmiReader
from gpufleet.agent.host import read_host_facts
from gpufleet.agent.inventory import inventory_source
from gpufleet.agent.jobs.process import ProcessExecutor
from gpufleet.agent.jobs.supervisor import JobSupervisor
from gpufleet.agent.logs import LogWatcher, pci_index
from gpufleet.agent.metrics.gpu import GpuCollector
from gpufleet.agent.metrics.host import HostCollector
from gpufleet.agent.metrics.infiniband import IbCollector
from gpufleet.agent.metrics.ports import SampleSource
from gpufleet.agent.metrics.sampler import Sampler
from gpufleet.agent.metrics.xid import XidBook, XidWatcher
from gpufleet.agent.slurm.mapping import SlurmJobMap
from gpufleet.agent.software import collect_software
from gpufleet.agent.storage.checks import StorageChecks
from gpufleet.agent.storage.collector import StorageCollector
from gpufleet.agent.storage.probe import MountProber
from gpufleet.agent.storage.source import HostStorage
from gpufleet.agent.topology import ibnet
from gpufleet.agent.topology.lldp import LldpNeighbors
from gpufleet.agent.trust import head_context
from gpufleet.client import AgentHttp
from gpufleet.core.config import Settings
from gpufleet.core.tls import split_join_token

log = logging.getLogger(__name__)


def fabric_source(interval_s: float, which: Callable[[str], str | None] = shutil.which) -> FabricSource | None:
    """What reads the InfiniBand fabric: ibnetdiscover where `fabric_interval_s` is set and the program is
    installed; None (logged) otherwise."""
    if interval_s <= 0:
        return None
    if which(ibnet.PROGRAM) is None:
        log.warning("fabric_interval_s is set but %s is not installed (infiniband-diags): no fabric", ibnet.PROGRAM)
        return None
    return ibnet.read_fabric


def run_agent(settings: Settings, name: str, join_token: str | None, heartbeat_interval_s: float | None) -> None:
    """Run until interrupted. Raises Unauthorized/AgentStopped (clear messages) when the head refuses the node."""
    store = CredentialStore(settings.agent_state_dir / "credential.json")
    # The LLDP neighbours come from lldpd's default socket; a node without lldpd reports none.
    nvml = NvmlReader()  # also applies the MIG layouts the head sends
    read = inventory_source(read_host_facts, [nvml, NvidiaSmiReader()], LldpNeighbors())
    accounts = None
    if settings.accounts_sync:
        accounts = AccountSync(settings.accounts_root, settings.agent_state_dir / "accounts.json")

    xids = XidBook()
    # The Slurm job map is read even while its directory is missing: the prolog creates it (under /run,
    # emptied at boot) with the node's first job, usually after the agent started. Missing, it costs one
    # failed listing a round and the samples carry no GPU jobs, as on a node without Slurm.
    slurm_jobs = SlurmJobMap(settings.slurm_job_map_dir)
    # Shared file systems: one prober for the metrics round and the checks round, so a mount is never
    # probed twice at once (agent.storage.probe).
    prober = MountProber(settings.storage_probe_timeout_s)
    storage = HostStorage(prober, command_timeout_s=settings.checks_timeout_s)
    storage_metrics = StorageCollector(
        storage,
        shared_mounts=settings.shared_mounts,
        shared_types=settings.shared_fs_types,
        required=settings.required_mounts,
        detail_interval_s=settings.storage_detail_interval_s,
    )
    metrics: SampleSource = Sampler(
        [GpuCollector(xids=xids), HostCollector(), IbCollector(), slurm_jobs, storage_metrics]
    )
    if settings.agent_metrics_listen:
        latest = KeepLatest(metrics)
        serve(AgentMetrics(name, latest, read), settings.agent_metrics_listen)
        metrics = latest
    events = XidWatcher(book=xids)
    # Xids in the kernel log name the GPU by PCI address; NVML says which index that is (read once: a
    # GPU that fell off the bus later keeps its old index here, which is the one the head knows).
    buses = {gpu.index: gpu.pci_bus_id for gpu in read().gpus}
    logs = LogWatcher(settings.log_files, settings.agent_state_dir / "log-cursors.json", pci_index(buses))
    checks = HostChecks(
        settings.checks_dir,
        timeout_s=settings.checks_timeout_s,
        services=settings.required_services,
        mounts=settings.required_mounts,
        storage=StorageChecks(
            storage,
            required=settings.required_mounts,
            shared_mounts=settings.shared_mounts,
            shared_types=settings.shared_fs_types,
        ),
    )
    secret, pin = split_join_token(join_token) if join_token else (None, None)

    async def main() -> None:
        # SIGTERM (systemd's stop) ends the agent as Ctrl-C does: its ranks' process trees are killed
        # (JobSupervisor.close) rather than left running with no agent to report or stop them.
        task = asyncio.current_task()
        if task is not None:
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        executor = ProcessExecutor.on_this_node(
            settings.job_spool_dir, settings.job_kill_grace_s, settings.job_podman_env, settings.job_min_uid
        )
        cache = ArtifactCache(settings.artifact_cache_dir, int(settings.artifact_cache_gb * 1e9))
        # Job processes left by an agent that died (they run in their own session and cgroup): killed
        # before the first job_held tells the head this node holds nothing, so their GPUs are truly free.
        await executor.reap_leftovers()
        context = await with_retry(
            lambda: head_context(
                settings.server, pin, settings.agent_state_dir, settings.ca_file, settings.insecure_http
            )
        )
        async with httpx.AsyncClient(verify=context if context is not None else True) as http:
            options = AgentOptions(
                server=settings.server,
                name=name,
                join_token=secret,
                tls_context=context,
                heartbeat_interval_s=heartbeat_interval_s,
                accounts=accounts,
                accounts_interval_s=settings.accounts_interval_s,
                metrics=metrics,
                events=events,
                logs=logs,
                metrics_interval_s=settings.metrics_interval_s,
                checks=checks,
                checks_interval_s=settings.checks_interval_s,
                jobs=JobSupervisor(executor, cache=cache),
                mig=nvml,
                software=(
                    functools.partial(collect_software, pip_envs=settings.software_pip_envs)
                    if settings.software_report
                    else None
                ),
                software_check_s=settings.software_check_s,
                fabric=fabric_source(settings.fabric_interval_s),
                fabric_interval_s=settings.fabric_interval_s,
            )
            await Agent(options, store, AgentHttp(settings.server, http), read).run()

    try:
        asyncio.run(main())
    except (KeyboardInterrupt, asyncio.CancelledError):
        return
