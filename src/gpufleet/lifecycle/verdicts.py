"""How the head judges a burn-in step from what the node printed: the step's result line read back from the
job's output, its value against the threshold for the node's GPU model, and for pair steps the worse of the
two ranks. Pure but for reading the output; lifecycle.burnin decides what runs next.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpufleet.core.clock import Clock, to_datetime
from gpufleet.jobs.models import Job, JobOutputChunk, JobState
from gpufleet.lifecycle.models import BurnInStep
from gpufleet.protocol.burnin import BadResult, StepResult, parse_result

# Step states. A multi-node step that fell short with partners not all known to be good is "retry": it is
# measured again (lifecycle.grouping).
PENDING, RUNNING, RETRY, PASSED, FAILED, SKIPPED = "pending", "running", "retry", "passed", "failed", "skipped"
STEP_DONE = (PASSED, FAILED, SKIPPED)
MAX_PAIR_ATTEMPTS = 3  # a pair step's measures of one node; groups allow more (grouping.max_attempts)

# How much of the end of a rank's output is read back for its result line: the line is the last thing a
# step prints, and a step's chatter before it (stress-ng, fio) is not the head's to keep reading.
RESULT_TAIL_CHUNKS = 32


def threshold_for(step: BurnInStep, gpu_model: str | None) -> float | None:
    model = (gpu_model or "").lower()
    for key, value in step.thresholds.items():
        if key != "default" and model and key in model:
            return float(value)
    default = step.thresholds.get("default")
    return float(default) if default is not None else None


def rank_result(session: Session, job: Job, rank: int) -> StepResult:
    """The result line of one rank of the job's last run. Raises BadResult."""
    rows = session.scalars(
        select(JobOutputChunk.data)
        .where(
            JobOutputChunk.job_id == job.id,
            JobOutputChunk.run == job.run,
            JobOutputChunk.rank == rank,
            JobOutputChunk.stream == "stdout",
        )
        .order_by(JobOutputChunk.id.desc())
        .limit(RESULT_TAIL_CHUNKS)
    )
    return parse_result("".join(reversed(list(rows))))


def job_failure(job: Job) -> str:
    what = {
        JobState.TIMEOUT: "ran past its time limit",
        JobState.NODE_FAIL: "lost its node",
        JobState.CANCELLED: "was cancelled",
    }.get(job.state, f"ended {job.state.value}")
    reason = f" ({job.reason})" if job.reason else ""
    return f"the step's job {job.id} {what}{reason}"


def judge_failed(step: BurnInStep, detail: str, clock: Clock) -> None:
    step.state, step.detail, step.ended_at = FAILED, detail[:1024], to_datetime(clock.now())


def judge(step: BurnInStep, result: StepResult, clock: Clock) -> None:
    """A single-node step's verdict from its result."""
    step.ended_at = to_datetime(clock.now())
    step.unit = result.unit[:16]
    step.evidence = evidence_of(result)
    if result.kind != step.kind:
        step.state, step.detail = FAILED, f"the step reported a {result.kind!r} result, not {step.kind!r}"
        return
    if result.skipped:
        step.state, step.detail = SKIPPED, result.detail or "the node lacks what this step needs"
        return
    step.value = result.value
    if not result.ok:
        step.state, step.detail = FAILED, result.detail or "the step reported a failure"
        return
    worst = worst_gpu(result, step.better)
    if step.threshold is not None and not passes(result.value, step.threshold, step.better):
        where = f" (GPU {worst})" if worst is not None else ""
        step.state = FAILED
        step.detail = f"{figure(result.value, step)} {comparison(step)} threshold {step.threshold:g}{where}"
        return
    step.state, step.detail = PASSED, result.detail


# GPU steps that may rightly skip on a node with GPUs: DCGM is optional, a peer copy needs two GPUs.
MAY_SKIP_WITH_GPUS = frozenset({"dcgm", "gpu-peer"})


def judge_gpu_coverage(step: BurnInStep, result: StepResult, gpus: int) -> None:
    """A GPU step on a node with GPUs must measure every GPU it was given: one that skipped (torch missing,
    CUDA unusable: a broken driver) or measured fewer GPUs than it holds proves nothing about the rest."""
    if step.state == SKIPPED and step.kind not in MAY_SKIP_WITH_GPUS:
        step.state = FAILED
        step.detail = f"could not run on the node's {gpus} GPU(s): {result.detail or 'skipped'}"[:1024]
    elif step.state == PASSED and result.per_gpu and len(result.per_gpu) < gpus:
        step.state = FAILED
        step.detail = f"measured {len(result.per_gpu)} of the {gpus} GPUs it was given"


def evidence_of(result: StepResult) -> dict[str, object]:
    evidence: dict[str, object] = dict(result.evidence)
    if result.per_gpu:
        evidence["per_gpu"] = dict(result.per_gpu)
    return evidence


def worst_gpu(result: StepResult, better: str) -> str | None:
    if not result.per_gpu:
        return None
    pick = min if better == "higher" else max
    return pick(result.per_gpu, key=lambda k: result.per_gpu[k])


def passes(value: float, threshold: float, better: str) -> bool:
    return value >= threshold if better == "higher" else value <= threshold


def comparison(step: BurnInStep) -> str:
    return "under" if step.better == "higher" else "over"


def figure(value: float, step: BurnInStep) -> str:
    return f"{value:.4g} {step.unit}".strip()


def failure(step: BurnInStep) -> str:
    """A failed run's reason: the step, and its value against the threshold where it has them."""
    return f"{step.name}: {step.detail}"[:1024]


def pair_results(session: Session, job: Job, kind: str, better: str) -> tuple[float | None, str, str, bool]:
    """Every rank's result as one: (value, problem, unit, skipped). The value is the worst rank's: a link
    is as fast as its slower side, and an all-reduce over a group as its weakest member."""
    results: list[StepResult] = []
    for rank in sorted({r.rank for r in job.ranks if r.run == job.run}):
        try:
            results.append(rank_result(session, job, rank))
        except BadResult as exc:
            problem = job_failure(job) if job.state is not JobState.COMPLETED else f"rank {rank}: {exc}"
            return None, problem, "", False
    unit = results[0].unit if results else ""
    if any(r.skipped for r in results):
        return None, "; ".join(r.detail for r in results if r.skipped), unit, True
    wrong = next((r.kind for r in results if r.kind != kind), None)
    if wrong is not None:
        return None, f"the step reported a {wrong!r} result, not {kind!r}", unit, False
    bad = next((r for r in results if not r.ok), None)
    if bad is not None:
        return None, bad.detail or "the step reported a failure", unit, False
    pick = min if better == "higher" else max
    return pick(r.value for r in results), "", unit, False
