"""Prometheus alerting rules equivalent to gpufleet's own checks, and their `promtool test rules` file.

Each rule carries one test case: input series, a time at which it must not fire yet (before its
`for:` has run out, or before the bad value) and a time at which it must, with the alerts' labels.
The test file is generated from these cases, so `promtool test rules` checks every rule's expression,
`for:` and annotation templates against a real Prometheus rule engine.

Node-level series (`gpufleet_node_*`) come from the head's database, so every head replica exposes
them; the rules aggregate them `by (node)` so that scraping several replicas raises one alert.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from gpufleet.logs.catalog import REMOVING, xid_table

# The Xids gpufleet's table takes the GPU out of service for (drain, reset, reboot), as the health checks do
# by default (a category's `xid_actions` can change that at the head; these rules follow the table).
FATAL_XID_CODES: tuple[int, ...] = tuple(sorted(c for c, info in xid_table().items() if info.action in REMOVING))
DEFAULT_JOB = "gpufleet"
DEFAULT_GPU_TEMP_C = 85.0
TEST_INTERVAL = "15s"

_HEAD = {"job": DEFAULT_JOB, "instance": "head.example:8443"}


def _gpu(index: int, node: str = "n1") -> dict[str, str]:
    """A GPU's labels as the head exposes them (names.GPU_LABELS, a test checks), scraped from a head."""
    values = {
        "gpu": str(index),
        "UUID": f"GPU-0000000{index}-aaaa-bbbb-cccc-dddddddddddd",
        "pci_bus_id": f"00000000:{0x18 + index:02X}:00.0",
        "device": f"nvidia{index}",
        "modelName": "NVIDIA H200",
        "Hostname": node,
        "DCGM_FI_DRIVER_VERSION": "580.95.05",
        "node": node,
    }
    return {**values, **_HEAD}


def _node(node: str, **extra: str) -> dict[str, str]:
    return {"node": node, **extra, **_HEAD}


def _series(name: str, labels: dict[str, str]) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return f"{name}{{{inner}}}"


@dataclass(frozen=True)
class Case:
    """A unit test of one rule, with series sampled every TEST_INTERVAL."""

    series: dict[str, str]  # series selector -> promtool's expanding notation, e.g. "1 0x8"
    quiet_at: str  # eval time at which no alert of the rule fires
    fires_at: str  # eval time at which exactly `alerts` fire
    alerts: tuple[tuple[dict[str, str], float], ...]  # each alert's labels (without severity) and $value


@dataclass(frozen=True)
class AlertRule:
    name: str
    expr: str
    severity: str
    summary: str
    description: str
    case: Case
    for_: str = "0s"
    group: str = "gpufleet-gpus"
    labels: dict[str, str] = field(default_factory=dict)


def _fatal_xid(metric: str = "DCGM_FI_DEV_XID_ERRORS") -> str:
    return " or ".join(f"{metric} == {code}" for code in FATAL_XID_CODES)


def _gpu_rule(
    name: str, metric: str, op: str, severity: str, summary: str, description: str, for_: str = "0s"
) -> AlertRule:
    """A rule `metric <op>` on one GPU series; tested with the value going from 0 to 1."""
    gpu0 = _gpu(0)
    case = Case({_series(metric, gpu0): "0 0 1 1", _series(metric, _gpu(1)): "0 0 0 0"}, "15s", "30s", ((gpu0, 1),))
    return AlertRule(name, f"{metric} {op}", severity, summary, description, case, for_)


def alert_rules(job: str = DEFAULT_JOB, gpu_temp_c: float = DEFAULT_GPU_TEMP_C) -> list[AlertRule]:
    """The rules, for a scrape job named `job` and a GPU temperature threshold."""
    n1, n2 = _node("n1"), _node("n2")
    gpu0, gpu1 = _gpu(0), _gpu(1)
    hot, warm = gpu_temp_c + 5, gpu_temp_c - 10
    reasons = "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"
    where = "GPU {{ $labels.gpu }} ({{ $labels.UUID }}) on {{ $labels.node }}"
    return [
        AlertRule(
            "NodeDown",
            "max by (node) (gpufleet_node_up) == 0",
            "critical",
            "Node {{ $labels.node }} is down",
            "gpufleet has had no heartbeat from {{ $labels.node }} for longer than its deadline.",
            Case(
                {_series("gpufleet_node_up", n1): "1 1 0 0 0 0 0", _series("gpufleet_node_up", n2): "1x6"},
                "45s",
                "1m",
                (({"node": "n1"}, 0),),
            ),
            for_="30s",
            group="gpufleet-nodes",
        ),
        AlertRule(
            "NodeFailed",
            "max by (node) (gpufleet_node_health) == 2",
            "critical",
            "Node {{ $labels.node }} failed its health checks",
            "gpufleet judged {{ $labels.node }} failed and drained it; `gpufleet health {{ $labels.node }}` says why.",
            Case(
                {_series("gpufleet_node_health", n1): "0 0 2 2", _series("gpufleet_node_health", n2): "1 1 1 1"},
                "15s",
                "30s",
                (({"node": "n1"}, 2),),
            ),
            group="gpufleet-nodes",
        ),
        AlertRule(
            "NodeDegraded",
            "max by (node) (gpufleet_node_health) == 1",
            "warning",
            "Node {{ $labels.node }} is degraded",
            "gpufleet judged {{ $labels.node }} degraded; `gpufleet health {{ $labels.node }}` says why.",
            Case({_series("gpufleet_node_health", n1): "0 1x30"}, "5m", "5m30s", (({"node": "n1"}, 1),)),
            for_="5m",
            group="gpufleet-nodes",
        ),
        AlertRule(
            "GpufleetHeadDown",
            f'up{{job="{job}"}} == 0',
            "critical",
            "Prometheus cannot scrape the gpufleet head {{ $labels.instance }}",
            "Without the head's /metrics, no gpufleet rule can fire: check the head and the scrape token.",
            Case(
                {_series("up", {**_HEAD, "job": job}): "1 0x10"},
                "1m",
                "1m30s",
                (({**_HEAD, "job": job}, 0),),
            ),
            for_="1m",
            group="gpufleet-nodes",
        ),
        AlertRule(
            "GpuTemperatureHigh",
            f"DCGM_FI_DEV_GPU_TEMP > {gpu_temp_c:g}",
            "warning",
            f"{where} is at {{{{ $value }}}} C",
            f"The GPU has been above {gpu_temp_c:g} C for two minutes: check its cooling.",
            Case(
                {
                    _series("DCGM_FI_DEV_GPU_TEMP", gpu0): f"{warm:g} {hot:g}x12",
                    _series("DCGM_FI_DEV_GPU_TEMP", gpu1): f"{warm:g}x12",
                },
                "2m",
                "2m30s",
                ((gpu0, hot),),
            ),
            for_="2m",
        ),
        AlertRule(
            "GpuThrottled",
            # Hardware slowdown (0x8), software and hardware thermal (0x20, 0x40) and the power brake
            # (0x80): the brakes gpufleet's thermal check counts. PromQL has no bitwise and.
            f"{reasons} and (floor({reasons} / 8) % 2 == 1 or floor({reasons} / 32) % 8 > 0)",
            "warning",
            f"{where} is being slowed by its thermal or power brakes (reasons {{{{ $value }}}})",
            "The GPU's clocks have been held down by hardware for a minute; a power cap alone does not count.",
            Case(
                {_series(reasons, gpu0): "0 64x8", _series(reasons, gpu1): "4x8"},
                "1m",
                "1m30s",
                ((gpu0, 64),),
            ),
            for_="1m",
        ),
        AlertRule(
            "GpuXidFatal",
            _fatal_xid(),
            "critical",
            f"{where} reported Xid {{{{ $value }}}}",
            "A fatal Xid: the GPU cannot be trusted with work until it is reset or replaced; gpufleet drains the node.",
            Case(
                {_series("DCGM_FI_DEV_XID_ERRORS", gpu0): "0 79x4", _series("DCGM_FI_DEV_XID_ERRORS", gpu1): "0 13x4"},
                "0s",
                "30s",
                ((gpu0, 79),),
            ),
        ),
        AlertRule(
            "GpuXidError",
            f"DCGM_FI_DEV_XID_ERRORS > 0 unless ({_fatal_xid()})",
            "warning",
            f"{where} reported Xid {{{{ $value }}}}",
            "An Xid that usually concerns the job that ran, not the GPU; see NVIDIA's Xid catalog.",
            Case(
                {_series("DCGM_FI_DEV_XID_ERRORS", gpu0): "0 79x4", _series("DCGM_FI_DEV_XID_ERRORS", gpu1): "0 13x4"},
                "0s",
                "30s",
                ((gpu1, 13),),
            ),
        ),
        _gpu_rule(
            "GpuUncorrectableEccErrors",
            "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
            "> 0",
            "critical",
            f"{where} has {{{{ $value }}}} uncorrectable ECC errors",
            "Uncorrectable (double-bit) ECC errors since the driver loaded: gpufleet fails the node.",
        ),
        _gpu_rule(
            "GpuRowRemapFailure",
            "DCGM_FI_DEV_ROW_REMAP_FAILURE",
            "> 0",
            "critical",
            f"{where}: row remapping failed",
            "The GPU has no spare memory rows left for a failing one: replace it.",
        ),
        _gpu_rule(
            "GpuRowRemapPending",
            "DCGM_FI_DEV_ROW_REMAP_PENDING",
            "> 0",
            "warning",
            f"{where}: a row remap waits for a GPU reset",
            "Reset the GPU when the node is drained to apply the remap.",
        ),
        _gpu_rule(
            "GpuRetiredPagesPending",
            "DCGM_FI_DEV_RETIRED_PENDING",
            "> 0",
            "warning",
            f"{where}: a page retirement waits for a GPU reset",
            "Reset the GPU when the node is drained to retire the page.",
        ),
        AlertRule(
            "GpuUncorrectableRemappedRows",
            "increase(DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS[1h]) > 0",
            "warning",
            f"{where} remapped a row for an uncorrectable error",
            "A memory row failed with an uncorrectable error within the last hour and was remapped.",
            Case(
                {
                    _series("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", gpu0): "0 0 0 1 1 1",
                    _series("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", gpu1): "0x5",
                },
                "30s",
                "1m",
                ((gpu0, 1),),
            ),
        ),
        AlertRule(
            "GpuNvlinkDown",
            "gpufleet_gpu_nvlink_links_up < gpufleet_gpu_nvlink_links",
            "critical",
            f"{where} has only {{{{ $value }}}} NVLinks up",
            "An NVLink is down: collective operations over it fail or slow down; gpufleet fails the node.",
            Case(
                {
                    _series("gpufleet_gpu_nvlink_links_up", gpu0): "18 18 16 16",
                    _series("gpufleet_gpu_nvlink_links", gpu0): "18x3",
                    _series("gpufleet_gpu_nvlink_links_up", gpu1): "18x3",
                    _series("gpufleet_gpu_nvlink_links", gpu1): "18x3",
                },
                "15s",
                "30s",
                ((gpu0, 16),),
            ),
        ),
        AlertRule(
            "GpuPcieLinkDegraded",
            "DCGM_FI_DEV_PCIE_LINK_WIDTH < DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH",
            "warning",
            f"{where} runs its PCIe link at x{{{{ $value }}}}",
            "The PCIe link trained at fewer lanes than the GPU and slot support: reseat or check the riser.",
            Case(
                {
                    _series("DCGM_FI_DEV_PCIE_LINK_WIDTH", gpu0): "16 8x30",
                    _series("DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH", gpu0): "16x30",
                },
                "5m",
                "5m30s",
                ((gpu0, 8),),
            ),
            for_="5m",
        ),
        AlertRule(
            "InfinibandPortDown",
            "gpufleet_infiniband_state != 4",
            "critical",
            "InfiniBand port {{ $labels.device }}/{{ $labels.port }} on {{ $labels.node }} is not active",
            "The port's state is {{ $value }} (1 down, 2 init, 3 armed, 4 active): gpufleet fails the node.",
            Case(
                {
                    _series("gpufleet_infiniband_state", _node("n1", device="mlx5_0", port="1")): "4 4 1 1",
                    _series("gpufleet_infiniband_state", _node("n1", device="mlx5_1", port="1")): "4x3",
                },
                "15s",
                "30s",
                ((_node("n1", device="mlx5_0", port="1"), 1),),
            ),
            group="gpufleet-hosts",
        ),
        AlertRule(
            "DiskFull",
            "gpufleet_filesystem_used_percent >= 98",
            "critical",
            "{{ $labels.mountpoint }} on {{ $labels.node }} is {{ $value }} % full",
            "A full filesystem fails jobs and the node's own services: gpufleet fails the node.",
            Case(
                {_series("gpufleet_filesystem_used_percent", _node("n1", mountpoint="/")): "50 99 99"},
                "0s",
                "15s",
                ((_node("n1", mountpoint="/"), 99),),
            ),
            group="gpufleet-hosts",
        ),
        AlertRule(
            "DiskAlmostFull",
            "gpufleet_filesystem_used_percent >= 90 < 98",
            "warning",
            "{{ $labels.mountpoint }} on {{ $labels.node }} is {{ $value }} % full",
            "The filesystem has been over 90 % full for five minutes.",
            Case(
                {
                    _series("gpufleet_filesystem_used_percent", _node("n1", mountpoint="/")): "50 95x30",
                    _series("gpufleet_filesystem_used_percent", _node("n1", mountpoint="/scratch")): "99x30",
                },
                "5m",
                "5m30s",
                ((_node("n1", mountpoint="/"), 95),),
            ),
            for_="5m",
            group="gpufleet-hosts",
        ),
        AlertRule(
            "MemoryPressure",
            "gpufleet_memory_used_percent >= 98",
            "warning",
            "{{ $labels.node }} has {{ $value }} % of its memory in use",
            "Memory has been nearly exhausted for five minutes: the OOM killer is near.",
            Case({_series("gpufleet_memory_used_percent", n1): "50 99x30"}, "5m", "5m30s", ((n1, 99),)),
            for_="5m",
            group="gpufleet-hosts",
        ),
    ]


def rules_document(rules: list[AlertRule]) -> dict[str, Any]:
    """The rules file (`groups:`), rules grouped in the order their groups first appear."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for rule in rules:
        entry: dict[str, Any] = {"alert": rule.name, "expr": rule.expr}
        if rule.for_ != "0s":
            entry["for"] = rule.for_
        entry["labels"] = {"severity": rule.severity, **rule.labels}
        entry["annotations"] = {"summary": rule.summary, "description": rule.description}
        groups.setdefault(rule.group, []).append(entry)
    return {"groups": [{"name": name, "rules": entries} for name, entries in groups.items()]}


_TEMPLATE = re.compile(r"\{\{\s*\$(labels\.([A-Za-z_][A-Za-z0-9_]*)|value)\s*\}\}")


def _go_value(value: float) -> str:
    """`{{ $value }}` as Go's text/template prints a float64 (%v)."""
    value = float(value)
    return str(int(value)) if value.is_integer() and abs(value) < 1e21 else repr(value)


def expand(template: str, labels: dict[str, str], value: float) -> str:
    """An annotation as Prometheus renders it, for the `$labels.X` and `$value` forms used here.

    Raises ValueError for any other template action, so a rule cannot use one untested.
    """
    rest = _TEMPLATE.sub("", template)
    if "{{" in rest:
        raise ValueError(f"unsupported template in {template!r}")

    def one(match: re.Match[str]) -> str:
        return _go_value(value) if match.group(1) == "value" else labels.get(match.group(2), "")

    return _TEMPLATE.sub(one, template)


def rules_test_document(rules: list[AlertRule], rules_file: str) -> dict[str, Any]:
    """The `promtool test rules` file: one test group per rule, from its case."""
    tests = []
    for rule in rules:
        case = rule.case
        expected = []
        for labels, value in case.alerts:
            alert_labels = {**labels, "severity": rule.severity, **rule.labels}
            expected.append(
                {
                    "exp_labels": alert_labels,
                    "exp_annotations": {
                        "summary": expand(rule.summary, alert_labels, value),
                        "description": expand(rule.description, alert_labels, value),
                    },
                }
            )
        tests.append(
            {
                "interval": TEST_INTERVAL,
                "input_series": [{"series": s, "values": v} for s, v in case.series.items()],
                "alert_rule_test": [
                    {"eval_time": case.quiet_at, "alertname": rule.name, "exp_alerts": []},
                    {"eval_time": case.fires_at, "alertname": rule.name, "exp_alerts": expected},
                ],
            }
        )
    return {"rule_files": [rules_file], "evaluation_interval": TEST_INTERVAL, "tests": tests}
