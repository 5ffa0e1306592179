"""A rank's output: each stream kept whole in a spool file on the node and handed on as it comes, decoded
as UTF-8 (errors replaced) in chunks of at most MAX_OUTPUT_CHUNK characters; and the subprocess protocol
that reads the pipes and sees the main process exit.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from gpufleet.agent.jobs.ports import OnOutput
from gpufleet.protocol.jobs import MAX_OUTPUT_CHUNK, Stream

log = logging.getLogger(__name__)


class OutputStream:
    """One stream: kept whole in a spool file, decoded incrementally, handed on in bounded chunks."""

    def __init__(self, stream: Stream, spool: BinaryIO, on_output: OnOutput) -> None:
        self.stream = stream
        self.spool: BinaryIO | None = spool
        self.on_output = on_output
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.closed = asyncio.Event()

    def feed(self, data: bytes, final: bool = False) -> None:
        if self.spool is not None:
            try:
                self.spool.write(data)
            except OSError as exc:  # a full disk must not stop the job nor its streamed output
                log.warning("job output spool %s: %s; no longer kept on the node", self.spool.name, exc)
                self.spool = None
        text = self.decoder.decode(data, final)
        for start in range(0, len(text), MAX_OUTPUT_CHUNK):
            try:
                self.on_output(self.stream, text[start : start + MAX_OUTPUT_CHUNK])
            except Exception:  # the reader must go on draining the pipe, whatever the consumer does
                log.exception("job output consumer failed")


class RankProtocol(asyncio.SubprocessProtocol):
    """Output as it arrives, and the main process's exit as soon as it happens: Process.wait() would
    also wait for the pipes to close, which a leftover background process can delay forever."""

    def __init__(self, outputs: dict[int, OutputStream]) -> None:
        self.outputs = outputs
        self.exited = asyncio.Event()

    def pipe_data_received(self, fd: int, data: bytes | str) -> None:
        self.outputs[fd].feed(data.encode() if isinstance(data, str) else data)

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        if fd in self.outputs:
            self.outputs[fd].feed(b"", final=True)
            self.outputs[fd].closed.set()

    def process_exited(self) -> None:
        self.exited.set()


@contextlib.contextmanager
def spool_file(path: Path) -> Iterator[BinaryIO]:
    """A spool file only root reads, emptied first: a rank run again on this node starts a new file."""
    with open(path, "wb", buffering=0, opener=lambda name, flags: os.open(name, flags, 0o600)) as file:
        yield file
