"""A fleet's burn-in results and maintenance campaigns written straight into a head's database, for the
dashboard's Burn-in and Maintenance pages where no burn-in has run: the browser tests
(tests/browser/test_lifecycle_pages.py) and the documentation's screenshots (dashboard_screenshots.py).

Every node ran the built-in `quick` profile on H200 GPUs. The healthy figures sit about 15 % over the
profile's thresholds (the margin docs/lifecycle.md explains), spread by about a per cent from node to
node; they are illustrative, not measured. Among them, placed at fixed shares of the fleet:

- a weak GPU: one of the node's GPUs computes at two thirds of the others' speed, so `gemm` fails;
- a GPU that computes wrong results: `gemm` is fast enough, but its checksum differs;
- a weak link: `network` fails with two different partners (rotation), which the others passed with;
- a slow node that passes every threshold but lies far under the fleet's median (an outlier);
and two campaigns: one finished, one stopped when its canary failed.

The runs are finished (passed or failed), so the head's burn-in pass has nothing to move on; the failed
nodes are held (`hold = "burn-in-failed"`) and drained as the head holds them.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpufleet.inventory.models import Node
from gpufleet.lifecycle.models import BurnIn, BurnInStep, Campaign, CampaignNode

GPU_MODEL = "NVIDIA H200"
PROFILE = "quick"


@dataclass(frozen=True)
class Step:
    name: str
    unit: str
    better: str
    healthy: float  # a healthy node's figure
    threshold: float  # the quick profile's, for the H200
    noise: float  # node-to-node spread, relative
    seconds: float


# The quick profile's steps (lifecycle/profile_files/quick.toml), in its order.
STEPS = (
    Step("gemm", "TFLOPS", "higher", 712.0, 600.0, 0.006, 60),
    Step("gpu-memory", "GB/s", "higher", 4010.0, 3400.0, 0.005, 30),
    Step("host-copy", "GB/s", "higher", 49.5, 40.0, 0.008, 20),
    Step("gpu-peer", "GB/s", "higher", 362.0, 300.0, 0.006, 20),
    Step("thermal", "C", "lower", 71.0, 87.0, 0.02, 120),
    Step("allreduce", "GB/s", "higher", 41.5, 35.0, 0.008, 30),
    Step("network", "Gbit/s", "higher", 382.0, 320.0, 0.005, 20),
)
PAIR_STEPS = ("allreduce", "network")


@dataclass(frozen=True)
class Seeded:
    weak_gpu: str
    wrong_results: str
    weak_link: str
    slow: str
    stopped_campaign: str
    done_campaign: str
    runs: dict[str, int]  # each node's run id

    @property
    def held(self) -> list[str]:
        return sorted((self.weak_gpu, self.wrong_results, self.weak_link))


def pick(names: Sequence[str], share: float, taken: set[str]) -> str:
    """The node at `share` of the fleet, or the next one not taken yet."""
    index = min(len(names) - 1, int(share * len(names)))
    while names[index] in taken:
        index = (index + 1) % len(names)
    taken.add(names[index])
    return names[index]


@dataclass(frozen=True)
class _Faults:
    weak_gpu: str
    wrong: str
    weak_link: str
    slow: str
    partners: dict[str, str]  # each node's first partner in the pair steps
    second: str  # the weak link's second partner


def seed(session: Session, names: Sequence[str], now: datetime | None = None) -> Seeded:
    """Write one finished quick run per node in `names` (at least 8 of them, all registered) and the two
    campaigns; the caller commits."""
    if len(names) < 8:
        raise ValueError("the demo needs at least 8 nodes")
    now = now or datetime.now(UTC)
    # Not for secrets: the same figures every time, so screenshots differ only where the page does.
    rng = random.Random(24)  # noqa: S311
    taken: set[str] = set()
    weak_gpu, wrong, weak_link, slow = (pick(names, s, taken) for s in (0.4, 0.6, 0.8, 0.7))
    partners = {n: names[(i + 1) % len(names)] if i % 2 == 0 else names[i - 1] for i, n in enumerate(names)}
    faults = _Faults(weak_gpu, wrong, weak_link, slow, partners, names[(names.index(weak_link) + 3) % len(names)])
    ids: dict[str, int] = dict(session.execute(select(Node.name, Node.id).where(Node.name.in_(names))).all())
    runs = {node: _run(session, rng, node, ids[node], faults, now - timedelta(hours=2)) for node in names}
    done = _campaign(
        session,
        "driver-550",
        names,
        ids,
        "completed",
        [
            {"kind": "packages", "mode": "upgrade", "packages": ["nvidia-driver-550"]},
            {"kind": "reboot"},
            {"kind": "burn-in", "profile": PROFILE},
        ],
        now - timedelta(days=2),
        phase=lambda _i: "done",
    )
    stopped = _campaign(
        session,
        "image-r3",
        names,
        ids,
        "stopped",
        [{"kind": "sync-image", "image": "base", "revision": 3}, {"kind": "reboot"}],
        now - timedelta(minutes=20),
        phase=lambda i: "failed" if i == 0 else "pending",
        reason=f"the canary {names[0]} failed: sync-image:base@3: rsync exited 23 (some files were not transferred)"
        "; fix it and resume, or cancel",
    )
    return Seeded(weak_gpu, wrong, weak_link, slow, stopped, done, runs)


def _run(session: Session, rng: random.Random, node: str, node_id: int, faults: _Faults, start: datetime) -> int:
    """One node's finished run; a failed one holds its node as the head would."""
    run = BurnIn(
        node_id=node_id,
        node=node,
        profile=PROFILE,
        batch=f"admission:{PROFILE}",
        state="passed",
        gpu_model=GPU_MODEL,
        resume_on_pass=True,
        requested_by="gpufleet:burn-in",
        created_at=start,
        started_at=start + timedelta(seconds=5),
    )
    at = start + timedelta(seconds=5)
    failed: str | None = None
    for position, step in enumerate(STEPS):
        row = BurnInStep(
            position=position,
            name=step.name,
            kind=step.name,
            state="passed",
            attempts=1,
            unit=step.unit,
            threshold=step.threshold,
            better=step.better,
            evidence={},
            started_at=at,
        )
        run.steps.append(row)
        if failed is not None:
            row.state, row.detail, row.unit = "skipped", "not run: an earlier step failed", ""
            continue
        at += timedelta(seconds=step.seconds + rng.uniform(4, 9))
        row.ended_at = at
        _measure(row, step, node, rng, faults)
        if row.state == "failed":
            failed = f"{step.name}: {row.detail}"
    run.ended_at = at
    if failed is not None:
        run.state, run.reason = "failed", failed
        held = session.get_one(Node, node_id)
        held.hold, held.drained_at, held.drained_by = "burn-in-failed", at, "gpufleet:burn-in"
        held.drain_reason = f"gpufleet: burn-in failed: {failed}"[:512]
    session.add(run)
    session.flush()
    return run.id


def _measure(row: BurnInStep, step: Step, node: str, rng: random.Random, faults: _Faults) -> None:
    """The step's value, state and evidence on `node`: healthy, or as its fault makes it."""
    row.value = round(step.healthy * (1 + rng.gauss(0, step.noise)), 1)
    if step.name in PAIR_STEPS:
        row.partner = faults.partners[node]
    if step.name == "gemm":
        per_gpu = {str(g): round(row.value * (1 + rng.gauss(0, 0.003)), 1) for g in range(8)}
        if node == faults.weak_gpu:
            per_gpu["3"] = round(row.value * 0.68, 1)
        if node == faults.slow:
            per_gpu = {g: round(v * 0.92, 1) for g, v in per_gpu.items()}
        row.value = min(per_gpu.values())
        row.evidence = {"per_gpu": per_gpu, "dtype": "bf16", "size": 8192, "checksum": "ok"}
        if node == faults.weak_gpu:
            row.state, row.detail = "failed", f"{row.value:.4g} TFLOPS under threshold 600 (GPU 3)"
        if node == faults.wrong:
            row.state = "failed"
            row.detail = "checksum mismatch on GPU 5: 3 of 64 tiles differ from the reference"
            row.evidence = {**row.evidence, "checksum": "mismatch", "bad_gpus": ["5"]}
    elif step.name == "thermal":
        row.evidence = {"throttle_reasons": [], "clock_mhz_min": 1965}
    elif step.name == "network" and node == faults.weak_link:
        first = faults.partners[node]
        row.value, row.attempts, row.partner, row.state = 191.4, 2, faults.second, "failed"
        row.detail = f"191.4 Gbit/s with {faults.second}, and before with {first}"
        # As lifecycle.burnin keeps a pair step's tries: each partner, its job and the pair's value.
        tries = [(first, 188.2), (faults.second, 191.4)]
        row.evidence = {
            "attempts": [{"partner": p, "job": None, "value": v} for p, v in tries],
            "partners": sorted(p for p, _ in tries),
        }
    elif step.name == "network" and node == faults.partners[faults.weak_link]:
        row.attempts = 2  # paired again, with a node known good, after failing with the weak link


def _campaign(
    session: Session,
    name: str,
    names: Sequence[str],
    ids: dict[str, int],
    state: str,
    actions: list[dict[str, Any]],
    at: datetime,
    *,
    phase: Callable[[int], str],
    reason: str = "",
) -> str:
    ended = at + timedelta(hours=3) if state == "completed" else None
    campaign = Campaign(
        name=name,
        state=state,
        actions=actions,
        # As lifecycle.campaigns keeps a campaign's policy.
        policy={
            "max_unavailable": "2",
            "wait_jobs_s": 3600.0,
            "overdue": "wait",
            "keep": 1,
            "failure_budget": 1,
            "canary": True,
            "boot_timeout_s": 1800.0,
        },
        selector={"nodes": f"{names[0]}..{names[-1]}"},
        failures=1 if state == "stopped" else 0,
        reason=reason,
        created_by="alice",
        created_at=at,
        updated_at=ended or at + timedelta(minutes=4),
        ended_at=ended,
    )
    for i, node in enumerate(names):
        this = phase(i)
        campaign.nodes.append(
            CampaignNode(
                node_id=ids[node],
                node=node,
                position=i,
                canary=i == 0,
                phase=this,
                action=len(actions) if this == "done" else 0,
                detail={
                    "done": "every action done; back in service",
                    "failed": "sync-image:base@3: rsync exited 23 (some files were not transferred)",
                }.get(this, ""),
                started_at=at + timedelta(minutes=1 + i) if this != "pending" else None,
                ended_at=at + timedelta(minutes=3 + i) if this in ("done", "failed") else None,
            )
        )
    session.add(campaign)
    session.flush()
    return name
