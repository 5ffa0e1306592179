"""The head's Prometheus collector: the fleet as dcgm-exporter names it, read when scraped.

Nothing is copied to be exported. A scrape reads the latest sample of each node this replica holds
from the `HealthTracker` (in memory already, for the health checks) and the node facts from the
database in one read-only transaction: GPU UUID, model, PCI bus id and driver for the labels; state,
health and drain for `gpufleet_node_*`; the alerts firing; the running jobs. A GPU a running job holds
carries that job's id as `hpc_job` on its series (as dcgm-exporter's HPC job mapping does), and
`gpufleet_job_info{hpc_job, user, project}` lets a query group GPU series by user or project. A GPU no
gpufleet job holds but the node's Slurm job map (gpufleet's Slurm prolog, sent with each sample) gives
to a Slurm job carries that job's id instead, and its `gpufleet_job_info` has the Slurm account as project.

Several replicas: each tracker holds only the nodes whose channels that replica holds, so Prometheus
must scrape every replica to see every GPU (list each in the scrape job). The `gpufleet_node_*` and
`gpufleet_alerts_firing` series come from the shared database and are the same on every replica;
the exported alert rules aggregate them `by (node)`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import replace

from prometheus_client.metrics_core import Metric
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.core.db import transaction
from gpufleet.inventory.models import Gpu, Node
from gpufleet.inventory.states import NodeState
from gpufleet.jobs.models import Job, JobRank, JobState, RankState
from gpufleet.monitoring.alerts import RULES
from gpufleet.monitoring.models import Alert
from gpufleet.monitoring.tracker import HealthTracker
from gpufleet.prometheus.exposition import Families, GpuFacts, NodeMetrics
from gpufleet.prometheus.names import (
    ALERTS_FIRING,
    HEALTH_VALUES,
    JOB_INFO,
    JOB_LABEL,
    NODE_DRAINED,
    NODE_EXPECTED_GPUS,
    NODE_HEALTH,
    NODE_LABEL,
    NODE_UP,
)
from gpufleet.protocol.metrics import GpuJob


class FleetCollector:
    """A prometheus-client collector (`collect()` yields metric families) over one replica's state.

    Raises Unavailable (from `core.db.transaction`) when the database does not answer.
    """

    def __init__(self, sessions: sessionmaker[Session], tracker: HealthTracker) -> None:
        self.sessions = sessions
        self.tracker = tracker

    def collect(self) -> Iterable[Metric]:
        held = set(self.tracker.tracked())
        with transaction(self.sessions, readonly=True) as session:
            nodes = session.execute(
                select(
                    Node.id,
                    Node.name,
                    Node.hostname,
                    Node.state,
                    Node.health,
                    Node.drained_at,
                    Node.expected_gpus,
                ).order_by(Node.name)
            ).all()
            gpus: dict[int, dict[int, GpuFacts]] = defaultdict(dict)
            if held:
                rows = session.execute(
                    select(Gpu.node_id, Gpu.index, Gpu.uuid, Gpu.model, Gpu.pci_bus_id, Gpu.driver_version).where(
                        Gpu.node_id.in_(held)
                    )
                )
                holders = _job_holders(session, held)
                for node_id, index, uuid, model, bus, driver in rows:
                    job = holders.get((node_id, index), "")
                    gpus[node_id][index] = GpuFacts(uuid, model, bus, driver or "", job)
            # A job Slurm runs is known on its GPUs (through the prolog's map) by Slurm's id: key it so.
            jobs = [
                (external_id if backend == "slurm" and external_id else str(job_id), user, project)
                for job_id, backend, external_id, user, project in session.execute(
                    select(Job.id, Job.backend, Job.external_id, Job.user, Job.project).where(
                        Job.state == JobState.RUNNING
                    )
                )
            ]
            firing = session.execute(
                select(Alert.rule, Alert.severity, func.count())
                .where(Alert.status == "firing")
                .group_by(Alert.rule, Alert.severity)
            ).all()
        slurm_jobs: dict[str, tuple[str, str]] = {}
        for node_id in held:
            slurm_jobs.update(label_slurm_jobs(gpus[node_id], self.tracker.gpu_jobs(node_id)))
        families = Families()
        for family in (NODE_UP, NODE_HEALTH, NODE_DRAINED, NODE_EXPECTED_GPUS, ALERTS_FIRING, JOB_INFO):
            families.declare(family)
        add_job_info(families, [(job_id, user, project or "") for job_id, user, project in jobs], slurm_jobs)
        for node in nodes:
            labels = {NODE_LABEL: node.name}
            if node.state is not NodeState.NEW:  # never heard from: neither up nor down
                families.add(NODE_UP, labels, 1.0 if node.state is NodeState.UP else 0.0)
            if node.health in HEALTH_VALUES:
                families.add(NODE_HEALTH, labels, HEALTH_VALUES[node.health])
            families.add(NODE_DRAINED, labels, 0.0 if node.drained_at is None else 1.0)
            families.add(NODE_EXPECTED_GPUS, labels, float(node.expected_gpus))
        counts = {(rule, severity): float(count) for rule, severity, count in firing}
        for name, rule in RULES.items():  # zero, not absent, for a built-in rule not firing
            counts.setdefault((name, rule.severity), 0.0)
        for (rule_name, severity), count in sorted(counts.items()):
            families.add(ALERTS_FIRING, {"alertname": rule_name, "severity": severity}, count)
        for node in nodes:
            if node.id not in held:
                continue
            entities = self.tracker.latest(node.id)
            if entities:
                mounts = {m.mountpoint: m for m in self.tracker.mounts(node.id)}
                families.add_node(
                    NodeMetrics(node.name, node.hostname or node.name, entities, gpus.get(node.id, {}), mounts)
                )
        return families.collect()


def add_job_info(families: Families, jobs: list[tuple[str, str, str]], slurm_jobs: dict[str, tuple[str, str]]) -> None:
    """`gpufleet_job_info` for gpufleet's running jobs (id, user, project), then for the Slurm jobs on
    the GPUs (id -> user, account). One series per id: a Slurm job whose id a running gpufleet job also
    has would repeat its labels, and gpufleet's own record wins."""
    for job_id, user, project in jobs:
        families.add(JOB_INFO, {JOB_LABEL: job_id, "user": user, "project": project}, 1.0)
    ours = {job_id for job_id, _, _ in jobs}
    for job_id, (user, account) in sorted(slurm_jobs.items()):
        if job_id not in ours:
            families.add(JOB_INFO, {JOB_LABEL: job_id, "user": user, "project": account}, 1.0)


def label_slurm_jobs(gpus: dict[int, GpuFacts], mapped: list[GpuJob]) -> dict[str, tuple[str, str]]:
    """Give each GPU of one node that no gpufleet job holds the Slurm job its job map names (the first
    listed where Slurm shares the GPU: a series carries one `hpc_job`), in place; return every mapped
    job's (user, account) by job id, for `gpufleet_job_info`."""
    owners: dict[str, tuple[str, str]] = {}
    for entry in mapped:
        owners.setdefault(entry.job, (entry.user, entry.account))
        facts = gpus.get(entry.gpu, GpuFacts())
        if not facts.job:
            gpus[entry.gpu] = replace(facts, job=entry.job)
    return owners


def _job_holders(session: Session, node_ids: set[int]) -> dict[tuple[int, int], str]:
    """(node id, GPU index) -> the id of the running job whose current run holds it."""
    rows = session.execute(
        select(JobRank.node_id, JobRank.gpu_indexes, JobRank.job_id)
        .join(Job, (Job.id == JobRank.job_id) & (Job.run == JobRank.run))
        .where(Job.state == JobState.RUNNING, JobRank.state != RankState.EXITED, JobRank.node_id.in_(node_ids))
    )
    return {
        (node_id, index): str(job_id) for node_id, indexes, job_id in rows if node_id is not None for index in indexes
    }
