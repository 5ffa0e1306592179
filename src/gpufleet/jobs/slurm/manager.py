"""`SlurmWorkloadManager`: gpufleet's drain and resume carried out in Slurm, with the node row kept in step.

Which drains gpufleet may undo (the rule of `jobs.ports`, applied to what Slurm says, not to our row):

- Slurm's reason starts with `OWN_DRAIN_PREFIX` ("gpufleet:"): gpufleet's own drain; anyone may resume it.
- Slurm's reason is exactly the reason recorded on the node row by a drain made through gpufleet
  (`drained_by` not "slurm:..."), and the caller is a person (not `automatic_actor`): a person drained
  the node through gpufleet and a person resumes it.
- Anything else was set in Slurm by someone else (`scontrol update ... state=drain` by an admin, another
  tool): `resume` raises `ForeignDrain` (a `Conflict`, HTTP 409) naming the reason, who set it and when,
  and changes nothing. It is never resumed by gpufleet, whoever asks: resume it in Slurm.

`drain` by the automatic actor (the health judge) never overwrites a drain already set in Slurm by
someone else: it records that drain on the row (so gpufleet's scheduler view agrees and the judge will not
resume it) and leaves Slurm alone. A person draining through gpufleet does overwrite the reason: the drain
becomes theirs.

Slurm's node names are gpufleet's node names.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from gpufleet.core.clock import Clock, to_datetime
from gpufleet.core.errors import Conflict, InvalidInput, NotFound
from gpufleet.inventory.models import Node
from gpufleet.jobs.ports import OWN_DRAIN_PREFIX
from gpufleet.jobs.slurm.commands import SlurmCommands
from gpufleet.jobs.slurm.nodes import SINFO_JSON, SINFO_TEXT, SlurmNode, parse_sinfo_json, parse_sinfo_text

# The actor the health judge drains and resumes as (monitoring.health.GPUFLEET_ACTOR; jobs may not import it).
AUTOMATIC_ACTOR = "gpufleet"
REASON_MAX = 512
# drained_by on the row for a drain found in Slurm, set there by someone else: "slurm:<user>".
FOREIGN_ACTOR_PREFIX = "slurm:"  # the node row's drain_reason column


class ForeignDrain(Conflict):
    """The node is drained (or down) in Slurm by someone other than gpufleet; gpufleet will not resume it."""

    def __init__(self, node: SlurmNode) -> None:
        who = f" by {node.reason_user}" if node.reason_user else ""
        when = f" at {node.reason_at.isoformat()}" if node.reason_at else ""
        super().__init__(
            f"node {node.name} is {node.display_state} in Slurm{who}{when} with reason {node.reason or ''!r}, "
            f"not gpufleet's ({OWN_DRAIN_PREFIX!r}): gpufleet never resumes it; resume it in Slurm "
            f"(scontrol update nodename={node.name} state=resume)"
        )
        self.node = node


def _one_line(reason: str) -> str:
    return " ".join(reason.split())[:REASON_MAX]


class SlurmWorkloadManager:
    """The `WorkloadManager` over a real Slurm, through its client programs (`SlurmCommands`)."""

    name = "slurm"

    def __init__(
        self,
        commands: SlurmCommands,
        clock: Clock,
        *,
        json_output: bool | None = None,
        automatic_actor: str = AUTOMATIC_ACTOR,
    ) -> None:
        """`json_output`: True for `sinfo --json`, False for sinfo's text, None to try JSON once and fall
        back to text if this Slurm refuses `--json` (before 21.08)."""
        self.commands = commands
        self.clock = clock
        self.json_output = json_output
        self.automatic_actor = automatic_actor
        # Counts drains and resumes made through gpufleet: the sync's mirror of Slurm's drains skips a
        # pass during which this changed, lest a read taken before the change undo it.
        self.changes = 0

    def node_states(self) -> list[SlurmNode]:
        """Every Slurm node's state, flags and reason. Raises Unavailable if Slurm cannot be reached."""
        if self.json_output is not False:
            try:
                nodes = parse_sinfo_json(self.commands.run(list(SINFO_JSON)))
            except InvalidInput:
                if self.json_output:
                    raise
                self.json_output = False  # this Slurm has no --json (or it printed something else)
            else:
                self.json_output = True
                return nodes
        return parse_sinfo_text(self.commands.run(list(SINFO_TEXT)))

    def node_state(self, name: str) -> SlurmNode:
        """One node's Slurm state. Raises NotFound if Slurm has no such node, Unavailable if unreachable."""
        for node in self.node_states():
            if node.name == name:
                return node
        raise NotFound(f"Slurm has no node {name}")

    def may_resume(self, slurm: SlurmNode, node: Node, actor: str) -> bool:
        """Whether gpufleet may undo the drain Slurm holds on `slurm` (see the module's rule)."""
        if slurm.own_drain:
            return True
        made_here = node.drained_by is not None and not node.drained_by.startswith(FOREIGN_ACTOR_PREFIX)
        return (
            actor != self.automatic_actor
            and made_here
            and slurm.reason is not None
            and slurm.reason == node.drain_reason
        )

    def drain(self, session: Session, node: Node, reason: str, actor: str) -> None:
        """Drain `node` in Slurm with `reason` (gpufleet's own drains start with OWN_DRAIN_PREFIX) and record
        it on the row. Raises InvalidInput for an empty reason or a node Slurm does not know, NotFound if
        absent from sinfo, Unavailable if Slurm cannot be reached."""
        reason = _one_line(reason)
        if not reason:
            raise InvalidInput("a drain needs a reason")
        if actor == self.automatic_actor:
            current = self.node_state(node.name)
            if (current.drain or current.state == "down") and current.reason and not current.own_drain:
                # Someone else's drain: keep it theirs (Slurm untouched), and let the row say so.
                self._record(session, node, current.reason, f"{FOREIGN_ACTOR_PREFIX}{current.reason_user or 'unknown'}")
                return
        self.changes += 1
        self.commands.run(["scontrol", "update", f"nodename={node.name}", "state=drain", f"reason={reason}"])
        self._record(session, node, reason, actor)

    def resume(self, session: Session, node: Node, actor: str) -> None:
        """Let work land on `node` again in Slurm and clear the row's drain.

        Raises ForeignDrain (Conflict) when Slurm's drain is not one gpufleet may undo (nothing changes),
        NotFound if Slurm has no such node, Unavailable if Slurm cannot be reached.
        """
        current = self.node_state(node.name)
        if current.drain or current.state == "down":
            if not self.may_resume(current, node, actor):
                raise ForeignDrain(current)
            self.changes += 1
            self.commands.run(["scontrol", "update", f"nodename={node.name}", "state=resume"])
        node.drained_at = None
        node.drain_reason = None
        node.drained_by = None
        session.flush()

    def _record(self, session: Session, node: Node, reason: str, actor: str) -> None:
        node.drained_at = to_datetime(self.clock.now())
        node.drain_reason = reason
        node.drained_by = actor[:128]
        session.flush()
