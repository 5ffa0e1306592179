"""Categories and node settings: defaults < category < node (inventory.categories).

Reads need `nodes:read`, changes `nodes:write`; every change is audited by the audit middleware,
with the category or node as its target.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.orm import Session

from gpufleet.api.deps import Ctx, allow, tx
from gpufleet.auth.policy import Permission
from gpufleet.auth.schemas import Principal
from gpufleet.inventory import categories
from gpufleet.inventory import service as inventory
from gpufleet.inventory.categories import Resolved
from gpufleet.inventory.models import Category
from gpufleet.inventory.schemas import SettingOut
from gpufleet.monitoring import rules
from gpufleet.protocol.settings import SETTINGS, NodeSettingValues

router = APIRouter(tags=["categories"])

# The API schema of a settings object is the registry's own (one definition of every key); values are
# checked by inventory.categories, which names an unknown key with the known ones.
_SCHEMA = NodeSettingValues.model_json_schema()
_SETTINGS_FIELD: dict[str, Any] = {
    "json_schema_extra": {"properties": _SCHEMA["properties"], "additionalProperties": False},
    "description": f"setting values by key: {', '.join(SETTINGS)}",
}


class CategoryIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(max_length=64)
    description: str = Field("", max_length=512)
    settings: dict[str, Any] = Field(default_factory=dict, max_length=64, **_SETTINGS_FIELD)


class SettingsPatch(BaseModel):
    """Keys to set (null sets "none" where a key allows it) and keys to unset (inherit again)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    set_: dict[str, Any] = Field(default_factory=dict, alias="set", max_length=64, **_SETTINGS_FIELD)
    unset: list[str] = Field(default_factory=list, max_length=64)


class CategoryPatch(SettingsPatch):
    description: str | None = Field(None, max_length=512)


class NodeSettingsPatch(SettingsPatch):
    category: str | None = Field(
        None, max_length=64, description='move the node to this category (made if missing); "" for none'
    )


class CategoryOut(BaseModel):
    name: str
    description: str
    settings: dict[str, Any] = Field(description="the values set on the category itself")
    nodes: int
    created_at: datetime
    updated_at: datetime


class CategoryDetail(CategoryOut):
    resolved: dict[str, SettingOut] = Field(description="what its nodes inherit: origin category or default")
    node_names: list[str]


class NodeSettingsOut(BaseModel):
    node: str
    category: str | None
    settings: dict[str, SettingOut]


def _out(row: Category, count: int) -> CategoryOut:
    return CategoryOut(
        name=row.name,
        description=row.description,
        settings=dict(row.settings or {}),
        nodes=count,
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


def health_policy_setting(session: Session, category: str | None) -> SettingOut:
    """The health policy a node of `category` is judged by, shown as a setting: its value is the
    thresholds that differ from gpufleet's built-in ones (`{}`: all built in), its origin "category"
    (the category's own policy, `gpufleet health-policy set CATEGORY`) or "default"."""
    policy, origin = rules.policy_in_force(session, category)
    return SettingOut(value=policy.model_dump(exclude_defaults=True), origin=origin)


def _settings(session: Session, resolved: dict[str, Resolved], category: str | None) -> dict[str, SettingOut]:
    """Resolved settings as the API shows them, with the health policy in force."""
    out = {k: SettingOut(value=r.value, origin=r.origin) for k, r in resolved.items()}
    out["health_policy"] = health_policy_setting(session, category)
    return out


@router.get("/categories")
def list_categories(_: Annotated[Principal, allow(Permission.NODES_READ)], ctx: Ctx) -> list[CategoryOut]:
    with tx(ctx, readonly=True) as db:
        counts = categories.node_counts(db)
        return [_out(row, counts[row.name]) for row in categories.list_categories(db)]


@router.post("/categories", status_code=201)
def create_category(
    body: CategoryIn, _: Annotated[Principal, allow(Permission.NODES_WRITE)], ctx: Ctx, request: Request
) -> CategoryOut:
    request.state.audit_target = f"category {body.name}"
    with tx(ctx) as db:
        return _out(categories.create_category(db, ctx.clock, body.name, body.description, body.settings), 0)


@router.get("/categories/{name}")
def show_category(name: str, _: Annotated[Principal, allow(Permission.NODES_READ)], ctx: Ctx) -> CategoryDetail:
    with tx(ctx, readonly=True) as db:
        row = categories.get_category(db, name)
        names = categories.node_names(db, name)
        resolved = categories.resolve_values(row.settings, None)
        return CategoryDetail(
            **_out(row, len(names)).model_dump(), resolved=_settings(db, resolved, name), node_names=names
        )


@router.patch("/categories/{name}")
def update_category(
    name: str,
    body: CategoryPatch,
    _: Annotated[Principal, allow(Permission.NODES_WRITE)],
    ctx: Ctx,
    request: Request,
) -> CategoryOut:
    """Set and unset settings (all or nothing: an unknown key or bad value changes nothing)."""
    request.state.audit_target = f"category {name}: {_change(body)}"
    with tx(ctx) as db:
        row = categories.update_category(
            db, ctx.clock, name, set_=body.set_, unset=body.unset, description=body.description
        )
        return _out(row, categories.node_counts(db)[name])


@router.delete("/categories/{name}", status_code=204)
def remove_category(
    name: str, _: Annotated[Principal, allow(Permission.NODES_WRITE)], ctx: Ctx, request: Request
) -> None:
    """Refused (409) while nodes are in it."""
    request.state.audit_target = f"category {name}"
    with tx(ctx) as db:
        categories.remove_category(db, name)


@router.patch("/nodes/{name}/settings")
def update_node_settings(
    name: str,
    body: NodeSettingsPatch,
    _: Annotated[Principal, allow(Permission.NODES_WRITE)],
    ctx: Ctx,
    request: Request,
) -> NodeSettingsOut:
    """A node's own values, overriding its category's, and the category it is in."""
    moved = f" category={body.category}" if body.category is not None else ""
    request.state.audit_target = f"node {name}: {_change(body)}{moved}"
    with tx(ctx) as db:
        node = inventory.get_node(db, name)
        if body.category is not None:
            categories.move_node(db, ctx.clock, node, body.category or None)
        resolved = categories.update_node_settings(db, node, set_=body.set_, unset=body.unset)
        return NodeSettingsOut(node=node.name, category=node.category, settings=_settings(db, resolved, node.category))


def _change(body: SettingsPatch) -> str:
    """What the audit log keeps of a change: the keys set, with their values, and the keys unset."""
    parts = [f"{k}={v}" for k, v in body.set_.items()] + [f"-{k}" for k in body.unset]
    return " ".join(parts)[:400] or "(no settings)"
