"""Categories: named groups of nodes whose settings the nodes inherit, defaults < category < node.

The keys, their types and defaults are defined once, in `gpufleet.protocol.settings`; this module
stores them (a category's `settings`, a node's own `settings`, each holding only the keys set there),
validates every change against that one definition, and resolves what a node ends up with and where
each value came from (`resolve`).

A node names its category by name (`nodes.category`). A node added with a category that does not
exist yet gets it made, empty (`ensure`): the category is where the node's settings come from, and
refusing the node would break every script that adds nodes to a category before configuring it. A
category that still has nodes cannot be removed.

Takes a session and a clock; never commits (the caller's transaction does).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ValidationError
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gpufleet.core.clock import Clock, to_datetime
from gpufleet.core.errors import Conflict, InvalidInput, NotFound, describe
from gpufleet.inventory.models import Category, Node
from gpufleet.protocol.settings import NAME_PATTERN, SETTINGS, NodeSettingValues

Origin = Literal["default", "category", "node"]
DESCRIPTION_MAX = 512


@dataclass(frozen=True, slots=True)
class Resolved:
    """A node's value of one setting, and the level it came from."""

    value: Any
    origin: Origin


def resolve_values(category: Mapping[str, Any] | None, node: Mapping[str, Any] | None) -> dict[str, Resolved]:
    """Every key's value and origin from a category's and a node's stored settings (pure)."""
    category = category or {}
    node = node or {}
    out = {}
    for key, definition in SETTINGS.items():
        if key in node:
            out[key] = Resolved(node[key], "node")
        elif key in category:
            out[key] = Resolved(category[key], "category")
        else:
            out[key] = Resolved(definition.default, "default")
    return out


def resolve(session: Session, node: Node) -> dict[str, Resolved]:
    """What `node` ends up with for every setting, and where each value came from."""
    row = session.scalar(select(Category).where(Category.name == node.category)) if node.category else None
    return resolve_values(row.settings if row is not None else None, node.settings)


def resolve_many(session: Session, nodes: Iterable[Node]) -> dict[str, dict[str, Resolved]]:
    """`resolve` for many nodes, by node name, in one query of the categories."""
    by_category = category_settings(session)
    return {n.name: resolve_values(by_category.get(n.category or ""), n.settings) for n in nodes}


def category_settings(session: Session) -> dict[str, dict[str, Any]]:
    """Every category's stored settings by name: what a loop resolving many nodes reads once."""
    return {name: dict(settings or {}) for name, settings in session.execute(select(Category.name, Category.settings))}


def validate(values: Mapping[str, Any]) -> dict[str, Any]:
    """Check settings to store against the registry; returns them as stored (e.g. "8" read as 8).

    Raises InvalidInput naming an unknown key (with the known ones) or the first bad value."""
    check_keys(values)
    try:
        parsed = NodeSettingValues.model_validate(dict(values))
    except ValidationError as exc:
        raise InvalidInput(f"invalid setting {describe(exc)}") from None
    return parsed.model_dump(include=set(values))


def check_keys(keys: Iterable[str]) -> None:
    """Raises InvalidInput for the first key that is not a setting."""
    for key in keys:
        if key not in SETTINGS:
            hint = ""
            if key in ("health", "health_policy"):
                hint = "; health thresholds are set per category with `gpufleet health-policy set CATEGORY`"
            raise InvalidInput(f"unknown setting {key!r} (known: {', '.join(SETTINGS)}){hint}")


def _apply(stored: Mapping[str, Any] | None, set_: Mapping[str, Any], unset: Sequence[str]) -> dict[str, Any]:
    """The stored settings after a change, validated first, so a bad key or value changes nothing."""
    check_keys(unset)
    both = set(set_) & set(unset)
    if both:
        raise InvalidInput(f"setting {sorted(both)[0]!r} is both set and unset")
    values = validate(set_)
    out = {k: v for k, v in (stored or {}).items() if k not in unset}
    out.update(values)
    return out


def check_name(name: str) -> None:
    if not re.fullmatch(NAME_PATTERN, name):
        raise InvalidInput(f"invalid category name {name!r}: use letters, digits, '.', '_' and '-' (max 63)")


def get_category(session: Session, name: str) -> Category:
    row = session.scalar(select(Category).where(Category.name == name))
    if row is None:
        raise NotFound(f"no such category: {name}")
    return row


def create_category(
    session: Session,
    clock: Clock,
    name: str,
    description: str = "",
    settings: Mapping[str, Any] | None = None,
) -> Category:
    """A new category. Raises InvalidInput (bad name, key or value) or Conflict (it exists)."""
    check_name(name)
    if len(description) > DESCRIPTION_MAX:
        raise InvalidInput(f"description is longer than {DESCRIPTION_MAX} characters")
    values = validate(settings or {})
    if session.scalar(select(Category.id).where(Category.name == name)) is not None:
        raise Conflict(f"category already exists: {name}")
    now = to_datetime(clock.now())
    row = Category(name=name, description=description, settings=values, created_at=now, updated_at=now)
    session.add(row)
    session.flush()
    return row


def ensure(session: Session, clock: Clock, name: str | None) -> None:
    """Make the category `name` (empty) if there is none: what adding a node to it does."""
    if name is None or session.scalar(select(Category.id).where(Category.name == name)) is not None:
        return
    create_category(session, clock, name, description="")


def update_category(
    session: Session,
    clock: Clock,
    name: str,
    *,
    set_: Mapping[str, Any] | None = None,
    unset: Sequence[str] = (),
    description: str | None = None,
) -> Category:
    """Set and unset a category's settings (and its description). All or nothing."""
    row = get_category(session, name)
    if description is not None and len(description) > DESCRIPTION_MAX:
        raise InvalidInput(f"description is longer than {DESCRIPTION_MAX} characters")
    row.settings = _apply(row.settings, set_ or {}, unset)  # a new dict: JSON columns see only reassignment
    if description is not None:
        row.description = description
    row.updated_at = to_datetime(clock.now())
    session.flush()
    return row


def remove_category(session: Session, name: str) -> None:
    """Delete an empty category. Raises Conflict while nodes are in it."""
    row = get_category(session, name)
    count = session.scalar(select(func.count()).select_from(Node).where(Node.category == name)) or 0
    if count:
        raise Conflict(f"category {name} still has {count} node(s); move or remove them first")
    session.delete(row)
    session.flush()


def node_counts(session: Session) -> Counter[str]:
    """Nodes per category name."""
    rows = session.execute(
        select(Node.category, func.count()).where(Node.category.is_not(None)).group_by(Node.category)
    )
    return Counter({str(name): int(count) for name, count in rows})


def node_names(session: Session, category: str) -> list[str]:
    """The nodes in a category, by name."""
    return list(session.scalars(select(Node.name).where(Node.category == category).order_by(Node.name)))


def list_categories(session: Session) -> list[Category]:
    return list(session.scalars(select(Category).order_by(Category.name)))


def update_node_settings(
    session: Session, node: Node, *, set_: Mapping[str, Any] | None = None, unset: Sequence[str] = ()
) -> dict[str, Resolved]:
    """Set and unset a node's own values (overriding its category's). All or nothing; returns the
    node's resolved settings after the change."""
    node.settings = _apply(node.settings, set_ or {}, unset)
    session.flush()
    return resolve(session, node)


def move_node(session: Session, clock: Clock, node: Node, category: str | None) -> None:
    """Put a node in another category (made if missing), or in none."""
    if category is not None:
        check_name(category)
        ensure(session, clock, category)
    node.category = category
    session.flush()
