"""The GPU map: one cell per GPU of the fleet, coloured by utilization or temperature; a node's cells
link to the node. Faulty GPUs are red and unavailable ones hatched whatever the colouring, so a
fallen GPU stands out among thousands."""

from __future__ import annotations

from collections import Counter
from itertools import groupby
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response
from markupsafe import Markup, escape

from gpufleet.api.dashboard import gpu_usage
from gpufleet.api.dashboard.gpu_usage import GpuCell
from gpufleet.api.dashboard.pages import View, render
from gpufleet.api.deps import Ctx
from gpufleet.auth.policy import Permission
from gpufleet.core.errors import InvalidInput

router = APIRouter(include_in_schema=False)
LEVEL_STEP = 5  # 21 shades from palest to darkest: finer than the eye tells apart on a 11 px cell
# colour -> (the cell's value, the value drawn palest, the value drawn darkest, unit)
COLOURS: dict[str, tuple[str, float, float, str]] = {
    "util": ("util", 0.0, 100.0, "%"),
    "temp": ("temp_c", 25.0, 90.0, "C"),
    "power": ("power_w", 50.0, 700.0, "W"),
}


def shade(cell: GpuCell, colour: str) -> int | None:
    """0-100: how dark the cell is drawn; None for no value."""
    attribute, low, high, _unit = COLOURS[colour]
    value: float | None = getattr(cell, attribute)
    if value is None:
        return None
    return round(max(0.0, min(1.0, (value - low) / (high - low))) * 100)


def _cell_title(cell: GpuCell) -> str:
    parts = [f"GPU {cell.index}: {cell.status.replace('_', ' ')}"]
    for value, unit in ((cell.util, "%"), (cell.temp_c, "C"), (cell.power_w, "W")):
        if value is not None:
            parts.append(f"{value:.0f} {unit}")
    text = ", ".join(parts)
    return f"{text} — {cell.note}" if cell.note else text


def node_cells(node: str, cells: list[GpuCell], colour: str) -> Markup:
    """One node's link with a cell per GPU. Built here rather than in the template: at 8,000 GPUs,
    Jinja's loop over the cells took most of the page's time (bench/dashboard.py), and so did
    `Markup.format`; f-strings with `escape` on every text from outside (the node's name, the
    cell's title) take a fraction of it. Status, index and level are ours: a fixed word and numbers."""
    counts = Counter(c.status.replace("_", " ") for c in cells)
    label = escape(f"{node}: " + ", ".join(f"{n} {status}" for status, n in counts.items()))
    name = escape(node)
    parts = [f'<a class="hm-node" href="/nodes/{name}" data-node="{name}" aria-label="{label}">']
    for cell in cells:
        level = _level(cell, colour)
        shaded = f" v{level}" if level is not None else ""
        parts.append(
            f'<i class="cell {cell.status}{shaded}" data-gpu="{cell.index}" title="{escape(_cell_title(cell))}"></i>'
        )
    parts.append("</a>")
    return Markup("".join(parts))  # noqa: S704 -- every text from outside went through escape() above


def _level(cell: GpuCell, colour: str) -> int | None:
    """The cell's shade in steps of LEVEL_STEP, drawn by a class (`v0` to `v100` in app.css): the page's
    Content-Security-Policy allows no style attribute, so a cell cannot carry its own `--v`."""
    value = shade(cell, colour) if cell.status in ("in_use", "idle") else None
    return None if value is None else round(value / LEVEL_STEP) * LEVEL_STEP


def gpu_map(view: View) -> dict[str, Any]:
    colour = view.query.get("color", "util")
    if colour not in COLOURS:
        raise InvalidInput(f"colour by one of {', '.join(COLOURS)}, not {colour!r}")
    status = view.query.get("status")
    if status is not None and status not in gpu_usage.STATUSES:
        raise InvalidInput(f"status is one of {', '.join(gpu_usage.STATUSES)}")
    fleet = gpu_usage.snapshot(view.session, view.ctx)
    cells = [c for c in fleet.cells if status is None or c.status == status]
    rows = [node_cells(node, list(group), colour) for node, group in groupby(cells, key=lambda c: c.node)]
    _attribute, low, high, unit = COLOURS[colour]
    return {
        "rows": rows,
        "counts": fleet.counts,
        "colour": colour,
        "status": status or "",
        "scale": (low, high, unit),
        "colours": list(COLOURS),
        "statuses": gpu_usage.STATUSES,
    }


@router.get("/gpus", response_class=HTMLResponse)
def gpu_map_page(request: Request, ctx: Ctx) -> Response:
    return render(request, ctx, "gpus", Permission.NODES_READ, gpu_map)
