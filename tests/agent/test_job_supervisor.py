"""The agent's job supervisor over a scripted executor: idempotent starts, cancels, reports re-sent
until acknowledged, output coalesced by offset, and ranks lost with a crashed node."""

import asyncio
import json
from typing import Any

from gpufleet.agent.jobs.ports import OnOutput, OnStarted, RankResult
from gpufleet.agent.jobs.supervisor import MAX_OUTPUT_MESSAGE_BYTES, JobSupervisor, split_output
from gpufleet.protocol.jobs import MAX_OUTPUT_CHUNK, JobAck, JobCancel, JobStart


class Scripted:
    """Runs each rank until released (or cancelled); writes what the test asks it to."""

    def __init__(self) -> None:
        self.runs = 0
        self.release: dict[int, asyncio.Event] = {}
        self.outputs: dict[int, OnOutput] = {}

    async def run(
        self, launch: JobStart, on_started: OnStarted, on_output: OnOutput, cancel: asyncio.Event
    ) -> RankResult:
        self.runs += 1
        done = self.release.setdefault(launch.job_id, asyncio.Event())
        self.outputs[launch.job_id] = on_output
        on_started()
        stop = asyncio.ensure_future(cancel.wait())
        end = asyncio.ensure_future(done.wait())
        await asyncio.wait({stop, end}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        end.cancel()
        if cancel.is_set():
            return RankResult("cancelled", -15, "killed")
        return RankResult("completed", 0)


async def _started(job_id: int) -> tuple[Scripted, JobSupervisor]:
    """A supervisor (output flushed after 10 ms) running one rank of job `job_id` on a scripted executor."""
    executor = Scripted()
    sup = JobSupervisor(executor, flush_s=0.01)
    sup.start(_start(job_id))
    await asyncio.sleep(0)
    return executor, sup


def _start(job_id: int) -> JobStart:
    return JobStart(job_id=job_id, run=1, rank=0, world_size=1, user="alice", argv=["true"], time_limit_s=60)


async def _sent(sup: JobSupervisor) -> list[str]:
    """What the supervisor sends in 50 ms, as the text of each message."""
    sent: list[str] = []

    async def send(text: str) -> None:
        sent.append(text)

    task = asyncio.create_task(sup.send_forever(send))
    await asyncio.sleep(0.05)
    task.cancel()
    return sent


async def _drain(sup: JobSupervisor) -> list[dict[str, Any]]:
    return [json.loads(t) for t in await _sent(sup)]


def test_a_start_runs_once_and_its_end_is_resent_until_acknowledged() -> None:
    asyncio.run(_a_start_runs_once_and_its_end_is_resent_until_acknowledged())


async def _a_start_runs_once_and_its_end_is_resent_until_acknowledged() -> None:
    executor, sup = await _started(1)
    sup.start(_start(1))  # resent by the head: no second run
    executor.release[1].set()
    await asyncio.sleep(0.02)
    assert executor.runs == 1
    first = await _drain(sup)
    assert [(m["type"], m.get("state"), m.get("outcome")) for m in first] == [
        ("job_update", "running", None),
        ("job_update", "running", None),
        ("job_update", "exited", "completed"),
    ]
    sup.connected()  # a reconnect: the end again, then what is held (nothing)
    again = await _drain(sup)
    assert [(m["type"], m.get("outcome")) for m in again] == [("job_update", "completed"), ("job_held", None)]
    assert again[1]["ranks"] == []
    sup.acknowledged(JobAck(job_id=1, run=1, rank=0))
    sup.connected()
    assert [m["type"] for m in await _drain(sup)] == ["job_held"]


def test_cancel_stops_a_rank_and_answers_for_one_it_never_ran() -> None:
    asyncio.run(_cancel_stops_a_rank_and_answers_for_one_it_never_ran())


async def _cancel_stops_a_rank_and_answers_for_one_it_never_ran() -> None:
    _executor, sup = await _started(2)
    sup.connected()
    held = [m for m in await _drain(sup) if m["type"] == "job_held"]
    assert held[0]["ranks"] == [{"job_id": 2, "run": 1, "rank": 0}]
    sup.cancel(JobCancel(job_id=2, run=1, rank=0))
    sup.cancel(JobCancel(job_id=9, run=1, rank=0))
    await asyncio.sleep(0.02)
    updates = [(m["job_id"], m["outcome"]) for m in await _drain(sup) if m.get("state") == "exited"]
    assert sorted(updates) == [(2, "cancelled"), (9, "cancelled")]


def test_output_is_coalesced_and_split_with_running_offsets() -> None:
    asyncio.run(_output_is_coalesced_and_split_with_running_offsets())


async def _output_is_coalesced_and_split_with_running_offsets() -> None:
    executor, sup = await _started(3)
    write = executor.outputs[3]
    write("stdout", "a")
    write("stdout", "b\n")
    write("stderr", "warn\n")
    await asyncio.sleep(0.03)
    write("stdout", "x" * (MAX_OUTPUT_CHUNK + 5))
    executor.release[3].set()
    await asyncio.sleep(0.03)
    chunks = [(m["stream"], m["offset"], len(m["data"])) for m in await _drain(sup) if m["type"] == "job_output"]
    assert chunks == [
        ("stdout", 0, 3),
        ("stderr", 0, 5),
        ("stdout", 3, MAX_OUTPUT_CHUNK),
        ("stdout", 3 + MAX_OUTPUT_CHUNK, 5),
    ]


def test_a_crash_loses_every_rank_without_a_word() -> None:
    asyncio.run(_a_crash_loses_every_rank_without_a_word())


async def _a_crash_loses_every_rank_without_a_word() -> None:
    _executor, sup = await _started(4)
    sup.lose_all()
    await asyncio.sleep(0.01)
    sup.connected()
    assert [(m["type"], m.get("ranks")) for m in await _drain(sup)] == [("job_held", [])]


def test_output_messages_stay_under_the_byte_budget_whatever_the_characters() -> None:
    asyncio.run(_output_messages_stay_under_the_byte_budget_whatever_the_characters())


async def _output_messages_stay_under_the_byte_budget_whatever_the_characters() -> None:
    executor, sup = await _started(5)
    write = executor.outputs[5]
    escapes = "\x1b[0m\x00\x01" * 20_000  # 6 bytes each as JSON (\u001b, \u0000), "[0m" 1 each
    emoji = '🚀é"\\' * 20_000  # 4 and 2 bytes of UTF-8, 2 bytes escaped
    write("stdout", escapes)
    write("stderr", emoji)
    executor.release[5].set()
    await asyncio.sleep(0.05)
    sent = await _sent(sup)
    chunks = [json.loads(text) for text in sent if json.loads(text)["type"] == "job_output"]
    assert all(len(text.encode()) <= MAX_OUTPUT_MESSAGE_BYTES for text in sent)
    assert max(len(text.encode()) for text in sent) > MAX_OUTPUT_MESSAGE_BYTES - 1024  # parts are not tiny
    for stream, data in (("stdout", escapes), ("stderr", emoji)):
        parts = [m for m in chunks if m["stream"] == stream]
        assert len(parts) > 1
        assert "".join(m["data"] for m in parts) == data
        offsets = [m["offset"] for m in parts]
        assert offsets == [sum(len(m["data"]) for m in parts[:i]) for i in range(len(parts))]  # in characters


def test_split_output_bounds_characters_and_bytes() -> None:
    assert list(split_output("")) == []
    assert list(split_output("abcdef", max_chars=4)) == ["abcd", "ef"]
    assert list(split_output("\x00\x00\x00", max_bytes=12)) == ["\x00\x00", "\x00"]
    assert list(split_output("🚀🚀🚀", max_bytes=9)) == ["🚀🚀", "🚀"]
    assert list(split_output("\x00", max_bytes=1)) == ["\x00"]  # one character always goes


def test_a_ranks_end_goes_after_the_output_queued_before_it() -> None:
    asyncio.run(_a_ranks_end_goes_after_the_output_queued_before_it())


async def _a_ranks_end_goes_after_the_output_queued_before_it() -> None:
    """The head takes a job whose ranks all ended as done: `job logs --follow` stops there, so the rank's
    last output must not still be on its way (control messages otherwise go first)."""
    executor, sup = await _started(4)
    executor.outputs[4]("stdout", "last words\n")
    executor.release[4].set()
    await asyncio.sleep(0.001)  # the rank ends before the output's coalescing timer: flushed at its end
    kinds = [(m["type"], m.get("state")) for m in await _drain(sup)]
    assert kinds == [("job_update", "running"), ("job_output", None), ("job_update", "exited")]
