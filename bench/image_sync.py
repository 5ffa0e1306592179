"""How long does it take to bring 16 nodes in line with a 1 GB image after a 10 MB change, with the
sync limit (nodes written at once) at 4 and at 16?

What it builds, in `--workdir` (removed at the end):

* an image of `--image-mb` MB (1,000) in `--files` files (20,000) of mixed sizes, as an OS image
  has them: most a few KB, some hundreds of KB, a few tens of MB (log-normal sizes scaled to the
  total), in 400 directories, random content (nothing compresses or deduplicates);
* `--targets` directory trees (16) standing in for nodes: gpufleet nodes in a category whose
  software_image is the image and whose sync_target is `WORKDIR/targets/{node}`, brought in line
  once (timed too, but not the question);
* then, before each timed sync, a change of about `--change-mb` MB (10): a third of it files
  rewritten, a third new files, a third files deleted.

Each sync runs exactly as the head runs it: `provisioning.sync.plan` from the nodes' settings, a
task in the database (SQLite), `sync.run_sync` on the real `TaskRunner`, whose fan-out runs one
rsync per node, at most `limit` at once. The figure is the task's wall time from start to the last
node's result. A sync with nothing to change is timed as well: rsync still walks and compares the
20,000 files of every node, the floor under any change. Warm page cache: the image and the targets
(17 GB) mostly fit in this machine's memory, as the image does on a real head; the nodes' side of a
real sync is on the nodes' disks and behind the network, which this does not measure.

    .venv/bin/python bench/image_sync.py --json bench/results/image-sync.json

Checks free disk space first (image + targets + 10 %), and exits 2 without enough.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from gpufleet.core.clock import SystemClock, to_datetime
from gpufleet.core.db import make_engine, make_session_factory, transaction
from gpufleet.inventory import categories
from gpufleet.inventory import service as inventory
from gpufleet.inventory.schemas import NodeSettings
from gpufleet.migrations import upgrade
from gpufleet.provisioning import images, sync
from gpufleet.provisioning.image_models import Image
from gpufleet.provisioning.images import ImageConfig
from gpufleet.provisioning.runner import ProcessRunner, Step
from gpufleet.provisioning.sync import SyncConfig
from gpufleet.tasks import service as tasks
from gpufleet.tasks.runner import TaskContext, TaskRunner
from gpufleet.tasks.schemas import TaskOut

NAME = "bench"
ACTOR = "bench"


def sizes(count: int, total: int, rng: random.Random) -> list[int]:
    """Log-normal file sizes (median ~6 KB, a long tail to tens of MB) scaled to `total` bytes."""
    raw = [rng.lognormvariate(8.7, 2.0) for _ in range(count)]
    scale = total / sum(raw)
    return [max(1, int(r * scale)) for r in raw]


def write(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as fh:
        left = size
        while left:
            chunk = min(left, 4 << 20)
            fh.write(os.urandom(chunk))
            left -= chunk


def build_image(root: Path, files: int, total: int, rng: random.Random) -> list[Path]:
    paths = []
    for i, size in enumerate(sizes(files, total, rng)):
        path = root / f"usr/share/d{i % 400:03d}/f{i:05d}.bin"
        write(path, size)
        paths.append(path)
    return paths


def change(paths: list[Path], budget: int, rng: random.Random, counter: list[int]) -> dict[str, int]:
    """About `budget` bytes of change: a third rewritten files, a third new, a third deleted."""
    third = budget // 3
    out = {"rewritten": 0, "new": 0, "deleted": 0, "bytes": 0}
    done = 0
    while done < third:
        path = rng.choice(paths)
        size = path.stat().st_size
        if size > 1 << 20:
            continue  # rewritten whole, so small and medium files only
        write(path, size)
        done += size
        out["rewritten"] += 1
    out["bytes"] += done
    done = 0
    while done < third:
        counter[0] += 1
        size = rng.randint(4 << 10, 512 << 10)
        path = paths[0].parents[1] / f"new{counter[0] % 50:02d}" / f"n{counter[0]:06d}.bin"
        write(path, size)
        paths.append(path)
        done += size
        out["new"] += 1
    out["bytes"] += done
    done = 0
    while done < third and len(paths) > 1:
        path = paths.pop(rng.randrange(len(paths)))
        if path.stat().st_size > 2 << 20:
            paths.append(path)  # big files stay: a delete of one would be the whole budget
            continue
        done += path.stat().st_size
        path.unlink()
        out["deleted"] += 1
    out["bytes"] += done
    return out


def run_sync(
    sessions: sessionmaker[Session],
    clock: SystemClock,
    config: ImageConfig,
    plans: list[sync.NodePlan],
    limit: int,
) -> tuple[float, TaskOut]:
    with transaction(sessions) as s:
        task_id = tasks.create(
            s, clock, kind="image.sync", targets=[p.node for p in plans], params={"limit": limit}, created_by=ACTOR
        ).id
    runner = TaskRunner(sessions, clock)

    def work(ctx: TaskContext) -> str:
        return sync.run_sync(
            ctx, sessions, clock, ProcessRunner(), config, SyncConfig(limit=limit),
            plans=plans, dry_run=False, limit=limit, actor=ACTOR,
        )  # fmt: skip

    started = time.monotonic()
    runner.start(task_id, work)
    runner.wait(task_id, 3600)
    seconds = time.monotonic() - started
    runner.close()
    with transaction(sessions, readonly=True) as s:
        task = TaskOut.of(tasks.get(s, task_id))
    if task.state != "succeeded":
        raise SystemExit(f"sync failed: {task.summary}: {[(t.target, t.detail) for t in task.targets if t.detail]}")
    return seconds, task


def figures(seconds: float, task: TaskOut) -> dict[str, Any]:
    per_node = [(t.data or {}).get("seconds", 0.0) for t in task.targets]
    sent = [(t.data or {}).get("bytes_transferred", 0) for t in task.targets]
    return {
        "wall_s": round(seconds, 2),
        "node_p50_s": round(statistics.median(per_node), 2),
        "node_max_s": round(max(per_node), 2),
        "bytes_per_node": int(statistics.median(sent)),
        "files_per_node": int(statistics.median((t.data or {}).get("files_transferred", 0) for t in task.targets)),
        "deleted_per_node": int(statistics.median((t.data or {}).get("deleted", 0) for t in task.targets)),
    }


def in_line(image: Path, target: Path) -> bool:
    """Same paths and sizes (the contents were rsync's to get right; the tests check those)."""

    def listing(root: Path) -> set[tuple[str, int]]:
        return {(str(p.relative_to(root)), p.stat().st_size) for p in root.rglob("*") if p.is_file()}

    return listing(image) == listing(target)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--targets", type=int, default=16)
    parser.add_argument("--image-mb", type=int, default=1000)
    parser.add_argument("--files", type=int, default=20_000)
    parser.add_argument("--change-mb", type=float, default=10)
    parser.add_argument("--limits", default="4,16")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    limits = [int(x) for x in args.limits.split(",")]
    total = args.image_mb * 1_000_000
    args.workdir.mkdir(parents=True, exist_ok=True)
    need = int(total * (args.targets + 1) * 1.1)
    free = shutil.disk_usage(args.workdir).free
    if free < need:
        print(
            f"not enough disk in {args.workdir}: {free / 1e9:.1f} GB free, {need / 1e9:.1f} GB needed", file=sys.stderr
        )
        return 2
    work = Path(tempfile.mkdtemp(prefix="gpufleet-image-sync-", dir=args.workdir))
    rng = random.Random(args.seed)
    try:
        return _run(args, work, limits, total, rng)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run(args: argparse.Namespace, work: Path, limits: list[int], total: int, rng: random.Random) -> int:
    clock = SystemClock()
    engine = make_engine(f"sqlite:///{work / 'gpufleet.db'}")
    upgrade(engine)
    sessions = make_session_factory(engine)
    config = ImageConfig(images_dir=work / "images")
    root = config.path(NAME)
    t0 = time.monotonic()
    paths = build_image(root, args.files, total, rng)
    built_s = time.monotonic() - t0
    with transaction(sessions) as s:
        image = Image(name=NAME, path=str(root), source="bench", state="ready", created_at=to_datetime(clock.now()),
                      created_by=ACTOR, revision=0)  # fmt: skip
        s.add(image)
        s.flush()
        images.rescan(s, clock, image, ACTOR)
        categories.create_category(
            s, clock, "bench", settings={"software_image": NAME, "sync_target": f"{work}/targets/{{node}}"}
        )
        nodes = inventory.add_nodes(s, clock, [f"node[01-{args.targets:02d}]"], NodeSettings(category="bench"))
        plans = sync.plan(s, nodes, local_root=work / "targets")
    tree = images.tree_digest(root)
    print(f"image: {tree.files} entries, {tree.bytes / 1e6:.0f} MB, built in {built_s:.0f} s; {len(plans)} targets")

    first_s, first = run_sync(sessions, clock, config, plans, max(limits))
    print(f"first sync of {len(plans)} empty targets, limit {max(limits)}: {first_s:.1f} s")
    results: dict[str, Any] = {"first_sync": figures(first_s, first) | {"limit": max(limits)}, "runs": []}
    for limit in limits:
        seconds, task = run_sync(sessions, clock, config, plans, limit)
        results["runs"].append({"change": "none", "limit": limit} | figures(seconds, task))
        print(f"no change, limit {limit:>2}: {seconds:6.2f} s")
    counter = [0]
    for round_ in range(args.rounds):
        for limit in limits:
            changed = change(paths, int(args.change_mb * 1e6), rng, counter)
            seconds, task = run_sync(sessions, clock, config, plans, limit)
            row: dict[str, Any] = {"change": changed, "limit": limit, "round": round_ + 1} | figures(seconds, task)
            results["runs"].append(row)
            print(
                f"{changed['bytes'] / 1e6:.1f} MB change ({changed['rewritten']} rewritten, {changed['new']} new, "
                f"{changed['deleted']} deleted), limit {limit:>2}: {seconds:6.2f} s "
                f"(per node p50 {row['node_p50_s']} s, max {row['node_max_s']} s, {row['bytes_per_node'] / 1e6:.1f} MB)"
            )
    for plan in (plans[0], plans[-1]):
        if not in_line(root, work / "targets" / plan.node):
            print(f"{plan.node} is not in line with the image after the syncs", file=sys.stderr)
            return 1
    summary = {}
    for limit in limits:
        timed = [r["wall_s"] for r in results["runs"] if r["limit"] == limit and r["change"] != "none"]
        summary[f"limit_{limit}_median_s"] = statistics.median(timed)
        print(f"limit {limit:>2}: median {statistics.median(timed):.2f} s over {len(timed)} changes")
    machine = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "rsync": ProcessRunner().run(Step(("rsync", "--version"), 10)).stdout.splitlines()[0],
    }
    print(f"machine: {machine}")
    report = {
        "image": {"files": tree.files, "bytes": tree.bytes, "built_s": round(built_s, 1)},
        "targets": len(plans),
        "summary": summary,
        "machine": machine,
    } | results
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
