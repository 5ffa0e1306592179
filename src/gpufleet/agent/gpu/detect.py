"""Choosing a GPU backend: the first one that works wins, and no GPUs at all is a valid answer."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from gpufleet.agent.gpu.nvml import NvmlReader
from gpufleet.agent.gpu.ports import GpuReader, GpuReadError
from gpufleet.agent.gpu.smi import NvidiaSmiReader
from gpufleet.protocol.inventory import GpuInfo, GpuSource

logger = logging.getLogger(__name__)


def detect_gpus(
    readers: Sequence[GpuReader] | None = None,
) -> tuple[GpuSource, list[GpuInfo], list[str]]:
    """Read the GPUs with the first backend that works: NVML, then nvidia-smi, unless `readers` is given.

    Returns (source, gpus, reasons), reasons saying why each earlier backend failed. When none works
    the answer is ("none", [], reasons): a machine without GPUs or drivers is a node with zero GPUs,
    not an error. Raises nothing for a failing backend; a reader's own bug (anything that is not a
    GpuReadError) still propagates, since hiding it would report a GPU node as GPU-less.
    """
    owned = readers is None
    chosen: Sequence[GpuReader] = [NvmlReader(), NvidiaSmiReader()] if readers is None else readers
    reasons: list[str] = []
    try:
        for reader in chosen:
            try:
                gpus = reader.read()
            except GpuReadError as exc:
                reason = f"{reader.source}: {exc}"
                logger.info("GPU backend unavailable: %s", reason)
                reasons.append(reason)
                continue
            return reader.source, gpus, reasons
    finally:
        if owned:
            _close_all(chosen)
    logger.info("no GPU backend works; reporting no GPUs")
    return "none", [], reasons


def _close_all(readers: Sequence[GpuReader]) -> None:
    """Release what readers we created hold (NVML stays initialised until shut down)."""
    for reader in readers:
        close = getattr(reader, "close", None)
        if close is not None:
            close()
