"""The Images page: every software image with its revision, size and the categories and nodes that
use it, each image's recent history, and the latest image syncs with their per-node results. It reads
what `GET /api/v1/images` and `GET /api/v1/tasks?kind=image.` return."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from gpufleet.api.dashboard.pages import View, render
from gpufleet.api.deps import Ctx
from gpufleet.auth.policy import Permission
from gpufleet.provisioning import images
from gpufleet.tasks import service as tasks

router = APIRouter(include_in_schema=False)
HISTORY_SHOWN = 5
TASKS_SHOWN = 10


def images_view(view: View) -> dict[str, Any]:
    session = view.session
    latest = images.latest_revisions(session)
    used = images.users(session)
    rows = []
    for image in images.list_images(session):
        revision = latest.get(image.id)
        rows.append(
            {
                "image": image,
                "files": revision.files if revision else None,
                "size_mb": revision.bytes / 1e6 if revision else None,
                "used_by": used.get(image.name, []),
                "history": images.history(session, image)[:HISTORY_SHOWN],
            }
        )
    recent = [t for t in tasks.list_tasks(session, kind="image.", limit=TASKS_SHOWN) if t.kind.startswith("image.sync")]
    return {"images": rows, "syncs": recent}


@router.get("/images", response_class=HTMLResponse)
def images_page(request: Request, ctx: Ctx) -> Response:
    return render(request, ctx, "images", Permission.IMAGES_READ, images_view)
