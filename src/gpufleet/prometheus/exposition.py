"""Nodes' latest samples as Prometheus metric families, and those families as exposition text.

The head (`monitoring.prometheus`) and the agent's local endpoint (`agent.exposition`) both build
`NodeMetrics` and hand them to `Families`; `render` writes the text format (version 0.0.4).

Why not prometheus-client's own `generate_latest`: it appends `_total` to the name of every counter,
as OpenMetrics wants, but dcgm-exporter's counters (`DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`,
`DCGM_FI_DEV_PCIE_REPLAY_COUNTER`, ...) have no such suffix, and dashboards query them by their exact
names. The families are prometheus-client's `Metric` objects, so anything that takes a
prometheus-client collector takes ours; only the writing is done here, the way dcgm-exporter writes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString

from gpufleet.prometheus.names import (
    DISK_SERIES,
    GPU_SERIES,
    HOST_SERIES,
    IB_SERIES,
    JOB_LABEL,
    NIC_SERIES,
    NODE_LABEL,
    Series,
)
from gpufleet.prometheus.storage import fs_samples
from gpufleet.protocol.metrics import MountInfo

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True)
class GpuFacts:
    """What labels a GPU's series: from the node's inventory (empty where not reported yet)."""

    uuid: str = ""
    model: str = ""
    pci_bus_id: str = ""
    driver_version: str = ""
    job: str = ""  # the job holding the GPU, labelled `hpc_job` as dcgm-exporter's HPC job mapping does


@dataclass(frozen=True)
class NodeMetrics:
    """One node's latest sample (entity -> metric -> value) and the facts its labels need."""

    node: str
    hostname: str
    entities: Mapping[str, Mapping[str, float]]
    gpus: Mapping[int, GpuFacts] = field(default_factory=dict)
    mounts: Mapping[str, MountInfo] = field(default_factory=dict)  # shared file systems by mount point


class Families:
    """Metric families by name, in the order first added. Metrics without a mapping are left out:
    a newer agent's new metric is not exposed under a name nobody chose."""

    def __init__(self) -> None:
        self._by_name: dict[str, Metric] = {}

    def add(self, series: Series, labels: dict[str, str], value: float) -> None:
        metric = self._by_name.get(series.name)
        if metric is None:
            metric = self._by_name[series.name] = Metric(series.name, series.help, series.type)
        metric.add_sample(series.name, labels, value * series.scale)

    def declare(self, series: Series) -> None:
        """Have the family appear (HELP and TYPE) even with no samples, e.g. no alert firing."""
        if series.name not in self._by_name:
            self._by_name[series.name] = Metric(series.name, series.help, series.type)

    def add_node(self, node: NodeMetrics) -> None:
        """Every mapped metric of every entity of the node's sample."""
        for entity, values in node.entities.items():
            kind, _, rest = entity.partition(":")
            if kind == "fs":  # node_exporter's names, labels from the mount's facts (prometheus.storage)
                for fs_series, fs_labels, fs_value in fs_samples(node.node, rest, node.mounts.get(rest), values):
                    self.add(fs_series, fs_labels, fs_value)
                continue
            mapping, labels = _entity_labels(node, kind, rest)
            if mapping is None:
                continue
            for metric, value in values.items():
                series = mapping.get(metric)
                if series is not None:
                    self.add(series, labels, value)

    def collect(self) -> list[Metric]:
        return list(self._by_name.values())


def gpu_labels(node: NodeMetrics, index: int) -> dict[str, str]:
    """dcgm-exporter's labels for one GPU (see `names.GPU_LABELS`)."""
    facts = node.gpus.get(index, GpuFacts())
    labels = {
        "gpu": str(index),
        "UUID": facts.uuid,
        "pci_bus_id": facts.pci_bus_id,
        "device": f"nvidia{index}",
        "modelName": facts.model,
        "Hostname": node.hostname,
        "DCGM_FI_DRIVER_VERSION": facts.driver_version,
        NODE_LABEL: node.node,
    }
    if facts.job:
        labels[JOB_LABEL] = facts.job
    return labels


def _gpu_entity_labels(node: NodeMetrics, kind: str, rest: str) -> dict[str, str] | None:
    """A GPU's labels, or a MIG device's (its GPU's and dcgm-exporter's GPU_I_ID); None for another entity."""
    if kind == "gpu" and rest.isdigit():
        return gpu_labels(node, int(rest))
    gpu, _, instance = rest.partition("/")
    if kind == "mig" and gpu.isdigit() and instance.isdigit():
        return gpu_labels(node, int(gpu)) | {"GPU_I_ID": instance}
    return None


def _entity_labels(node: NodeMetrics, kind: str, rest: str) -> tuple[dict[str, Series] | None, dict[str, str]]:
    if (gpu := _gpu_entity_labels(node, kind, rest)) is not None:
        return GPU_SERIES, gpu
    if kind == "host":
        return HOST_SERIES, {NODE_LABEL: node.node}
    if kind == "disk":
        return DISK_SERIES, {NODE_LABEL: node.node, "mountpoint": rest}
    if kind == "nic":
        return NIC_SERIES, {NODE_LABEL: node.node, "device": rest}
    if kind == "ib":
        device, _, port = rest.rpartition("/")
        return IB_SERIES, {NODE_LABEL: node.node, "device": device or rest, "port": port if device else ""}
    return None, {}


def _number(value: float) -> str:
    """A sample value as Go (and so Prometheus and dcgm-exporter) writes it."""
    text: str = floatToGoString(value)  # type: ignore[no-untyped-call]
    return text


def _label_value(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def render(metrics: Iterable[Metric]) -> bytes:
    """The text exposition format, names exactly as the families give them (see the module doc)."""
    out: list[str] = []
    # `Families.add_node` gives all of an entity's samples one labels dict: format it once, not once
    # per metric (a thousand 8-GPU nodes are 270,000 samples; this halves the time to render them).
    # Keyed by id(): every dict stays alive, held by its samples, until this returns.
    selectors: dict[int, str] = {}
    for metric in metrics:
        kind = "untyped" if metric.type == "unknown" else metric.type
        out.append(f"# HELP {metric.name} {_help(metric.documentation)}\n# TYPE {metric.name} {kind}\n")
        for sample in metric.samples:
            selector = selectors.get(id(sample.labels))
            if selector is None:
                labels = ",".join(f'{k}="{_label_value(v)}"' for k, v in sample.labels.items())
                selector = selectors[id(sample.labels)] = f"{{{labels}}}" if labels else ""
            out.append(f"{sample.name}{selector} {_number(sample.value)}\n")
    return "".join(out).encode()
