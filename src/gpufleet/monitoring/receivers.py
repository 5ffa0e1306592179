"""Where alert notifications go: receivers stored with their secrets, shown without them."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpufleet.core.clock import Clock, to_datetime
from gpufleet.core.errors import Conflict, NotFound
from gpufleet.monitoring import notifiers
from gpufleet.monitoring.models import Receiver


def _shown(spec: notifiers.WebhookReceiver | notifiers.SlackReceiver | notifiers.EmailReceiver) -> dict[str, Any]:
    match spec:
        case notifiers.EmailReceiver():
            target = f"{', '.join(spec.to)} via {spec.host}:{spec.port}"
        case notifiers.SlackReceiver():
            target = notifiers.redact_url(spec.url.get_secret_value())
        case _:
            target = notifiers.redact_url(str(spec.url))
    return {"name": spec.name, "type": spec.type, "target": target}


def list_receivers(session: Session) -> list[dict[str, Any]]:
    return [_shown(notifiers.parse_receiver(r.spec)) for r in session.scalars(select(Receiver).order_by(Receiver.name))]


def add_receiver(session: Session, clock: Clock, data: dict[str, Any]) -> dict[str, Any]:
    """Raises InvalidInput for a bad spec, Conflict for a taken name."""
    spec = notifiers.parse_receiver(data)
    if session.scalar(select(Receiver.id).where(Receiver.name == spec.name)) is not None:
        raise Conflict(f"receiver already exists: {spec.name}")
    session.add(Receiver(name=spec.name, spec=notifiers.stored_receiver(spec), created_at=to_datetime(clock.now())))
    session.flush()
    return _shown(spec)


def remove_receiver(session: Session, name: str) -> None:
    receiver = session.scalar(select(Receiver).where(Receiver.name == name))
    if receiver is None:
        raise NotFound(f"no such receiver: {name}")
    session.delete(receiver)
