"""Health checks: pure functions from what a node reported to findings. No I/O, no clock, no database.

Each check looks at a `NodeSnapshot` (the node's recent samples, its recent events, what it is
expected to have) and a `HealthPolicy` (thresholds), and returns findings. The verdict is the worst
finding: `failed` takes the node out of service, `degraded` only tells people.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from gpufleet.logs.catalog import REMOVING, Action, XidPolicy, xid_table
from gpufleet.protocol.metrics import CheckResult, NodeEvent

Severity = Literal["degraded", "failed"]
Values = dict[str, float]
Entities = dict[str, Values]  # entity name -> metric -> value, as in one protocol Sample

# Xids that take the GPU out of service (drain, reset or reboot) by gpufleet's Xid table
# (logs/xid_catalog.csv); a category's policy may change any code's action (`xid_actions`).
FATAL_XIDS: frozenset[int] = frozenset(code for code, info in xid_table().items() if info.action in REMOVING)
# NVML clocks-event reasons (nvmlClocksEventReason*): the thermal and power brakes that mean a GPU is
# being slowed by the hardware, not by its workload being light.
CLOCKS_SW_POWER_CAP = 0x4
CLOCKS_HW_SLOWDOWN = 0x8
CLOCKS_SW_THERMAL = 0x20
CLOCKS_HW_THERMAL = 0x40
CLOCKS_HW_POWER_BRAKE = 0x80
THROTTLE_MASK = CLOCKS_HW_SLOWDOWN | CLOCKS_SW_THERMAL | CLOCKS_HW_THERMAL | CLOCKS_HW_POWER_BRAKE
IB_ACTIVE = 4


class HealthPolicy(BaseModel):
    """Thresholds and the checks in force; one per node category, the default for the rest."""

    model_config = ConfigDict(extra="forbid")

    disabled: list[str] = Field(default_factory=list, description="names of checks not to run")
    gpu_temp_c: float = Field(90.0, description="GPU temperature at or above which the GPU is degraded")
    throttle_samples: int = Field(3, ge=1, le=100, description="consecutive throttled samples that count")
    retired_pages_dbe_max: int = Field(60, ge=0, description="DBE-retired pages before a GPU is degraded")
    disk_used_degraded_pct: float = Field(90.0, ge=0, le=100)
    disk_used_failed_pct: float = Field(98.0, ge=0, le=100)
    mem_used_degraded_pct: float = Field(98.0, ge=0, le=100)
    stale_after_intervals: float = Field(3.0, gt=1, description="missed sample intervals before metrics are stale")
    xid_actions: dict[int, Action] = Field(
        default_factory=dict,
        description="per-Xid action overriding gpufleet's Xid table: ignore, warn, drain, reset_gpu or reboot",
    )


@dataclass(frozen=True)
class Finding:
    check: str
    severity: Severity
    message: str


@dataclass
class NodeSnapshot:
    """What the checks see of one node. `samples` are the latest first."""

    expected_gpus: int
    samples: Sequence[Entities] = ()
    events: Sequence[NodeEvent] = ()
    metrics_age_s: float | None = None  # seconds since the last sample arrived; None: none yet
    metrics_interval_s: float = 5.0
    checks: Sequence[CheckResult] = ()  # the node's own checks (custom executables, services, mounts)
    gpu_model: str | None = None  # the model its GPUs must be (the `gpu_model` setting), matched as a substring
    gpu_models: Sequence[str] = ()  # the inventoried GPUs' models, by index

    _gpus: dict[int, dict[int, Values]] = field(default_factory=dict, repr=False)  # by id(sample)

    @property
    def latest(self) -> Entities:
        return self.samples[0] if self.samples else {}

    def gpus(self, sample: Entities | None = None) -> dict[int, Values]:
        """The sample's GPUs by index (the latest sample's by default); computed once per sample."""
        sample = self.latest if sample is None else sample
        found = self._gpus.get(id(sample))
        if found is None:
            found = {int(name[4:]): values for name, values in sample.items() if name.startswith("gpu:")}
            self._gpus[id(sample)] = found
        return found


def _gpu(index: int | None) -> str:
    return f"GPU {index}" if index is not None else "a GPU"


def check_gpu_count(node: NodeSnapshot, _policy: HealthPolicy) -> list[Finding]:
    lost = [e for e in node.events if e.kind == "gpu_lost"]
    findings = [Finding("gpu_count", "failed", f"{_gpu(e.gpu)} lost: {e.message or 'gone from NVML'}") for e in lost]
    if node.samples and node.expected_gpus:
        seen = len(node.gpus())
        if seen < node.expected_gpus and not lost:
            findings.append(Finding("gpu_count", "failed", f"{seen} of {node.expected_gpus} GPUs report"))
    if node.gpu_model:
        # A wrong model is a wrong part or a wrong category, for a person to look at: degraded, not drained.
        wrong = sorted({m for m in node.gpu_models if node.gpu_model.casefold() not in m.casefold()})
        if wrong:
            findings.append(
                Finding("gpu_count", "degraded", f"GPU model {', '.join(wrong)}, expected {node.gpu_model}")
            )
    return findings


def check_xid(node: NodeSnapshot, policy: HealthPolicy) -> list[Finding]:
    """Each Xid by the category's policy (or, where it has none for the code, what the log line itself
    suggested, or else the Xid table): drain, reset_gpu and reboot fail the node, warn degrades it,
    ignore leaves it be."""
    xids = XidPolicy(policy.xid_actions)
    findings = []
    for event in node.events:
        if event.kind != "xid" or event.code is None:
            continue
        action = xids.action(event.code, event.suggested)
        info = xid_table().get(event.code)
        if action in REMOVING:
            meaning = info.meaning if info is not None else f"the policy says {action}"
            findings.append(Finding("xid", "failed", f"{_gpu(event.gpu)}: Xid {event.code} ({meaning})"))
        elif action == "warn":
            findings.append(Finding("xid", "degraded", f"{_gpu(event.gpu)}: Xid {event.code}"))
    return findings


def check_host(node: NodeSnapshot, _policy: HealthPolicy) -> list[Finding]:
    """What the host's kernel log said makes it unfit (agent.logs.HOST_FAULTS): a driver whose user-space
    libraries are another version cannot run CUDA at all; after an oops the kernel is in an unknown state;
    a panic read back after the reboot needs a person. The classifier's action decides, as for an Xid."""
    findings = []
    for event in node.events:
        if event.kind != "host_fault":
            continue
        severity: Severity = "failed" if event.suggested in REMOVING else "degraded"
        findings.append(Finding("host", severity, event.message or "a kernel fault"))
    return findings


def check_ecc(node: NodeSnapshot, policy: HealthPolicy) -> list[Finding]:
    findings = []
    for index, v in sorted(node.gpus().items()):
        if v.get("ecc_dbe_volatile", 0) > 0:
            findings.append(
                Finding("ecc", "failed", f"GPU {index}: {v['ecc_dbe_volatile']:.0f} uncorrectable ECC errors")
            )
        if v.get("remapped_rows_failure", 0) > 0:
            findings.append(Finding("ecc", "failed", f"GPU {index}: row remapping failed"))
        if v.get("remapped_rows_pending", 0) > 0:
            findings.append(Finding("ecc", "degraded", f"GPU {index}: row remap pending, needs a GPU reset"))
        if v.get("retired_pages_pending", 0) > 0:
            findings.append(Finding("ecc", "degraded", f"GPU {index}: page retirement pending, needs a GPU reset"))
        if v.get("retired_pages_dbe", 0) > policy.retired_pages_dbe_max:
            findings.append(
                Finding("ecc", "degraded", f"GPU {index}: {v['retired_pages_dbe']:.0f} pages retired for DBEs")
            )
    return findings


def check_thermal(node: NodeSnapshot, policy: HealthPolicy) -> list[Finding]:
    """Throttling counts only when it persists: a brief power-cap dip under load is normal."""
    recent = list(node.samples[: policy.throttle_samples])
    if len(recent) < policy.throttle_samples:
        return []
    findings = []
    for index, latest in sorted(node.gpus().items()):
        history = [node.gpus(s).get(index, {}) for s in recent]
        reasons = [int(v.get("clocks_event_reasons", 0)) for v in history]
        if all(r & THROTTLE_MASK for r in reasons):
            kind = "thermal" if reasons[0] & (CLOCKS_SW_THERMAL | CLOCKS_HW_THERMAL) else "power or hardware"
            findings.append(Finding("thermal", "degraded", f"GPU {index}: {kind} throttling for {len(recent)} samples"))
        elif all(v.get("gpu_temp_c", 0) >= policy.gpu_temp_c for v in history):
            findings.append(Finding("thermal", "degraded", f"GPU {index}: {latest['gpu_temp_c']:.0f} C"))
    return findings


def check_pcie(node: NodeSnapshot, _policy: HealthPolicy) -> list[Finding]:
    """Lanes only: an idle GPU lowers its PCIe generation to save power, but never its width."""
    findings = []
    for index, v in sorted(node.gpus().items()):
        width, width_max = v.get("pcie_link_width"), v.get("pcie_link_width_max")
        if width is not None and width_max and width < width_max:
            findings.append(Finding("pcie", "degraded", f"GPU {index}: PCIe link x{width:.0f} of x{width_max:.0f}"))
    return findings


def check_nvlink(node: NodeSnapshot, _policy: HealthPolicy) -> list[Finding]:
    findings = []
    for index, v in sorted(node.gpus().items()):
        up, total = v.get("nvlink_links_up"), v.get("nvlink_links_total")
        if up is not None and total and up < total:
            findings.append(Finding("nvlink", "failed", f"GPU {index}: {total - up:.0f} of {total:.0f} NVLinks down"))
    return findings


def check_infiniband(node: NodeSnapshot, _policy: HealthPolicy) -> list[Finding]:
    findings = []
    for name, v in sorted(node.latest.items()):
        if name.startswith("ib:") and v.get("ib_state", IB_ACTIVE) != IB_ACTIVE:
            findings.append(Finding("infiniband", "failed", f"InfiniBand port {name[3:]} is not active"))
    return findings


def check_disks_and_memory(node: NodeSnapshot, policy: HealthPolicy) -> list[Finding]:
    findings = []
    for name, v in sorted(node.latest.items()):
        used = v.get("disk_used_pct")
        if name.startswith("disk:") and used is not None:
            if used >= policy.disk_used_failed_pct:
                findings.append(Finding("disk", "failed", f"{name[5:]} is {used:.0f} % full"))
            elif used >= policy.disk_used_degraded_pct:
                findings.append(Finding("disk", "degraded", f"{name[5:]} is {used:.0f} % full"))
    mem = node.latest.get("host", {}).get("mem_used_pct")
    if mem is not None and mem >= policy.mem_used_degraded_pct:
        findings.append(Finding("memory", "degraded", f"memory {mem:.0f} % used"))
    return findings


def check_metrics_fresh(node: NodeSnapshot, policy: HealthPolicy) -> list[Finding]:
    """An agent that heartbeats but stops sampling is hung in its collectors: its data is stale."""
    stale_after = node.metrics_interval_s * policy.stale_after_intervals
    if node.metrics_age_s is not None and node.metrics_age_s > stale_after:
        return [Finding("metrics", "degraded", f"no metrics for {node.metrics_age_s:.0f} s")]
    return []


def check_node_side(node: NodeSnapshot, policy: HealthPolicy) -> list[Finding]:
    """What the node's own checks said: NHC-style executables, required services and mounts.
    A check named in the policy's `disabled` list is ignored like a built-in one."""
    findings = []
    for result in node.checks:
        if result.status == 0 or result.name in policy.disabled:
            continue
        severity: Severity = "failed" if result.status == 1 else "degraded"
        findings.append(Finding("node", severity, f"{result.name}: {result.message or 'failed'}"))
    return findings


# In this order in the verdict's reasons, so the first reason (the one a drain is named after) is the
# likeliest root cause: an Xid 79 before the lost GPU it leaves behind.
CHECKS: dict[str, Callable[[NodeSnapshot, HealthPolicy], list[Finding]]] = {
    "xid": check_xid,
    "gpu_count": check_gpu_count,
    "host": check_host,
    "ecc": check_ecc,
    "thermal": check_thermal,
    "pcie": check_pcie,
    "nvlink": check_nvlink,
    "infiniband": check_infiniband,
    "disk": check_disks_and_memory,
    "metrics": check_metrics_fresh,
    "node": check_node_side,
}


@dataclass(frozen=True)
class Verdict:
    state: Literal["healthy", "degraded", "failed"]
    reasons: tuple[str, ...]


def evaluate(node: NodeSnapshot, policy: HealthPolicy) -> Verdict:
    """Run every check not disabled by the policy; the worst finding decides."""
    findings = [f for name, check in CHECKS.items() if name not in policy.disabled for f in check(node, policy)]
    failed = tuple(f.message for f in findings if f.severity == "failed")
    if failed:
        return Verdict("failed", failed + tuple(f.message for f in findings if f.severity == "degraded"))
    if findings:
        return Verdict("degraded", tuple(f.message for f in findings))
    return Verdict("healthy", ())
