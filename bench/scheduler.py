"""How many placement decisions per second does the built-in scheduler make at 1,000 nodes x 8 GPUs?

The scheduler is a pure function (`gpufleet.jobs.scheduler.schedule`), so this times it alone, in this
process, with no database or server. The cluster: `--nodes` nodes of 8 GPUs, 64 CPUs and 1 TiB,
32 to a rack (the topology label), 80 % in a "train" category packed and 20 % in an "infer" category
spread; 2 % are down and 1 % drained (unschedulable). The queue: `--queue` jobs of mixed shapes (1, 2,
4 or 8 GPUs on one node, and 10 % gangs of 2-4 nodes x 8 GPUs), time limits from 10 minutes to a day,
priorities 0-3, some bound to a category, from 8 projects with GPU quotas, budgets and decayed usage.

Passes: the first on an empty cluster (it fills up); then `--passes` steady-state passes, each one
minute later: the previous pass's placements start running, 10 % of running jobs end, and new jobs
top the queue back up to `--queue`. Only the `schedule` call is timed (building its input is the
caller's cost, as it would be the scheduler tick's). A decision is a placement or a pending verdict
(with its reason); decisions per second = (placements + pending) / time in `schedule`, summed over
passes; placements per second is reported separately.

    .venv/bin/python bench/scheduler.py --json bench/results/scheduler.json

Goal (issue 6): >= 2,000 placement decisions per second at 1,000 nodes x 8 GPUs and 10,000 queued jobs.
Exit status 0 when met, 1 when not.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import random
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from gpufleet.jobs.scheduler import JobRequest, NodeView, Policy, ProjectLimits, RunningJob, schedule

GPUS = 8
GOAL = 2000.0
PROJECTS = [f"proj{i}" for i in range(8)]


def make_nodes(count: int, rng: random.Random) -> tuple[list[str], dict[str, bool], dict[str, str]]:
    names = [f"gpu{i:04}" for i in range(count)]
    schedulable = {n: rng.random() >= 0.03 for n in names}  # 2 % down + 1 % drained
    category = {n: ("train" if i % 5 else "infer") for i, n in enumerate(names)}
    return names, schedulable, category


def make_job(i: int, now: float, rng: random.Random) -> JobRequest:
    r = rng.random()
    nodes, gpus = 1, 1
    if r < 0.40:
        gpus = 1
    elif r < 0.55:
        gpus = 2
    elif r < 0.70:
        gpus = 4
    elif r < 0.90:
        gpus = 8
    else:
        nodes, gpus = rng.randint(2, 4), 8
    return JobRequest(
        id=f"job{i:07}",
        project=rng.choice(PROJECTS),
        nodes=nodes,
        gpus_per_node=gpus,
        cpus_per_node=gpus * 8,
        mem_per_node_mib=gpus * 100_000,
        time_limit_s=rng.choice([600.0, 3600.0, 4 * 3600.0, 24 * 3600.0]),
        priority=rng.choice([0, 0, 0, 1, 1, 2, 3]),
        submitted_at=now - rng.uniform(0, 86_400),
        category=rng.choice([None] * 8 + ["train", "infer"]),
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--queue", type=int, default=10_000)
    ap.add_argument("--passes", type=int, default=10, help="steady-state passes after the first (filling) one")
    ap.add_argument("--seed", type=int, default=6)
    ap.add_argument("--no-quotas", action="store_true", help="no max_gpus or budgets: every verdict is about resources")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args()

    rng = random.Random(args.seed)
    now = 1_800_000_000.0
    names, schedulable, category = make_nodes(args.nodes, rng)
    free: dict[str, set[int]] = {n: set(range(GPUS)) for n in names}
    cpus_free = dict.fromkeys(names, 64)
    mem_free = dict.fromkeys(names, 1_048_576)
    projects = {
        p: ProjectLimits(
            max_gpus=None if args.no_quotas else [None, 2000, 1500, 1000, 800, 600, 400, 200][i],
            gpu_hours_left=None if args.no_quotas else [None, None, 1e6, 5e5, 2e5, 1e5, 5e4, 2e4][i],
            usage=rng.uniform(0, 1e7),
            share=[4, 2, 2, 1, 1, 1, 0.5, 0.5][i],
        )
        for i, p in enumerate(PROJECTS)
    }
    policy = Policy(placement={"train": "pack", "infer": "spread"}, default="pack", backfill=True)
    next_id = 0
    queue: dict[str, JobRequest] = {}
    running: dict[str, tuple[RunningJob, JobRequest]] = {}

    def top_up() -> None:
        nonlocal next_id
        while len(queue) < args.queue:
            job = make_job(next_id, now, rng)
            queue[job.id] = job
            next_id += 1

    rows: list[dict[str, Any]] = []
    gc.collect()
    for pass_no in range(args.passes + 1):
        if pass_no:
            now += 60.0
            # 10 % of running jobs end (in the caller: their GPUs, CPUs and memory come back).
            for job_id in rng.sample(sorted(running), len(running) // 10):
                rj, req = running.pop(job_id)
                for n, gpus in rj.allocation.items():
                    free[n] |= gpus
                    cpus_free[n] += req.cpus_per_node
                    mem_free[n] += req.mem_per_node_mib
        top_up()
        views = [
            NodeView(
                name=n,
                gpu_count=GPUS,
                gpus=frozenset(free[n]),
                cpus_free=cpus_free[n],
                mem_free_mib=mem_free[n],
                cpus=64,
                mem_mib=1_048_576,
                schedulable=schedulable[n],
                category=category[n],
                topology=f"rack{i // 32:02}",
            )
            for i, n in enumerate(names)
        ]
        run_list = [rj for rj, _ in running.values()]
        q = list(queue.values())
        t0 = time.perf_counter()
        d = schedule(views, run_list, q, projects, now, policy)
        dt = time.perf_counter() - t0
        for p in d.placements:
            req = queue.pop(p.job_id)
            alloc = {n: frozenset(g) for n, g in p.allocation.items()}
            running[p.job_id] = (RunningJob(p.job_id, req.project, alloc, now + req.time_limit_s), req)
            for n, g in alloc.items():
                free[n] -= g
                cpus_free[n] -= req.cpus_per_node
                mem_free[n] -= req.mem_per_node_mib
        reasons = Counter(str(r) for r in d.pending.values())
        used = sum(len(rj.allocation[n]) for rj, _ in running.values() for n in rj.allocation)
        rows.append(
            {
                "pass": pass_no,
                "seconds": dt,
                "queued": len(q),
                "running_before": len(run_list),
                "placements": len(d.placements),
                "pending": len(d.pending),
                "decisions_per_s": (len(d.placements) + len(d.pending)) / dt,
                "gpus_in_use_after": used,
                "reasons": dict(sorted(reasons.items())),
                "reservation": None if d.reservation is None else d.reservation.job_id,
            }
        )

    total_s = sum(r["seconds"] for r in rows)
    decisions = sum(r["placements"] + r["pending"] for r in rows)
    placements = sum(r["placements"] for r in rows)
    times = [r["seconds"] for r in rows]
    result = {
        "benchmark": "scheduler",
        "nodes": args.nodes,
        "gpus_per_node": GPUS,
        "schedulable_nodes": sum(schedulable.values()),
        "queue": args.queue,
        "quotas": not args.no_quotas,
        "passes": len(rows),
        "decisions_per_s": decisions / total_s,
        "placements_per_s": placements / total_s,
        "placements": placements,
        "first_pass_placements_per_s": rows[0]["placements"] / rows[0]["seconds"],
        "pass_p50_s": statistics.median(times),
        "pass_max_s": max(times),
        "goal_decisions_per_s": GOAL,
        "met": decisions / total_s >= GOAL,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "per_pass": rows,
    }
    print(
        f"{'pass':>4} {'queued':>7} {'running':>7} {'placed':>6} {'pending':>7} {'ms':>8} {'decisions/s':>12}  reasons"
    )
    for r in rows:
        print(
            f"{r['pass']:>4} {r['queued']:>7} {r['running_before']:>7} {r['placements']:>6} {r['pending']:>7} "
            f"{r['seconds'] * 1000:>8.1f} {r['decisions_per_s']:>12,.0f}  {r['reasons']}"
        )
    for key in (
        "decisions_per_s",
        "placements_per_s",
        "first_pass_placements_per_s",
        "pass_p50_s",
        "pass_max_s",
        "met",
    ):
        value = result[key]
        print(f"{key:28} {value:,.3f}" if isinstance(value, float) else f"{key:28} {value}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
