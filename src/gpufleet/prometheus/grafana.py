"""A Grafana dashboard for a gpufleet fleet: node health and alerts, then the GPUs by DCGM name.

Grafana's classic dashboard JSON model; import it (Dashboards, New, Import) and pick the Prometheus
data source that scrapes the head. The GPU panels query dcgm-exporter's metric names, so the same
panels also work on a dcgm-exporter scrape (filter by `Hostname` there: it has no `node` label).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpufleet.prometheus.rules import DEFAULT_GPU_TEMP_C

# The classic model's schema version of Grafana 12.0; a newer Grafana migrates it on import.
SCHEMA_VERSION = 41
UID = "gpufleet-fleet"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
GPU_FILTER = '{node=~"$node", gpu=~"$gpu"}'
HEALTH_MAPPINGS = [
    {
        "type": "value",
        "options": {
            "0": {"text": "healthy", "color": "green", "index": 0},
            "1": {"text": "degraded", "color": "orange", "index": 1},
            "2": {"text": "failed", "color": "red", "index": 2},
        },
    }
]


@dataclass(frozen=True)
class Panel:
    title: str
    kind: str  # timeseries, stat, state-timeline, table
    exprs: tuple[tuple[str, str], ...]  # (PromQL, legend)
    width: int
    height: int = 8
    unit: str = "short"
    extra: tuple[tuple[str, Any], ...] = ()  # fieldConfig.defaults entries


def _variable(name: str, query: str, label: str) -> dict[str, Any]:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "definition": query,
        "query": {"query": query, "refId": f"{name}-values"},
        "refresh": 2,  # on time range change: nodes come and go
        "includeAll": True,
        "multi": True,
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "sort": 3,  # natural order: n2 before n10
    }


def _templating() -> dict[str, Any]:
    return {
        "list": [
            {
                "name": "datasource",
                "label": "Prometheus",
                "type": "datasource",
                "query": "prometheus",
                "current": {},
                "hide": 0,
            },
            _variable("node", "label_values(gpufleet_node_up, node)", "Node"),
            _variable("gpu", 'label_values(DCGM_FI_DEV_GPU_UTIL{node=~"$node"}, gpu)', "GPU"),
        ]
    }


def _panels() -> list[tuple[str, list[Panel]]]:
    temp_steps = [{"color": "green", "value": None}, {"color": "red", "value": DEFAULT_GPU_TEMP_C}]
    return [
        (
            "Fleet",
            [
                Panel("Nodes up", "stat", (("sum(max by (node) (gpufleet_node_up))", "up"),), 4, 4),
                Panel(
                    "Nodes down",
                    "stat",
                    (("count(max by (node) (gpufleet_node_up) == 0) or vector(0)", "down"),),
                    4,
                    4,
                ),
                Panel(
                    "Nodes failed",
                    "stat",
                    (("count(max by (node) (gpufleet_node_health) == 2) or vector(0)", "failed"),),
                    4,
                    4,
                ),
                Panel("Nodes drained", "stat", (("sum(max by (node) (gpufleet_node_drained))", "drained"),), 4, 4),
                Panel(
                    "Alerts firing",
                    "stat",
                    (("sum(max by (alertname, severity) (gpufleet_alerts_firing))", "firing"),),
                    4,
                    4,
                ),
                Panel(
                    "GPUs",
                    "stat",
                    (('count(DCGM_FI_DEV_GPU_UTIL{node=~"$node"})', "GPUs"),),
                    4,
                    4,
                ),
                Panel(
                    "Node health",
                    "state-timeline",
                    (('max by (node) (gpufleet_node_health{node=~"$node"})', "{{node}}"),),
                    12,
                    extra=(("mappings", HEALTH_MAPPINGS),),
                ),
                Panel(
                    "Alerts firing by rule",
                    "timeseries",
                    (("max by (alertname, severity) (gpufleet_alerts_firing) > 0", "{{alertname}} ({{severity}})"),),
                    12,
                ),
            ],
        ),
        (
            "GPUs",
            [
                Panel(
                    "GPU utilization",
                    "timeseries",
                    ((f"DCGM_FI_DEV_GPU_UTIL{GPU_FILTER}", "{{node}} GPU {{gpu}}"),),
                    12,
                    unit="percent",
                    extra=(("min", 0), ("max", 100)),
                ),
                Panel(
                    "GPU memory used",
                    "timeseries",
                    (
                        (
                            f"100 * DCGM_FI_DEV_FB_USED{GPU_FILTER}"
                            f" / (DCGM_FI_DEV_FB_USED{GPU_FILTER} + DCGM_FI_DEV_FB_FREE{GPU_FILTER})",
                            "{{node}} GPU {{gpu}}",
                        ),
                    ),
                    12,
                    unit="percent",
                    extra=(("min", 0), ("max", 100)),
                ),
                Panel(
                    "GPU temperature",
                    "timeseries",
                    ((f"DCGM_FI_DEV_GPU_TEMP{GPU_FILTER}", "{{node}} GPU {{gpu}}"),),
                    12,
                    unit="celsius",
                    extra=(("thresholds", {"mode": "absolute", "steps": temp_steps}),),
                ),
                Panel(
                    "GPU power",
                    "timeseries",
                    ((f"DCGM_FI_DEV_POWER_USAGE{GPU_FILTER}", "{{node}} GPU {{gpu}}"),),
                    12,
                    unit="watt",
                ),
                Panel(
                    "SM clock",
                    "timeseries",
                    ((f"DCGM_FI_DEV_SM_CLOCK{GPU_FILTER} * 1000000", "{{node}} GPU {{gpu}}"),),
                    12,
                    unit="hertz",
                ),
                Panel(
                    "Framebuffer memory used",
                    "timeseries",
                    ((f"DCGM_FI_DEV_FB_USED{GPU_FILTER}", "{{node}} GPU {{gpu}}"),),
                    12,
                    unit="mbytes",
                ),
                Panel(
                    "Last Xid per GPU",
                    "table",
                    ((f"DCGM_FI_DEV_XID_ERRORS{GPU_FILTER} > 0", ""),),
                    12,
                ),
                Panel(
                    "Memory errors",
                    "timeseries",
                    (
                        (f"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{GPU_FILTER}", "{{node}} GPU {{gpu}} uncorrectable ECC"),
                        (f"DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS{GPU_FILTER}", "{{node}} GPU {{gpu}} remapped rows"),
                        (f"DCGM_FI_DEV_ROW_REMAP_FAILURE{GPU_FILTER}", "{{node}} GPU {{gpu}} remap failed"),
                    ),
                    12,
                ),
            ],
        ),
    ]


def _panel_json(panel: Panel, panel_id: int, x: int, y: int) -> dict[str, Any]:
    targets: list[dict[str, Any]] = [
        {"datasource": DATASOURCE, "expr": expr, "legendFormat": legend, "refId": chr(ord("A") + i)}
        for i, (expr, legend) in enumerate(panel.exprs)
    ]
    if panel.kind == "table":
        for target in targets:
            target |= {"instant": True, "format": "table"}
    return {
        "id": panel_id,
        "type": panel.kind,
        "title": panel.title,
        "datasource": DATASOURCE,
        "gridPos": {"x": x, "y": y, "w": panel.width, "h": panel.height},
        "fieldConfig": {"defaults": {"unit": panel.unit, **dict(panel.extra)}, "overrides": []},
        "options": {},
        "targets": targets,
    }


def dashboard(title: str = "gpufleet: fleet and GPUs") -> dict[str, Any]:
    """The dashboard JSON (a dict: `json.dumps` it), laid out left to right in rows of 24 columns."""
    panels: list[dict[str, Any]] = []
    y = 0
    next_id = 1
    for row_title, row in _panels():
        panels.append(
            {
                "id": next_id,
                "type": "row",
                "title": row_title,
                "collapsed": False,
                "gridPos": {"x": 0, "y": y, "w": 24, "h": 1},
                "panels": [],
            }
        )
        next_id += 1
        y += 1
        x, line_height = 0, 0
        for panel in row:
            if x + panel.width > 24:
                x, y, line_height = 0, y + line_height, 0
            panels.append(_panel_json(panel, next_id, x, y))
            next_id += 1
            x += panel.width
            line_height = max(line_height, panel.height)
        y += line_height
    return {
        "uid": UID,
        "title": title,
        "description": "gpufleet's fleet health and alerts, and its GPUs under dcgm-exporter's metric names.",
        "tags": ["gpufleet", "gpu", "dcgm"],
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "editable": True,
        "graphTooltip": 1,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "30s",
        "timezone": "",
        "annotations": {"list": []},
        "links": [],
        "templating": _templating(),
        "panels": panels,
    }
