"""Job templates (jobs.templates): the built-in ones and the admins' (`job_templates_dir`), read from their
files at each request so a new file needs no restart, and rendered here into job specs: the CLI installs
without the job models, so it asks the head for the spec and submits that.

All of it needs `jobs:read`: a rendered spec is only text until it is submitted, which `jobs:submit` checks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from gpufleet.api.deps import Ctx, allow
from gpufleet.auth.policy import Permission
from gpufleet.auth.schemas import Principal
from gpufleet.core.config import Settings
from gpufleet.core.errors import NotFound
from gpufleet.jobs import templates
from gpufleet.jobs.templates import Template

router = APIRouter(tags=["templates"])
Read = Annotated[Principal, allow(Permission.JOBS_READ)]
Render = Annotated[Principal, allow(Permission.JOBS_READ, reads_only=True)]  # text out, nothing changed


class ParamOut(BaseModel):
    name: str
    type: str
    required: bool
    default: Any = None
    help: str
    min: int | None
    max: int | None
    choices: list[str] | None


class TemplateOut(BaseModel):
    name: str
    description: str
    origin: str = Field(description='"built-in", or "admin" for a file of job_templates_dir')
    params: list[ParamOut]
    job: dict[str, Any] = Field(description="the job spec as written, with {param} placeholders")


class TemplateList(BaseModel):
    templates: list[TemplateOut]
    problems: list[str] = Field(description="admin template files that could not be read, and why")


class RenderIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    values: dict[str, Annotated[str, Field(max_length=4096)]] = Field(default_factory=dict, max_length=64)


def admin_dir(settings: Settings) -> Path:
    return settings.job_templates_dir or settings.data_dir / "job-templates"


def load(settings: Settings) -> tuple[dict[str, Template], list[str]]:
    """The templates, and the problems of those that did not load, naming files without the head's
    directories (every `jobs:read` user sees them)."""
    directory = admin_dir(settings)
    loaded, problems = templates.load_templates([directory])
    return loaded, [p.replace(f"{directory}/", "").replace(f"{templates.BUILTIN_DIR}/", "") for p in problems]


def _out(found: Template) -> TemplateOut:
    params = [
        ParamOut(
            name=p.name,
            type=p.type,
            required=p.required,
            default=list(p.default) if isinstance(p.default, tuple) else p.default,
            help=p.help,
            min=p.min,
            max=p.max,
            choices=list(p.choices) if p.choices is not None else None,
        )
        for p in found.params.values()
    ]
    job = dict(found.job)
    return TemplateOut(name=found.name, description=found.description, origin=found.origin, params=params, job=job)


def _one(ctx: Ctx, name: str) -> Template:
    loaded, _ = load(ctx.settings)
    if name not in loaded:
        raise NotFound(f"no job template {name} (gpufleet template list shows them)")
    return loaded[name]


@router.get("/templates")
def list_templates(_: Read, ctx: Ctx) -> TemplateList:
    loaded, problems = load(ctx.settings)
    return TemplateList(templates=[_out(t) for t in sorted(loaded.values(), key=lambda t: t.name)], problems=problems)


@router.get("/templates/{name}")
def show_template(name: str, _: Read, ctx: Ctx) -> TemplateOut:
    return _out(_one(ctx, name))


@router.post("/templates/{name}/render")
def render_template(name: str, body: RenderIn, _: Render, ctx: Ctx) -> dict[str, Any]:
    """The job spec these values give (the fields the template sets), ready for POST /jobs."""
    return _one(ctx, name).render(body.values)
