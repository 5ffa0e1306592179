"""How long does one scheduler pass take against the database at 1,000 nodes x 8 GPUs?

`bench/scheduler.py` times the pure `schedule` function; this times what the leader really runs every
`scheduler_interval_s` (`gpufleet.jobs.tick.run_tick`): in a read-only transaction, find failed and
overdue runs, read every node, GPU, held rank and queued job, each project's quota, budget and decayed
use, and call `schedule`; then, in a write transaction, end what must end and write the placements
(jobs, ranks) and the pending reasons that changed. Both are timed, and the write alone (the time
SQLite's write lock is held). On a fresh SQLite (or `--database-url`) database it adds
`--nodes` up nodes of 8 GPUs and `--queue` pending 1-GPU to 8-GPU jobs (10 % 2-node gangs) from 8
projects, then times `--passes` passes: the first fills the cluster; before each later pass 10 % of the
running jobs end (as their agents would report) and the queue is topped up again.

    .venv/bin/python bench/jobs_tick.py --json bench/results/jobs_tick.json
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sqlalchemy import select

from gpufleet.auth import projects
from gpufleet.auth.schemas import UserCreate
from gpufleet.auth.users import create_user
from gpufleet.core.clock import FakeClock, to_datetime
from gpufleet.core.db import make_engine, make_session_factory, transaction
from gpufleet.inventory.models import Gpu, Node
from gpufleet.inventory.states import NodeState
from gpufleet.jobs import lifecycle
from gpufleet.jobs.models import Job, JobRank, JobState, RankState
from gpufleet.jobs.scheduler import Policy
from gpufleet.jobs.tick import TickSettings, apply, plan
from gpufleet.migrations import upgrade

GPUS = 8
PROJECTS = [f"p{i}" for i in range(8)]


def _cluster(sessions: Any, clock: FakeClock, nodes: int) -> None:
    now = to_datetime(clock.now())
    with transaction(sessions) as s:
        for i in range(nodes):
            node = Node(
                name=f"gpu{i:04d}",
                state=NodeState.UP,
                state_since=now,
                created_at=now,
                cpus=128,
                memory_total_mib=2 * 1024 * 1024,
                expected_gpus=GPUS,
                health="healthy",
                labels={"rack": f"r{i // 32}"},
            )
            s.add(node)
            s.flush()
            for g in range(GPUS):
                s.add(
                    Gpu(
                        node_id=node.id,
                        index=g,
                        uuid=f"GPU-{i}-{g}",
                        model="NVIDIA H200",
                        pci_bus_id=f"0000:{g:02x}:00.0",
                        memory_total_mib=143771,
                    )
                )
        for p in PROJECTS:
            create_user(s, clock, UserCreate(username=f"u{p}"))
            projects.create_project(s, clock, p)
            projects.add_member(s, clock, p, f"u{p}")
            projects.set_quota(s, p, max_gpus=nodes * GPUS // 4, gpu_hours_budget=None)


def _top_up(sessions: Any, clock: FakeClock, queue: int, rng: random.Random) -> None:
    with transaction(sessions) as s:
        pending = len(list(s.scalars(select(Job.id).where(Job.state == JobState.PENDING))))
        now = to_datetime(clock.now())
        for _ in range(queue - pending):
            project = rng.choice(PROJECTS)
            gang = rng.random() < 0.1
            s.add(
                Job(
                    name="bench",
                    user=f"u{project}",
                    project=project,
                    submitted_by="bench",
                    state=JobState.PENDING,
                    nodes=2 if gang else 1,
                    gpus_per_node=8 if gang else rng.choice([1, 1, 2, 4, 8]),
                    time_limit_s=rng.choice([600, 3600, 14400, 86400]),
                    priority=rng.randint(0, 3),
                    argv=["train"],
                    env={},
                    submitted_at=now,
                )
            )


def _finish_some(sessions: Any, clock: FakeClock, rng: random.Random) -> int:
    """10 % of the running jobs end, as their agents' reports would end them."""
    with transaction(sessions) as s:
        running = list(s.scalars(select(Job).where(Job.state == JobState.RUNNING)))
        ending = rng.sample(running, len(running) // 10)
        for job in ending:
            for rank in job.ranks:
                if rank.state is not RankState.EXITED:
                    lifecycle.exit_rank(s, clock, rank, "completed", 0, "", 3)
        return len(ending)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--queue", type=int, default=10_000)
    parser.add_argument("--passes", type=int, default=10)
    parser.add_argument("--database-url", default=None, help="default: SQLite in a temporary directory")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    rng = random.Random(6)
    workdir = tempfile.mkdtemp(prefix="gpufleet-bench-tick-")
    url = args.database_url or f"sqlite:///{workdir}/gpufleet.db"
    engine = make_engine(url)
    upgrade(engine)
    sessions = make_session_factory(engine)
    clock = FakeClock(1_800_000_000.0)
    settings = TickSettings(policy=Policy(), half_life_s=7 * 86400, max_requeues=3)
    _cluster(sessions, clock, args.nodes)

    times, writes, placed = [], [], []
    for i in range(args.passes):
        if i:
            clock.advance(60)
            _finish_some(sessions, clock, rng)
        _top_up(sessions, clock, args.queue, rng)
        # What run_tick does, with the write (the time SQLite's write lock is held) timed apart.
        start = time.perf_counter()
        with transaction(sessions, readonly=True) as s:
            found = plan(s, clock, settings)
        write_start = time.perf_counter()
        with transaction(sessions) as s:
            result = apply(s, clock, found, settings)
        times.append(time.perf_counter() - start)
        writes.append(time.perf_counter() - write_start)
        placed.append(len(result.placed))
        print(
            f"pass {i}: {times[-1] * 1000:.0f} ms (write {writes[-1] * 1000:.0f} ms), {len(result.placed)} placed,"
            f" {result.waiting} waiting",
            flush=True,
        )
    with transaction(sessions, readonly=True) as s:
        held = len(list(s.scalars(select(JobRank.id).where(JobRank.state != RankState.EXITED))))
    steady = times[1:] or times
    report = {
        "benchmark": "jobs_tick",
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {platform.python_implementation()} {platform.python_version()}",
        "database": url.split(":", 1)[0],
        "nodes": args.nodes,
        "gpus": args.nodes * GPUS,
        "queue": args.queue,
        "first_pass_s": round(times[0], 3),
        "first_pass_placed": placed[0],
        "first_pass_write_s": round(writes[0], 3),
        "steady_write_p50_s": round(statistics.median(writes[1:] or writes), 3),
        "steady_write_max_s": round(max(writes[1:] or writes), 3),
        "steady_pass_p50_s": round(statistics.median(steady), 3),
        "steady_pass_max_s": round(max(steady), 3),
        "steady_placed_per_pass": round(statistics.mean(placed[1:]), 1) if len(placed) > 1 else None,
        "ranks_held_at_end": held,
    }
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
