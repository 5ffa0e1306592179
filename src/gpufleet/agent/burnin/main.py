"""`gpufleet-burnin KIND --seconds N [--option value ...]`: run one burn-in step and print its result.

The command line is what lifecycle.profiles.Step.argv() builds from a profile. Exit status: 0 when the
step measured (whatever the value: the head judges it) or was skipped, 1 when it failed outright (the
result line is printed all the same), 2 for bad usage (one line on stderr, no result).

Each kind's module is imported only when that kind runs, so a CPU step never loads torch.
"""

from __future__ import annotations

import importlib
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gpufleet.agent.burnin.common import PROGRAM, Run, Usage, emit, failed, parse_size
from gpufleet.protocol.burnin import KINDS

MAX_SECONDS = 24 * 3600


@dataclass(frozen=True)
class Option:
    parse: Callable[[str], Any]
    default: Any
    help: str


def _whole(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            number = int(text)
        except ValueError:
            raise ValueError(f"{text!r} is not a whole number") from None
        if not low <= number <= high:
            raise ValueError(f"{number} is not from {low} to {high}")
        return number

    return parse


def _choice(*allowed: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in allowed:
            raise ValueError(f"{text!r} is not one of {', '.join(allowed)}")
        return text

    return parse


def _size_or_auto(text: str) -> str:
    if text != "auto":
        parse_size(text)
    return text


def _text(text: str) -> str:
    if not text or "\x00" in text:
        raise ValueError("must not be empty")
    return text


_DTYPE = Option(_choice("bf16", "fp16", "fp32"), "bf16", "matrix element type")
_WORKERS = Option(_whole(0, 4096), 0, "stress-ng workers (0: one per CPU)")

# Each kind's options: name -> how to read it, its default, what it is for.
OPTIONS: dict[str, dict[str, Option]] = {
    "cpu-stress": {"workers": _WORKERS},
    "memory-stress": {
        "workers": _WORKERS,
        "vm-bytes": Option(_text, "50%", "memory to stress in all: P% of what the job may use, or a size"),
    },
    "disk": {
        "dir": Option(_text, "", "directory to write in (default $TMPDIR, else /var/tmp)"),
        "size": Option(parse_size, 256 << 20, "file size (like 256M, 4G)"),
        "bs": Option(_choice("4K", "64K", "128K", "1M", "4M"), "1M", "block size"),
        "ioengine": Option(_choice("psync", "libaio", "io_uring", "sync"), "psync", "fio I/O engine"),
        "iodepth": Option(_whole(1, 256), 1, "fio I/O depth (libaio, io_uring)"),
    },
    "allreduce": {
        "backend": Option(_choice("auto", "nccl", "gloo"), "auto", "NCCL with GPUs, gloo without (auto)"),
        "size": Option(_size_or_auto, "auto", "largest all-reduce size (auto: 256M on GPUs, 16M on CPU)"),
    },
    "network": {
        "port": Option(_whole(0, 65535), 0, "TCP port rank 0 listens on (0: MASTER_PORT + 1)"),
        "transport": Option(_choice("auto", "tcp", "ib"), "auto", "ib_write_bw where InfiniBand is (auto)"),
        "streams": Option(_whole(1, 32), 4, "parallel TCP connections"),
        "ib-dev": Option(_text, "", "InfiniBand device for ib_write_bw (default: the first with an active port)"),
    },
    "gemm": {
        "dtype": _DTYPE,
        "size": Option(_whole(256, 32768), 8192, "matrix side (n × n)"),
    },
    "gpu-memory": {"size": Option(parse_size, 1 << 30, "bytes copied per call (like 1G)")},
    "host-copy": {"size": Option(parse_size, 256 << 20, "bytes copied per call (like 256M)")},
    "gpu-peer": {"size": Option(parse_size, 256 << 20, "bytes copied per call (like 256M)")},
    "thermal": {
        "dtype": _DTYPE,
        "size": Option(_whole(256, 32768), 8192, "matrix side of the load (n × n)"),
        "interval": Option(_whole(1, 60), 1, "seconds between NVML readings"),
    },
    "dcgm": {"level": Option(_whole(1, 4), 1, "dcgmi diag -r LEVEL")},
}

# kind -> (module, function); imported when the kind runs.
HANDLERS: dict[str, tuple[str, str]] = {
    "cpu-stress": ("cpu", "cpu_stress"),
    "memory-stress": ("cpu", "memory_stress"),
    "disk": ("disk", "disk"),
    "allreduce": ("collective", "allreduce"),
    "network": ("network", "network"),
    "gemm": ("gpu", "gemm"),
    "gpu-memory": ("gpu", "gpu_memory"),
    "host-copy": ("gpu", "host_copy"),
    "gpu-peer": ("gpu", "gpu_peer"),
    "thermal": ("gpu", "thermal"),
    "dcgm": ("dcgm", "dcgm"),
}
UNITS = {
    "gemm": "TFLOPS",
    "gpu-memory": "GB/s",
    "host-copy": "GB/s",
    "gpu-peer": "GB/s",
    "dcgm": "fraction",
    "cpu-stress": "bogo-ops/s",
    "memory-stress": "bogo-ops/s",
    "disk": "MB/s",
    "thermal": "C",
    "allreduce": "GB/s",
    "network": "Gbit/s",
}


def usage() -> str:
    lines = [f"usage: {PROGRAM} KIND --seconds N [--option value ...]", "", "kinds and their options:"]
    for kind in KINDS:
        lines.append(f"  {kind} ({UNITS[kind]}, {KINDS[kind]} is better)")
        for name, option in OPTIONS[kind].items():
            lines.append(f"      --{name} (default {option.default!r}): {option.help}")
    return "\n".join(lines)


def parse_args(argv: Sequence[str]) -> Run:
    """The step from its command line. Raises Usage."""
    if not argv:
        raise Usage(f"a kind is needed: one of {', '.join(KINDS)}")
    kind, rest = argv[0], list(argv[1:])
    if kind not in KINDS:
        raise Usage(f"unknown kind {kind!r}: one of {', '.join(KINDS)}")
    specs = OPTIONS[kind]
    seconds: float = 30.0
    values: dict[str, Any] = {name: option.default for name, option in specs.items()}
    while rest:
        flag = rest.pop(0)
        name, eq, inline = flag.partition("=")
        if not name.startswith("--") or len(name) < 3:
            raise Usage(f"unexpected argument {flag!r}: options are --name value")
        name = name[2:]
        if name != "seconds" and name not in specs:
            known = ", ".join(f"--{n}" for n in ("seconds", *specs))
            raise Usage(f"{kind} has no option --{name}; it takes {known}")
        if eq:
            text = inline
        elif rest:
            text = rest.pop(0)
        else:
            raise Usage(f"--{name} needs a value")
        if name == "seconds":
            seconds = _seconds(text)
            continue
        try:
            values[name] = specs[name].parse(text)
        except ValueError as exc:
            raise Usage(f"--{name}: {exc}") from None
    return Run(kind, seconds, values)


def _seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        raise Usage(f"--seconds: {text!r} is not a number") from None
    if not 0 < seconds <= MAX_SECONDS:  # also refuses nan and inf
        raise Usage(f"--seconds must be above 0 and at most {MAX_SECONDS}")
    return seconds


def main(argv: Sequence[str] | None = None) -> int:
    """The console script. Returns the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    try:
        run = parse_args(args)
        module, function = HANDLERS[run.kind]
        handler = getattr(importlib.import_module(f"gpufleet.agent.burnin.{module}"), function)
        step = handler(run)
    except Usage as exc:
        print(f"{PROGRAM}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROGRAM}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        # A bug or an unforeseen failure (a CUDA error): the head still gets a result naming it, and the
        # traceback goes to the job's error output for whoever debugs it.
        traceback.print_exc()
        text = str(exc).strip().splitlines()
        step = failed(args[0], UNITS[args[0]], f"{type(exc).__name__}: {text[0] if text else ''}")
    return emit(step)
