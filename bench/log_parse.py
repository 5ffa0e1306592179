"""How many log lines a second does the classifier get through, on one core?

Builds a corpus from the real logs in tests/fixtures/kernel-logs, repeated to `--lines` lines:

* ordinary: the noise logs (a 2005 HPC cluster's syslog, /dev/kmsg records, the Fabric Manager
  log) - what a kernel log mostly is;
* mixed: every fixture, faults included (about 4 % of its lines are events).

and times `classify_text` (a whole export, as `gpufleet logs classify` reads it) and
`LogClassifier.feed` (line by line, as the agent follows its kernel log) over each, in this one
process (one core). Reports lines per second, the best of `--repeat` runs.

    .venv/bin/python bench/log_parse.py --lines 1000000 --json bench/results/log-parse.json

Goal (issue 8): >= 200,000 ordinary lines a second on one core. Exit status 0 when met, 1 when not.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

from gpufleet.logs.classify import LogClassifier, classify_text

LOGS = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "kernel-logs"
NOISE = ("Thunderbird_2k.log", "kmsg.1.log", "fabricmanager.log")
GOAL = 200_000


def corpus(names: list[str], lines: int) -> list[str]:
    base = [line for name in names for line in (LOGS / name).read_text(errors="replace").splitlines()]
    return (base * (lines // len(base) + 1))[:lines]


def best_of(repeat: int, run: object) -> tuple[float, int]:
    """(best seconds, events found) over `repeat` runs of `run()`."""
    best, found = float("inf"), 0
    for _ in range(repeat):
        started = time.perf_counter()
        found = run()  # type: ignore[operator]
        best = min(best, time.perf_counter() - started)
    return best, found


def measure(lines: list[str], repeat: int) -> dict[str, float | int]:
    text = "\n".join(lines) + "\n"
    whole_s, events = best_of(repeat, lambda: len(classify_text(text, year=2025)))
    stream_s, streamed = best_of(repeat, lambda: sum(1 for _ in LogClassifier(year=2025).feed(lines)))
    assert streamed == events, (streamed, events)
    return {
        "lines": len(lines),
        "megabytes": round(len(text.encode()) / 1e6, 1),
        "events": events,
        "whole_text_lines_per_s": round(len(lines) / whole_s),
        "line_by_line_lines_per_s": round(len(lines) / stream_s),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    everything = sorted(p.name for p in LOGS.iterdir())
    result = {
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
        "ordinary": measure(corpus(list(NOISE), args.lines), args.repeat),
        "mixed": measure(corpus(everything, args.lines), args.repeat),
        "goal_ordinary_lines_per_s": GOAL,
    }
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    ordinary = result["ordinary"]
    assert isinstance(ordinary, dict)
    return 0 if min(ordinary["whole_text_lines_per_s"], ordinary["line_by_line_lines_per_s"]) >= GOAL else 1


if __name__ == "__main__":
    sys.exit(main())
