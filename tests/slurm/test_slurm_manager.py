"""SlurmWorkloadManager against a scripted Slurm (outputs captured from Slurm 22.05.8): which scontrol
calls it makes, the node row kept in step, and a drain set by someone else never resumed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.core.clock import FakeClock
from gpufleet.core.db import transaction
from gpufleet.core.errors import Conflict, Unavailable
from gpufleet.inventory import service as inventory
from gpufleet.inventory.models import Node
from gpufleet.inventory.schemas import NodeSettings
from gpufleet.jobs import service as jobs
from gpufleet.jobs.slurm.commands import Completed, SlurmCommands
from gpufleet.jobs.slurm.manager import ForeignDrain, SlurmWorkloadManager
from tests.conftest import FIXTURES

SLURM = FIXTURES / "slurm"


class ScriptedSlurm:
    """sinfo answers with the captured output of `state`; scontrol succeeds; every argv is recorded."""

    def __init__(self, state: str = "idle", *, json_ok: bool = True) -> None:
        self.state = state
        self.json_ok = json_ok
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str], *, env: Mapping[str, str], timeout_s: float) -> Completed:
        self.calls.append(list(argv))
        if argv[:2] == ["sinfo", "--json"]:
            if not self.json_ok:
                return Completed(tuple(argv), 1, "", "sinfo: unrecognized option '--json'\n")
            return Completed(tuple(argv), 0, (SLURM / f"sinfo-json-{self.state}.json").read_text(), "")
        if argv[0] == "sinfo":
            return Completed(tuple(argv), 0, (SLURM / f"sinfo-O-{self.state}.txt").read_text(), "")
        return Completed(tuple(argv), 0, "", "")

    @property
    def updates(self) -> list[list[str]]:
        return [c for c in self.calls if c[0] == "scontrol"]


def setup(
    sessions: sessionmaker[Session], clock: FakeClock, state: str = "idle"
) -> tuple[ScriptedSlurm, SlurmWorkloadManager]:
    with transaction(sessions) as s:
        inventory.add_nodes(s, clock, ["vm"], NodeSettings())
    slurm = ScriptedSlurm(state)
    return slurm, SlurmWorkloadManager(SlurmCommands("/x/slurm.conf", runner=slurm), clock)


def node(s: Session) -> Node:
    return inventory.get_node(s, "vm")


def test_automatic_drain_and_resume(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    slurm, manager = setup(sessions, clock)
    with transaction(sessions) as s:
        manager.drain(s, node(s), "gpufleet: xid 79 on GPU 2", "gpufleet")
    assert slurm.updates == [["scontrol", "update", "nodename=vm", "state=drain", "reason=gpufleet: xid 79 on GPU 2"]]
    with transaction(sessions) as s:
        row = node(s)
        assert (row.drain_reason, row.drained_by) == ("gpufleet: xid 79 on GPU 2", "gpufleet")
        assert row.drained_at is not None
    slurm.state = "drained-gpufleet"
    with transaction(sessions) as s:
        manager.resume(s, node(s), "gpufleet")
    assert slurm.updates[-1] == ["scontrol", "update", "nodename=vm", "state=resume"]
    with transaction(sessions) as s:
        assert (node(s).drained_at, node(s).drain_reason, node(s).drained_by) == (None, None, None)


@pytest.mark.parametrize("actor", ["gpufleet", "user:alice"])
def test_a_drain_set_in_slurm_by_someone_else_is_never_resumed(
    sessions: sessionmaker[Session], clock: FakeClock, actor: str
) -> None:
    slurm, manager = setup(sessions, clock)
    with transaction(sessions) as s:
        manager.drain(s, node(s), "gpufleet: xid 79", "gpufleet")  # the row says gpufleet's...
    slurm.state = "drained-human"  # ...but then an admin drained it again in Slurm, with their reason
    with pytest.raises(ForeignDrain) as caught, transaction(sessions) as s:
        manager.resume(s, node(s), actor)  # ...but Slurm holds a person's drain
    assert isinstance(caught.value, Conflict)
    assert "disk replacement, ticket 4711" in str(caught.value)
    assert "by root" in str(caught.value)
    assert [c[3] for c in slurm.updates] == ["state=drain"]  # no resume reached Slurm


def test_automatic_drain_keeps_someone_elses_drain_and_records_it(
    sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    slurm, manager = setup(sessions, clock, "draining-human")
    with transaction(sessions) as s:
        manager.drain(s, node(s), "gpufleet: xid 79", "gpufleet")
    assert slurm.updates == []
    with transaction(sessions) as s:
        assert (node(s).drain_reason, node(s).drained_by) == ("disk replacement, ticket 4711", "slurm:root")
    for actor in ("gpufleet", "user:alice"):  # the row now matches Slurm, and it is still not gpufleet's
        with pytest.raises(ForeignDrain), transaction(sessions) as s:
            manager.resume(s, node(s), actor)
    assert slurm.updates == []


def test_a_persons_drain_through_gpufleet_is_resumed_by_a_person_only(
    sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    slurm, manager = setup(sessions, clock)
    with transaction(sessions) as s:
        jobs.drain(s, manager, "vm", "disk replacement, ticket 4711", "user:alice")
    assert slurm.updates == [
        ["scontrol", "update", "nodename=vm", "state=drain", "reason=disk replacement, ticket 4711"]
    ]
    slurm.state = "drained-human"  # Slurm now shows that same reason
    with pytest.raises(ForeignDrain), transaction(sessions) as s:
        manager.resume(s, node(s), "gpufleet")
    with transaction(sessions) as s:
        jobs.resume(s, manager, "vm", "user:bob")
    assert slurm.updates[-1] == ["scontrol", "update", "nodename=vm", "state=resume"]


def test_resume_of_a_node_slurm_already_let_go_only_clears_the_row(
    sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    slurm, manager = setup(sessions, clock)
    with transaction(sessions) as s:
        manager.drain(s, node(s), "gpufleet: x", "gpufleet")
    with transaction(sessions) as s:
        manager.resume(s, node(s), "gpufleet")  # Slurm says idle: nothing to undo there
    assert [c[3] for c in slurm.updates] == ["state=drain"]
    with transaction(sessions) as s:
        assert node(s).drained_at is None


def test_node_states_falls_back_to_text_without_json(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    slurm = ScriptedSlurm("drained-gpufleet", json_ok=False)
    manager = SlurmWorkloadManager(SlurmCommands(runner=slurm), clock)
    assert [(n.name, n.display_state, n.reason) for n in manager.node_states()] == [
        ("vm", "drained", "gpufleet: xid 79 on GPU 2")
    ]
    manager.node_states()
    assert [c[:2] for c in slurm.calls] == [["sinfo", "--json"], ["sinfo", "-h"], ["sinfo", "-h"]]  # JSON tried once


def test_unreachable_slurm_changes_nothing(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    _, manager = setup(sessions, clock, "unreachable")
    with pytest.raises(Unavailable), transaction(sessions) as s:
        manager.drain(s, node(s), "gpufleet: x", "gpufleet")
    with transaction(sessions) as s:
        assert node(s).drained_at is None
