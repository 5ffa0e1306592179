"""The agent's optional local `/metrics`: its latest sample under dcgm-exporter's names.

For a Prometheus that scrapes nodes directly, or a dcgm-exporter being replaced: set
`agent_metrics_listen` (e.g. `127.0.0.1:9400`). It serves the latest sample the agent took for the
head, so it costs no extra reading of the GPUs. Like node-exporter and dcgm-exporter it has no authentication:
listen on loopback, or on an address only the monitoring network reaches.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from gpufleet.agent.metrics.ports import SampleSource
from gpufleet.core.errors import ConfigError
from gpufleet.prometheus.exposition import CONTENT_TYPE, Families, GpuFacts, NodeMetrics, render
from gpufleet.protocol.inventory import NodeInventory
from gpufleet.protocol.metrics import NodeEvent, Sample

log = logging.getLogger(__name__)
INVENTORY_TTL_S = 300.0  # GPU labels change only when a GPU is replaced; reading them costs NVML calls


class KeepLatest:
    """A SampleSource that passes every round through and remembers the latest sample."""

    def __init__(self, source: SampleSource) -> None:
        self.source = source
        self._latest: Sample | None = None
        self._lock = threading.Lock()

    def collect(self) -> tuple[Sample, list[NodeEvent]]:
        sample, events = self.source.collect()
        with self._lock:
            self._latest = sample
        return sample, events

    def latest(self) -> Sample | None:
        with self._lock:
            return self._latest


class AgentMetrics:
    """Renders the latest sample with the node's GPU facts (UUID, model, bus id, driver) as labels."""

    def __init__(
        self,
        node: str,
        latest: KeepLatest,
        read_inventory: Callable[[], NodeInventory],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.node = node
        self.latest = latest
        self.read_inventory = read_inventory
        self.clock = clock
        self._inventory: tuple[float, str, dict[int, GpuFacts]] | None = None
        self._lock = threading.Lock()

    def _facts(self) -> tuple[str, dict[int, GpuFacts]]:
        with self._lock:
            now = self.clock()
            if self._inventory is None or now - self._inventory[0] > INVENTORY_TTL_S:
                try:
                    inventory = self.read_inventory()
                except Exception as exc:  # labels are a nicety: without them, still serve the values
                    log.warning("local /metrics: cannot read the inventory for GPU labels: %s", exc)
                    return self.node, {}
                gpus = {
                    g.index: GpuFacts(g.uuid, g.model, g.pci_bus_id, g.driver_version or "") for g in inventory.gpus
                }
                self._inventory = (now, inventory.hostname, gpus)
            return self._inventory[1], self._inventory[2]

    def render(self) -> bytes:
        """The exposition text; empty before the first sample."""
        sample = self.latest.latest()
        if sample is None:
            return b""
        hostname, gpus = self._facts()
        if sample.gpu_jobs:  # Slurm's jobs as `hpc_job`, as dcgm-exporter's HPC job mapping labels them
            gpus = dict(gpus)
            for mapped in reversed(sample.gpu_jobs):  # a GPU Slurm shares: the first job listed
                gpus[mapped.gpu] = replace(gpus.get(mapped.gpu, GpuFacts()), job=mapped.job)
        families = Families()
        entities = {e.entity: e.values for e in sample.entities}
        mounts = {m.mountpoint: m for m in sample.mounts}
        families.add_node(NodeMetrics(self.node, hostname, entities, gpus, mounts))
        return render(families.collect())


def serve(metrics: AgentMetrics, listen: str) -> ThreadingHTTPServer:
    """Serve `GET /metrics` on `listen` (HOST:PORT) from a daemon thread; `shutdown()` stops it.

    Raises ConfigError when the address cannot be bound (in use, not local).
    """

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?", 1)[0] != "/metrics":
                self.send_error(404)
                return
            try:
                body = metrics.render()
            except Exception:  # a bug here must not take the agent down, only this scrape
                log.exception("local /metrics failed")
                self.send_error(500)
                return
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # the stdlib's parameter name
            log.debug("local /metrics: " + format, *args)

    host, _, port = listen.rpartition(":")
    host = host.strip("[]")

    class Server(ThreadingHTTPServer):
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        daemon_threads = True

    try:
        server = Server((host, int(port)), Handler)
    except OSError as exc:
        raise ConfigError(f"agent_metrics_listen {listen}: cannot listen there: {exc.strerror or exc}") from None
    threading.Thread(target=server.serve_forever, name="agent-metrics", daemon=True).start()
    log.info("serving the latest sample at http://%s/metrics", listen)
    return server
