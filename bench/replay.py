"""How do FIFO and gpufleet's scheduler compare on real job traces? (`gpufleet sim replay`, side by side.)

Replays, in simulated time (no sleeping), the two traces of the shared fixture catalogue through the
built-in scheduler (`gpufleet.jobs.replay`), each under three policies: `fifo` (strict FIFO, no
backfill), `gpufleet` (priorities, fair share, backfill, pack; time limits = the exact runtime) and
`gpufleet` with time limits of twice the runtime (users' estimates are rarely exact).

Scenarios:

- openb (Alibaba GPU trace 2023, `openb_pod_list_default.csv`) on its own 1,213 nodes
  (`openb_node_list_gpu_node.csv`, 6,212 GPUs);
- the same pods on 8 nodes x 8 GPUs: the pod list is a sample of the cluster's pods, so on its own
  nodes nothing ever waits; 64 GPUs is under the trace's peak demand (71 GPUs, shares rounded up);
- Philly runtimes (`philly_runtime.csv`, all 83,154) on 64 nodes x 8 GPUs, with seeded Poisson
  arrivals offering 80 % and then 95 % of the GPU-time, and GPU counts drawn from 1/2/4/8 at
  70/10/10/10 % (assumed: the list has runtimes only).

    .venv/bin/python bench/replay.py [TRACES_DIR] [--json bench/results/replay.json]

TRACES_DIR defaults to ../shared/fixtures/traces beside the repository. `--check-prune` also replays
openb on its own nodes without the node pruning (slow: every pass sees all 1,213 nodes) and reports
whether any figure moved.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufleet.jobs.replay import ReplayOptions, ReplayResult, replay
from gpufleet.jobs.traces import Trace, TraceNode, homogeneous, read_openb_nodes, read_trace

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DIR = ROOT.parent / "shared" / "fixtures" / "traces"
VARIANTS: list[tuple[str, str, float]] = [  # (column, policy, time-limit factor)
    ("fifo", "fifo", 1.0),
    ("gpufleet", "gpufleet", 1.0),
    ("gpufleet, limits 2x", "gpufleet", 2.0),
]


@dataclass
class Scenario:
    name: str
    trace: Trace
    nodes: list[TraceNode]
    cluster: str


def scenarios(folder: Path, seed: int) -> list[Scenario]:
    pods = folder / "openb_pod_list_default.csv"
    node_list = folder / "openb_node_list_gpu_node.csv"
    philly = folder / "philly_runtime.csv"
    for path in (pods, node_list, philly):
        if not path.is_file():
            sys.exit(f"bench/replay.py: {path} not found; pass the folder holding the traces")
    openb_nodes = read_openb_nodes(node_list)
    openb = read_trace(pods, cluster_gpus=sum(n.gpus for n in openb_nodes))
    small = homogeneous(8, 8)
    philly_nodes = homogeneous(64, 8)
    out = [
        Scenario(
            "openb, its own nodes",
            openb,
            openb_nodes,
            f"{len(openb_nodes):,} nodes, {sum(n.gpus for n in openb_nodes):,} GPUs",
        ),
        Scenario("openb, 8 x 8 GPUs", openb, small, "8 nodes x 8 GPUs"),
    ]
    for load in (0.8, 0.95):
        trace = read_trace(philly, cluster_gpus=512, load=load, seed=seed)
        out.append(Scenario(f"Philly, load {load:.0%}", trace, philly_nodes, "64 nodes x 8 GPUs"))
    return out


def run(scenario: Scenario, policy: str, factor: float, prune: bool = True) -> ReplayResult:
    options = ReplayOptions(time_limit_factor=factor, prune=prune)
    return replay(scenario.trace.jobs, scenario.nodes, policy, options)  # type: ignore[arg-type]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("traces", type=Path, nargs="?", default=DEFAULT_DIR, help="folder with the trace files")
    ap.add_argument("--seed", type=int, default=1, help="Philly's synthetic arrivals and GPU counts")
    ap.add_argument("--check-prune", action="store_true", help="also replay openb on its nodes without pruning")
    ap.add_argument("--json", type=Path, help="write every figure here")
    args = ap.parse_args()

    began = time.perf_counter()
    result: dict[str, Any] = {
        "benchmark": "replay",
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "seed": args.seed,
        "scenarios": [],
    }
    for sc in scenarios(args.traces, args.seed):
        print(f"\n== {sc.name}: {sc.cluster}; {len(sc.trace.jobs):,} jobs from {Path(sc.trace.source).name}")
        for note in sc.trace.notes:
            print(f"   - {note}")
        results = [(label, run(sc, policy, factor)) for label, policy, factor in VARIANTS]
        figures = [r.figures() for _, r in results]
        width = max(len(label) for label, _ in figures[0])
        print(f"   {'':{width}}" + "".join(f"{label:>22}" for label, _ in results))
        for i, (label, _) in enumerate(figures[0]):
            print(f"   {label:{width}}" + "".join(f"{col[i][1]:>22}" for col in figures))
        entry: dict[str, Any] = {
            "scenario": sc.name,
            "cluster": sc.cluster,
            "notes": list(sc.trace.notes),
            "results": {label: r.as_dict() for label, r in results},
        }
        if args.check_prune and sc.name.startswith("openb, its own"):
            for label, policy, factor in VARIANTS[:2]:
                full = run(sc, policy, factor, prune=False)
                pruned = dict(results)[label]
                moved = {
                    k: (v, full.as_dict()[k])
                    for k, v in pruned.as_dict().items()
                    if k not in ("wall_s", "schedule_s", "passes") and v != full.as_dict()[k]
                }
                walls = f"{full.wall_s:.1f}s wall (pruned {pruned.wall_s:.1f}s)"
                print(f"   unpruned {label}: {walls}; figures that moved: {moved or 'none'}")
                entry.setdefault("unpruned", {})[label] = {"wall_s": full.wall_s, "moved": moved}
        result["scenarios"].append(entry)
    result["total_s"] = time.perf_counter() - began
    print(f"\ntotal {result['total_s']:.0f}s on {os.cpu_count()} CPU(s), Python {platform.python_version()}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
