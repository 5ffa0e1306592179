"""The workload manager the settings name: gpufleet's own, or Slurm with the pass that keeps it in step."""

from __future__ import annotations

import os

from sqlalchemy.orm import Session, sessionmaker

from gpufleet.core.clock import Clock
from gpufleet.core.config import Settings
from gpufleet.jobs.builtin import BuiltinWorkloadManager
from gpufleet.jobs.ports import WorkloadManager
from gpufleet.jobs.slurm.batch import BatchOptions
from gpufleet.jobs.slurm.commands import SlurmCommands
from gpufleet.jobs.slurm.manager import SlurmWorkloadManager
from gpufleet.jobs.slurm.sync import SlurmSync


def build(
    settings: Settings, sessions: sessionmaker[Session], clock: Clock
) -> tuple[WorkloadManager, SlurmSync | None]:
    """The drain/resume side every head uses, and under Slurm the sync pass the leader runs."""
    if settings.workload_manager != "slurm":
        return BuiltinWorkloadManager(clock), None
    conf = str(settings.slurm_conf) if settings.slurm_conf else None
    commands = SlurmCommands(conf, timeout_s=settings.slurm_timeout_s)
    manager = SlurmWorkloadManager(commands, clock)
    options = BatchOptions(
        partition=settings.slurm_partition,
        output_dir=settings.slurm_output_dir,
        run_as_others=os.geteuid() == 0,  # only root may sbatch --uid
    )
    return manager, SlurmSync(sessions, clock, manager, options)
