"""Log records at the head, on SQLite and PostgreSQL: filters, full-text search, retention."""

from __future__ import annotations

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.core.clock import FakeClock
from gpufleet.core.db import transaction
from gpufleet.inventory import service as inventory
from gpufleet.inventory.schemas import NodeSettings
from gpufleet.logs import store
from gpufleet.logs.models import LogTemplate

T0 = 1_800_000_000.0
XID79 = "NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."


def row(node_id: int, ts: float, line: str, **event: object) -> dict[str, object]:
    return {"node_id": node_id, "ts": ts, "source": "/dev/kmsg", "line": line} | event


@pytest.fixture
def logged(sessions: sessionmaker[Session], clock: FakeClock) -> sessionmaker[Session]:
    with transaction(sessions) as s:
        n1, n2 = (n.id for n in inventory.add_nodes(s, clock, ["n1", "n2"], NodeSettings()))
        store.write_records(
            s,
            [
                row(n1, T0, "IPv6: ADDRCONF(NETDEV_CHANGE): eth0: link becomes ready"),
                row(n1, T0 + 1, XID79, kind="xid", code=79, severity="critical", action="reboot", gpu=3),
                row(
                    n2,
                    T0 + 2,
                    "NVRM: Xid (PCI:0000:cb:00): 13, Graphics Exception",
                    kind="xid",
                    code=13,
                    severity="warning",
                    action="warn",
                ),
                row(
                    n2,
                    T0 + 3,
                    "mlx5_core 0000:01:00.0: Port module event: module 0, Cable plugged",
                    kind="nic",
                    severity="info",
                    action="ignore",
                ),
            ],
        )
    return sessions


def found(sessions: sessionmaker[Session], **filters: object) -> list[tuple[str, float]]:
    with transaction(sessions, readonly=True) as s:
        return [(f.node, f.record.ts - T0) for f in store.search(s, **filters)]  # type: ignore[arg-type]


def test_filters_by_node_time_severity_and_kind(logged: sessionmaker[Session]) -> None:
    assert found(logged) == [("n2", 3), ("n2", 2), ("n1", 1), ("n1", 0)]  # newest first
    assert found(logged, node="n1") == [("n1", 1), ("n1", 0)]
    assert found(logged, since=T0 + 1, until=T0 + 3) == [("n2", 2), ("n1", 1)]
    assert found(logged, min_severity="warning") == [("n2", 2), ("n1", 1)]
    assert found(logged, kind="nic") == [("n2", 3)]
    assert found(logged, events_only=True) == [("n2", 3), ("n2", 2), ("n1", 1)]
    assert found(logged, limit=1) == [("n2", 3)]
    with pytest.raises(ValueError, match="severity must be one of info, warning, critical"):
        found(logged, min_severity="loud")


def test_text_search_uses_the_full_text_index_and_treats_syntax_as_words(logged: sessionmaker[Session]) -> None:
    assert found(logged, text_query="fallen bus") == [("n1", 1)]  # every word, in any order
    assert found(logged, text_query="Xid") == [("n2", 2), ("n1", 1)]
    assert found(logged, text_query="cable", node="n1") == []
    assert found(logged, text_query='"unbalanced NEAR( * OR') == []  # no syntax error: only words
    assert found(logged, text_query="   ") == found(logged)


def test_retention_prunes_old_records_and_their_index(logged: sessionmaker[Session]) -> None:
    with transaction(logged) as s:
        store.prune(s, before=T0 + 2)
    assert found(logged) == [("n2", 3), ("n2", 2)]
    assert found(logged, text_query="fallen") == []


def test_retention_prunes_templates_not_seen_since(logged: sessionmaker[Session]) -> None:
    with transaction(logged) as s:
        for template_id, last_seen in ((1, T0), (2, T0 + 5)):
            s.add(
                LogTemplate(
                    category="",
                    template_id=template_id,
                    template=f"t{template_id}",
                    first_seen=T0,
                    first_node_id=None,
                    last_seen=last_seen,
                    count=1,
                    learned=True,
                )
            )
    with transaction(logged) as s:
        store.prune(s, before=T0 + 2)
    with transaction(logged, readonly=True) as s:
        assert [t.template_id for t in s.scalars(select(LogTemplate))] == [2]
