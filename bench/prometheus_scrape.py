"""What one Prometheus scrape of the head's /metrics costs for a fleet of N nodes.

In one process, on SQLite in a fresh temp dir: N nodes with 8 GPUs each in the database, and one
sample per node (8 GPUs x 33 metrics, the host) in the head's tracker, as the channels leave it.
Times `FleetCollector.collect` (one read of the database, the families), `render` (the text) and the
gzip the route applies, over `--rounds` scrapes, and prints percentiles and sizes.

    .venv/bin/python bench/prometheus_scrape.py --nodes 1000 --rounds 10

Exit status 0 when the median scrape fits `--budget` seconds (default 5: the default scrape interval).
"""

from __future__ import annotations

import argparse
import gzip
import platform
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from gpufleet.core.db import make_engine, make_session_factory, transaction
from gpufleet.inventory.models import Gpu, Node
from gpufleet.inventory.states import NodeState
from gpufleet.migrations import upgrade
from gpufleet.monitoring.prometheus import FleetCollector
from gpufleet.monitoring.tracker import HealthTracker
from gpufleet.prometheus.exposition import render
from gpufleet.protocol.metrics import GPU_METRICS, HOST_METRICS, EntityValues, Sample

GPUS = 8


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--budget", type=float, default=5.0, help="seconds a median scrape may take")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        engine = make_engine(f"sqlite:///{Path(tmp) / 'bench.db'}")
        upgrade(engine)
        sessions = make_session_factory(engine)
        now = datetime.now(UTC)
        tracker = HealthTracker()
        with transaction(sessions) as session:
            for i in range(args.nodes):
                node = Node(name=f"gpu{i:04d}", state=NodeState.UP, state_since=now, created_at=now, health="healthy")
                node.gpus = [
                    Gpu(
                        index=g,
                        uuid=f"GPU-{i:04d}-{g}",
                        model="NVIDIA H200",
                        pci_bus_id=f"00000000:{g:02X}:00.0",
                        memory_total_mib=143771,
                        driver_version="580.95.05",
                    )
                    for g in range(GPUS)
                ]
                session.add(node)
        with transaction(sessions, readonly=True) as session:
            ids = [n.id for n in session.query(Node)]
        entities = [EntityValues(entity=f"gpu:{g}", values=dict.fromkeys(GPU_METRICS, 42.0)) for g in range(GPUS)]
        entities.append(EntityValues(entity="host", values=dict.fromkeys(HOST_METRICS, 1.5)))
        for node_id in ids:
            tracker.add_samples(node_id, [Sample(ts=time.time(), entities=entities)], time.time())

        collector = FleetCollector(sessions, tracker)
        collect_s, render_s, gzip_s, total_s = [], [], [], []
        size = zipped = 0
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            families = list(collector.collect())
            t1 = time.perf_counter()
            body = render(families)
            t2 = time.perf_counter()
            packed = gzip.compress(body, compresslevel=1)
            t3 = time.perf_counter()
            collect_s.append(t1 - t0)
            render_s.append(t2 - t1)
            gzip_s.append(t3 - t2)
            total_s.append(t3 - t0)
            size, zipped = len(body), len(packed)
        engine.dispose()

    samples = sum(1 for line in body.splitlines() if not line.startswith(b"#"))
    print(f"machine: {platform.processor() or platform.machine()}, Python {platform.python_version()}")
    print(
        f"{args.nodes} nodes x {GPUS} GPUs: {samples} samples, {size / 1e6:.1f} MB text, {zipped / 1e6:.2f} MB gzipped"
    )
    for name, values in (("collect", collect_s), ("render", render_s), ("gzip", gzip_s), ("scrape", total_s)):
        print(f"{name:8s} p50 {statistics.median(values):.3f} s  max {max(values):.3f} s")
    return 0 if statistics.median(total_s) <= args.budget else 1


if __name__ == "__main__":
    raise SystemExit(main())
