"""The agent's side of jobs: start and stop ranks as the head asks, and report them until it listens.

Each rank runs in a task of its own through the node's executor (`ports.JobExecutor`). Reports go out
in two queues: *control* (running/exited updates and the list of ranks held) and *output* (stdout and
stderr chunks, coalesced for `flush_s` and bounded: when the head is unreachable for long the oldest
chunks go, the node's spool keeps everything). A rank's end is re-sent after every reconnect until the
head acknowledges it (`job_ack`), so a job's exit code is never lost with a dropped channel.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field

from gpufleet.agent.artifacts import ArtifactCache, Staged, describe_staged, job_variables
from gpufleet.agent.jobs.ports import JobExecutor, RankResult
from gpufleet.protocol.artifacts import ArtifactError
from gpufleet.protocol.jobs import (
    MAX_OUTPUT_CHUNK,
    JobAck,
    JobCancel,
    JobHeld,
    JobOutput,
    JobStart,
    JobUpdate,
    RankRef,
    Stream,
)

log = logging.getLogger(__name__)
Key = tuple[int, int, int]  # (job id, run, rank)
MAX_QUEUED_OUTPUT = 2000  # chunks (up to MAX_OUTPUT_MESSAGE_BYTES each) waiting for the head
# A job_output message's encoded JSON, well under the channel's frame (MAX_CHANNEL_MESSAGE_BYTES, 64 KiB):
# MAX_OUTPUT_CHUNK characters alone do not bound it, as JSON writes a control character as 6 bytes
# (\u001b) and UTF-8 takes up to 4 bytes a character.
MAX_OUTPUT_MESSAGE_BYTES = 48 * 1024
_ENVELOPE_BYTES = 512  # the message around its data, with the largest ids and offsets (about 150 bytes)
SendText = Callable[[str], Awaitable[None]]


@dataclass
class _Rank:
    launch: JobStart
    cancel: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    started: bool = False
    result: RankResult | None = None
    pending: dict[str, str] = field(default_factory=lambda: {"stdout": "", "stderr": ""})
    offsets: dict[str, int] = field(default_factory=lambda: {"stdout": 0, "stderr": 0})


def _key(ref: RankRef) -> Key:
    return (ref.job_id, ref.run, ref.rank)


class JobSupervisor:
    def __init__(self, executor: JobExecutor, flush_s: float = 0.25, cache: ArtifactCache | None = None) -> None:
        self.executor = executor
        self.flush_s = flush_s
        self.cache = cache  # where a rank's models and datasets are staged; None: this node stages none
        self._staging = asyncio.Lock()  # one stage at a time: two ranks needing one dataset copy it once
        self._report_task: asyncio.Task[None] | None = None
        self.ranks: dict[Key, _Rank] = {}
        # (message, after_output): a rank's end waits for the output queued before it (see send_forever).
        self._control: deque[tuple[str, bool]] = deque()
        self._output: deque[str] = deque(maxlen=MAX_QUEUED_OUTPUT)
        self._ready = asyncio.Event()
        self._flush_handle: asyncio.TimerHandle | None = None

    # -- what the head says -------------------------------------------------------------------------
    def start(self, launch: JobStart) -> None:
        key = _key(launch)
        rank = self.ranks.get(key)
        if rank is not None:  # a resent start: the head may have missed our answer
            self._report(rank)
            return
        rank = _Rank(launch=launch)
        self.ranks[key] = rank
        rank.task = asyncio.create_task(self._run(rank), name=f"job-{launch.job_id}.{launch.run}.{launch.rank}")

    def gpus_in_use(self) -> set[int]:
        """The GPU indexes of the ranks that have not ended (a MIG device's rank holds its GPU)."""
        return {i for rank in self.ranks.values() if rank.result is None for i in rank.launch.gpu_indexes}

    def cancel(self, order: JobCancel) -> None:
        rank = self.ranks.get(_key(order))
        if rank is None:  # never started here, or ended and acknowledged: nothing holds its GPUs
            ref = RankRef(job_id=order.job_id, run=order.run, rank=order.rank)
            self._send_control(_update(ref, "exited", RankResult("cancelled", None, "not running on this node")))
            return
        if rank.result is not None:
            self._report(rank)
            return
        log.info("job %s rank %s: stopping (%s)", order.job_id, order.rank, order.reason)
        rank.cancel.set()

    def acknowledged(self, ack: JobAck) -> None:
        rank = self.ranks.get(_key(ack))
        if rank is not None and rank.result is not None:
            del self.ranks[_key(ack)]

    def connected(self) -> None:
        """After each welcome: re-send what the head may have missed, ends first, then the ranks held (so
        the head never takes a rank that ended for one it lost)."""
        self._control.clear()
        for rank in self.ranks.values():
            self._report(rank)
        held = [rank.launch for rank in self.ranks.values() if rank.result is None]
        refs = [RankRef(job_id=r.job_id, run=r.run, rank=r.rank) for r in held]
        self._send_control(JobHeld(ranks=refs).model_dump_json())
        if self.cache is not None and self.cache.in_use:
            # Off the event loop (the first report reads the cache's index and clears leftovers), and
            # under the staging lock, so it never reads the cache halfway through a stage.
            self._report_task = asyncio.create_task(self._report_cache(self.cache))

    def lose_all(self) -> None:
        """A simulated node crash: every rank's processes die with the node, and nothing is reported."""
        for rank in self.ranks.values():
            if rank.task is not None:
                rank.task.cancel()
        self.ranks.clear()
        self._control.clear()
        self._output.clear()

    # -- running ------------------------------------------------------------------------------------
    async def _run(self, rank: _Rank) -> None:
        launch = rank.launch

        def on_started() -> None:
            rank.started = True
            self._send_control(_update(launch, "running"))

        def on_output(stream: Stream, text: str) -> None:
            rank.pending[stream] += text
            if len(rank.pending[stream]) >= MAX_OUTPUT_CHUNK:
                self._flush(rank)
            elif self._flush_handle is None:
                self._flush_handle = asyncio.get_running_loop().call_later(self.flush_s, self._flush_all)

        result: RankResult | None = None
        if launch.artifacts:
            try:
                staged = await self._stage(launch)
            except ArtifactError as exc:
                result = RankResult("error", None, str(exc)[:512])
            except Exception as exc:  # a rank must always end with a result, or it holds its GPUs on paper
                log.exception("job %s rank %s: staging failed", launch.job_id, launch.rank)
                result = RankResult("error", None, f"staging its models and datasets failed: {exc}"[:512])
            else:
                for item in staged:
                    on_output("stderr", describe_staged(item))
                launch = launch.model_copy(update={"env": {**launch.env, **job_variables(staged)}})
                if rank.cancel.is_set():  # cancelled while its data was being copied
                    result = RankResult("cancelled", None, "cancelled before it started")
        if result is None:
            result = await self.executor.run(launch, on_started, on_output, rank.cancel)
        self._flush(rank)
        rank.result = result
        log.info("job %s rank %s: %s (exit code %s)", launch.job_id, launch.rank, result.outcome, result.exit_code)
        self._report(rank)

    async def _report_cache(self, cache: ArtifactCache) -> None:
        async with self._staging:
            report = await asyncio.to_thread(cache.report)
        self._send_control(report.model_dump_json())

    async def _stage(self, launch: JobStart) -> list[Staged]:
        """The rank's artifacts, present and checked in the node cache; the head hears what it holds."""
        cache = self.cache
        if cache is None:
            raise ArtifactError("this node has no artifact cache, so it cannot stage the job's models and datasets")
        in_use = {a.sha256 for r in self.ranks.values() if r.result is None for a in r.launch.artifacts}
        async with self._staging:
            try:
                return [await asyncio.to_thread(cache.stage, ref, in_use) for ref in launch.artifacts]
            finally:
                self._send_control((await asyncio.to_thread(cache.report)).model_dump_json())

    def _flush_all(self) -> None:
        self._flush_handle = None
        for rank in self.ranks.values():
            self._flush(rank)

    def _flush(self, rank: _Rank) -> None:
        for stream in ("stdout", "stderr"):
            text = rank.pending[stream]
            rank.pending[stream] = ""
            for part in split_output(text):
                chunk = JobOutput(
                    job_id=rank.launch.job_id,
                    run=rank.launch.run,
                    rank=rank.launch.rank,
                    stream=stream,
                    offset=rank.offsets[stream],
                    data=part,
                )
                rank.offsets[stream] += len(part)
                self._output.append(chunk.model_dump_json())
                self._ready.set()

    def _report(self, rank: _Rank) -> None:
        if rank.result is not None:
            self._send_control(_update(rank.launch, "exited", rank.result), after_output=True)
        elif rank.started:
            self._send_control(_update(rank.launch, "running"))

    def _send_control(self, text: str, *, after_output: bool = False) -> None:
        self._control.append((text, after_output))
        self._ready.set()

    async def send_forever(self, send: SendText) -> None:
        """Send queued reports, control first, for as long as the channel lasts (a failed send keeps the
        message for the next channel)."""
        while True:
            self._ready.clear()
            while self._control or self._output:
                # Control first, but a rank's end after the output queued before it: the head takes a job
                # whose ranks all ended as done, and its output must be there by then.
                waits = bool(self._control) and self._control[0][1] and bool(self._output)
                queue: deque[tuple[str, bool]] | deque[str] = (
                    self._control if self._control and not waits else self._output
                )
                head = queue[0]
                await send(head if isinstance(head, str) else head[0])
                with contextlib.suppress(IndexError):  # cleared by a crash while sending
                    queue.popleft()
            await self._ready.wait()

    async def close(self) -> None:
        """The agent is stopping: the ranks' processes are killed (each executor's own cleanup)."""
        tasks = [r.task for r in self.ranks.values() if r.task is not None and not r.task.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _json_bytes(text: str) -> int:
    """The bytes `text` takes inside a JSON string (escaped as pydantic writes it, UTF-8), quotes left out."""
    return len(json.dumps(text, ensure_ascii=False).encode("utf-8", "surrogatepass")) - 2


def split_output(
    text: str, max_chars: int = MAX_OUTPUT_CHUNK, max_bytes: int = MAX_OUTPUT_MESSAGE_BYTES - _ENVELOPE_BYTES
) -> Iterator[str]:
    """`text` in contiguous parts of at most `max_chars` characters and `max_bytes` bytes as a JSON
    string. Each character escapes on its own, so a part's size only grows with its length: the longest
    part that fits is found by halving (at most a few passes over 16 Ki characters, and none when the
    first guess fits, as it does for plain text)."""
    start = 0
    while start < len(text):
        end = min(len(text), start + max_chars)
        if _json_bytes(text[start:end]) > max_bytes:
            low, high = start + 1, end - 1  # one character always fits (6 bytes at most)
            while low < high:
                middle = (low + high + 1) // 2
                if _json_bytes(text[start:middle]) <= max_bytes:
                    low = middle
                else:
                    high = middle - 1
            end = low
        yield text[start:end]
        start = end


def _update(ref: RankRef, state: str, result: RankResult | None = None) -> str:
    return JobUpdate(
        job_id=ref.job_id,
        run=ref.run,
        rank=ref.rank,
        state=state,
        outcome=result.outcome if result else None,
        exit_code=result.exit_code if result else None,
        message=(result.message if result else "")[:512],
    ).model_dump_json()
