"""Nodes' BMCs and power actions over many nodes.

A power request is planned in the request's transaction (`plan`): the hostlist is resolved, every node
must exist and have a BMC, and off, cycle and reset are refused for nodes that run jobs unless forced,
all or nothing. The plan then runs as a task (`run`): each node on a worker thread, at most `limit` at
once, power-ons spaced by `stagger_s` so a rack's power supplies never see every node's inrush at the
same instant. A BMC accepts an action long before the node's power changes (the Redfish emulator's
fake driver takes 1 to 11 s, real servers often more), so each node's action is confirmed by polling
its power state until it is what was wanted or `confirm_timeout_s` has passed. Each node's result is
recorded in the task and its last read state on its `bmcs` row. Functions taking a session never commit.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.core import hostlist
from gpufleet.core.clock import Clock, to_datetime
from gpufleet.core.config import Settings
from gpufleet.core.credentials import CredentialBox
from gpufleet.core.db import transaction
from gpufleet.core.errors import Conflict, InvalidInput, NotFound
from gpufleet.inventory import service as inventory
from gpufleet.inventory.models import Node
from gpufleet.jobs import queries as job_queries
from gpufleet.jobs.models import JobState
from gpufleet.power import redfish
from gpufleet.power.ipmi import DEFAULT_CIPHER_SUITE, IpmiClient
from gpufleet.power.models import Bmc
from gpufleet.power.ports import PROTOCOLS, BmcClient, BmcError, BmcTarget, PowerState
from gpufleet.power.redfish import RedfishClient
from gpufleet.power.schemas import BmcOut, NodePowerOut, PowerAction, PowerPlanOut
from gpufleet.tasks import service as tasks
from gpufleet.tasks.models import Task
from gpufleet.tasks.runner import TargetResult, TaskContext

Connect = Callable[[BmcTarget], BmcClient]
Sleep = Callable[[float], None]

# What each action leaves the node in; which actions take running jobs down; which bring power back.
WANTED = {
    PowerAction.ON: PowerState.ON,
    PowerAction.OFF: PowerState.OFF,
    PowerAction.CYCLE: PowerState.ON,
    PowerAction.RESET: PowerState.ON,
}
DISRUPTIVE = frozenset({PowerAction.OFF, PowerAction.CYCLE, PowerAction.RESET})
STAGGERED = frozenset({PowerAction.ON, PowerAction.CYCLE})
MAX_ERROR = 512
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*")


@dataclass(frozen=True)
class PowerSettings:
    fanout: int = 16
    stagger_s: float = 0.5
    confirm_timeout_s: float = 60.0
    bmc_timeout_s: float = 10.0
    poll_s: float = 1.0
    ipmi_cipher_suite: int = DEFAULT_CIPHER_SUITE


def power_settings(settings: Settings) -> PowerSettings:
    return PowerSettings(
        fanout=settings.power_fanout,
        stagger_s=settings.power_stagger_s,
        confirm_timeout_s=settings.power_confirm_timeout_s,
        bmc_timeout_s=settings.bmc_timeout_s,
        ipmi_cipher_suite=settings.ipmi_cipher_suite,
    )


# BMCs: set, remove, read
# What a person gives for a BMC is what a client needs to reach it: one shape for both.
BmcSpec = BmcTarget


def redact_address(address: str) -> str:
    """`address` without credentials in it (`https://admin:pw@h` -> `https://***@h`, `u@h` -> `***@h`).

    Such an address is refused (`_check`), but the refusal and the audit record must not repeat the
    password, so whatever shows a submitted address shows it through here.
    """
    scheme, sep, rest = address.partition("://")
    if not (sep and _SCHEME.fullmatch(scheme)):
        scheme, sep, rest = "", "", address
    if "@" not in rest:
        return address
    return f"{scheme}{sep}***@{rest.rsplit('@', 1)[1]}"  # the last @: a password may hold one


def _check(spec: BmcSpec) -> BmcSpec:
    """The spec, normalised. Raises InvalidInput for a protocol, address or port that cannot work.

    An address holding a user name or password (`https://admin:pw@host`, `admin@host`) is refused: it
    would be stored and shown in the clear (the address is no secret), and the credentials have fields
    of their own, whose password is sealed.
    """
    if spec.protocol not in PROTOCOLS:
        raise InvalidInput(f"protocol must be one of {', '.join(PROTOCOLS)}")
    address = spec.address.strip()
    shown = redact_address(address)[:80]
    if "@" in address:
        raise InvalidInput(
            f"a BMC address holds no user name or password ({shown!r}): "
            "give them with --username and --password-stdin (API: the username and password fields)"
        )
    if not address or any(c.isspace() for c in address) or address.startswith("-"):
        raise InvalidInput(f"{shown!r} is not a BMC address")
    if not spec.username or not spec.password:
        raise InvalidInput("a BMC needs a username and a password")
    if spec.protocol == "redfish":
        url = urlsplit(redfish.base_url(address))
        if url.scheme not in ("http", "https") or not url.hostname or url.path not in ("", "/") or url.query:
            raise InvalidInput(f"a Redfish address is the BMC's base URL, e.g. https://10.140.0.12, not {shown!r}")
        if spec.port is not None:
            raise InvalidInput("a Redfish BMC's port belongs in its URL (https://host:8443)")
        address = redfish.base_url(address)
    else:
        if "://" in address or "/" in address:
            raise InvalidInput(f"an IPMI address is a host name or IP address, not {shown!r}")
        if spec.system_id is not None:
            raise InvalidInput("a system id is for Redfish BMCs only")
    if spec.system_id is not None and ("/" in spec.system_id or not spec.system_id.strip()):
        raise InvalidInput(f"{spec.system_id!r} is not a Redfish system id")
    return BmcSpec(spec.protocol, address, spec.username, spec.password, spec.port, spec.system_id, spec.verify_tls)


def set_bmc(session: Session, clock: Clock, box: CredentialBox, node_name: str, spec: BmcSpec) -> Bmc:
    """Set (or replace) a node's BMC. The password is stored sealed. Raises NotFound, InvalidInput."""
    node = inventory.get_node(session, node_name)
    spec = _check(spec)
    bmc = session.scalar(select(Bmc).where(Bmc.node_id == node.id))
    if bmc is None:
        bmc = Bmc(node_id=node.id)
        session.add(bmc)
    elif (bmc.protocol, bmc.address, bmc.port, bmc.system_id) != (
        spec.protocol,
        spec.address,
        spec.port,
        spec.system_id,
    ):
        bmc.power_state, bmc.power_read_at, bmc.last_error = None, None, None  # another BMC: its state is unknown
    bmc.protocol = spec.protocol
    bmc.address = spec.address
    bmc.port = spec.port
    bmc.system_id = spec.system_id
    bmc.verify_tls = spec.verify_tls
    bmc.username = spec.username
    bmc.password_sealed = box.seal(spec.password)
    bmc.updated_at = to_datetime(clock.now())
    session.flush()
    return bmc


def get_bmc(session: Session, node_name: str) -> tuple[Node, Bmc]:
    """A node and its BMC. Raises NotFound for an unknown node or one without a BMC."""
    node = inventory.get_node(session, node_name)
    bmc = session.scalar(select(Bmc).where(Bmc.node_id == node.id))
    if bmc is None:
        raise NotFound(f"node {node_name} has no BMC (gpufleet bmc set {node_name} ...)")
    return node, bmc


def remove_bmc(session: Session, node_name: str) -> None:
    """Forget a node's BMC and its credentials. Raises NotFound."""
    _, bmc = get_bmc(session, node_name)
    session.delete(bmc)
    session.flush()


def bmc_out(node: Node, bmc: Bmc) -> BmcOut:
    return BmcOut(
        node=node.name,
        protocol=bmc.protocol,
        address=bmc.address,
        port=bmc.port,
        system_id=bmc.system_id,
        verify_tls=bmc.verify_tls,
        username=bmc.username,
        updated_at=bmc.updated_at,
        power_state=bmc.power_state,
        power_read_at=bmc.power_read_at,
        last_error=bmc.last_error,
    )


def target(bmc: Bmc, box: CredentialBox) -> BmcTarget:
    """How to reach the BMC, password unsealed. Raises Conflict if this head's key cannot open it."""
    return BmcTarget(
        protocol=bmc.protocol,
        address=bmc.address,
        username=bmc.username,
        password=box.open(bmc.password_sealed),
        port=bmc.port,
        system_id=bmc.system_id,
        verify_tls=bmc.verify_tls,
    )


def _nodes_and_bmcs(session: Session, names: Sequence[str]) -> list[tuple[Node, Bmc | None]]:
    found: dict[str, tuple[Node, Bmc | None]] = {}
    for start in range(0, len(names), 500):
        chunk = names[start : start + 500]
        query = select(Node, Bmc).outerjoin(Bmc, Bmc.node_id == Node.id).where(Node.name.in_(chunk))
        found.update({node.name: (node, bmc) for node, bmc in session.execute(query)})
    return [found[n] for n in names if n in found]


def power_states(session: Session, node_ids: Sequence[int]) -> dict[int, str | None]:
    """The power state each of `node_ids`' BMC reported last, by node id; a node without a BMC is absent."""
    wanted = set(node_ids)
    query = select(Bmc.node_id, Bmc.power_state)
    if len(wanted) <= 500:  # a page or one node: ask for those; a whole fleet: read the (small) table
        query = query.where(Bmc.node_id.in_(wanted))
    return {node_id: state for node_id, state in session.execute(query) if node_id in wanted}


def power_table(session: Session, expressions: list[str] | None = None) -> list[NodePowerOut]:
    """Every node (or those named) with its BMC's protocol and the power state last read, by name."""
    if expressions:
        names = inventory.expand_names(expressions)
        rows = sorted(_nodes_and_bmcs(session, names), key=lambda r: r[0].name)
    else:
        query = select(Node, Bmc).outerjoin(Bmc, Bmc.node_id == Node.id).order_by(Node.name)
        rows = list(session.execute(query))
    return [
        NodePowerOut(
            node=node.name,
            node_state=node.state.value,
            bmc=bmc.protocol if bmc else None,
            address=bmc.address if bmc else None,
            power_state=bmc.power_state if bmc else None,
            power_read_at=bmc.power_read_at if bmc else None,
            last_error=bmc.last_error if bmc else None,
        )
        for node, bmc in rows
    ]


# Planning a bulk action
def running_jobs(session: Session, names: Sequence[str]) -> dict[str, list[int]]:
    """The running jobs (built-in or Slurm) holding each of `names`: node -> job ids."""
    wanted = set(names)
    busy: dict[str, list[int]] = {}
    jobs = job_queries.list_jobs(session, states=(JobState.RUNNING,), limit=job_queries.MAX_LIST)
    for job in sorted(jobs, key=lambda j: j.id):
        for node in (job.allocation or {}).keys() & wanted:
            busy.setdefault(node, []).append(job.id)
    return busy


@dataclass
class PowerPlan:
    action: PowerAction
    nodes: list[str]  # in hostlist order
    targets: dict[str, BmcTarget] = field(repr=False)
    limit: int
    stagger_s: float
    forced: dict[str, list[int]]  # nodes acted on despite running jobs

    def out(self, settings: PowerSettings) -> PowerPlanOut:
        return PowerPlanOut(
            action=self.action,
            nodes=self.nodes,
            hostlist=hostlist.collect(self.nodes),
            limit=self.limit,
            stagger_s=self.stagger_s,
            forced=self.forced,
            steps=[f"{n}: {describe(self.targets[n], self.action, settings)}" for n in self.nodes],
        )

    def params(self) -> dict[str, Any]:
        """What the task records of the request (never a credential)."""
        return {
            "action": self.action.value,
            "nodes": hostlist.collect(self.nodes),
            "limit": self.limit,
            "stagger_s": self.stagger_s,
            "forced": self.forced,
        }


def plan(
    session: Session,
    box: CredentialBox,
    settings: PowerSettings,
    action: PowerAction,
    expressions: list[str],
    *,
    force: bool = False,
    limit: int | None = None,
    stagger_s: float | None = None,
) -> PowerPlan:
    """What a power request will do, all or nothing.

    Raises InvalidInput for a bad hostlist, NotFound for unknown nodes, Conflict for nodes without a BMC
    or (off, cycle, reset without `force`) nodes that run jobs.
    """
    names = inventory.expand_names(expressions)
    rows = _nodes_and_bmcs(session, names)
    if len(rows) != len(names):
        known = {node.name for node, _ in rows}
        raise NotFound(f"no such node: {hostlist.collect([n for n in names if n not in known])}")
    missing = [node.name for node, bmc in rows if bmc is None]
    if missing:
        raise Conflict(f"no BMC set for {hostlist.collect(missing)} (gpufleet bmc set NODE ...)")
    forced: dict[str, list[int]] = {}
    if action in DISRUPTIVE:
        busy = running_jobs(session, names)
        if busy and not force:
            jobs = sorted({j for ids in busy.values() for j in ids})
            shown = ", ".join(str(j) for j in jobs[:10]) + (", ..." if len(jobs) > 10 else "")
            raise Conflict(
                f"{hostlist.collect(sorted(busy))} run jobs ({shown}): drain them and wait, "
                f"or power {action.value} with --force"
            )
        forced = {n: busy[n] for n in names if n in busy}
    targets = {node.name: target(bmc, box) for node, bmc in rows if bmc is not None}
    return PowerPlan(
        action=action,
        nodes=names,
        targets=targets,
        limit=limit or settings.fanout,
        stagger_s=(settings.stagger_s if stagger_s is None else stagger_s) if action in STAGGERED else 0.0,
        forced=forced,
    )


def describe(t: BmcTarget, action: PowerAction, settings: PowerSettings) -> str:
    """What would be sent to a BMC, for --dry-run (no password: it is never on a command line)."""
    if t.protocol == "ipmi":
        verb = "status" if action is PowerAction.STATUS else action.value
        client = IpmiClient(t, timeout_s=settings.bmc_timeout_s, cipher_suite=settings.ipmi_cipher_suite)
        return " ".join(client.argv("chassis", "power", verb)) + "  (password from IPMI_PASSWORD)"
    system = f"{redfish.SYSTEMS}/{t.system_id}" if t.system_id else f"{redfish.SYSTEMS}/<its only system>"
    if action is PowerAction.STATUS:
        return f"GET {t.address}{system} (PowerState)"
    choices = {
        PowerAction.ON: redfish.ON,
        PowerAction.OFF: redfish.OFF,
        PowerAction.CYCLE: redfish.CYCLE,
        PowerAction.RESET: redfish.RESET,
    }[action]
    return (
        f"POST {t.address}{system}/Actions/ComputerSystem.Reset ResetType={choices[0]}"
        f" (else {', '.join(choices[1:])}, as the BMC allows), then poll PowerState"
    )


# Acting on one node
@dataclass(frozen=True)
class Outcome:
    ok: bool
    state: PowerState
    detail: str
    seconds: float
    confirmed: bool = True  # False: the BMC took the request, but its power state never showed it


def act(
    client: BmcClient,
    action: PowerAction,
    *,
    clock: Clock,
    confirm_timeout_s: float,
    poll_s: float = 1.0,
    sleep: Sleep = time.sleep,
) -> Outcome:
    """Do `action` on one BMC and wait until its power state shows it done, or the timeout passes.

    A node already in the wanted state is left alone (on, off); cycle and reset of a node that is off
    power it on, as IPMI does nothing for them then. A cycle or reset of a node that is on ends where it
    began, so reading "on" proves nothing until the state was seen to leave "on" (off, or a state the
    BMC does not name). Many BMCs never show that for a warm reset (a ForceRestart keeps the power on):
    one whose state never changed by the deadline is reported ok but unconfirmed, saying so, rather
    than failed (the BMC accepted the request) or confirmed (nothing showed it). Raises BmcError when
    the BMC fails.
    """
    started = clock.now()
    before = client.power_state()
    if action is PowerAction.STATUS:
        return Outcome(True, before, before.value, 0.0)
    wanted = WANTED[action]
    if action in (PowerAction.ON, PowerAction.OFF) and before is wanted:
        return Outcome(True, before, f"already {wanted.value}", 0.0)
    round_trip = False  # a cycle or reset of a node that is on: it must be seen to leave "on" first
    if action is PowerAction.ON or (action in (PowerAction.CYCLE, PowerAction.RESET) and before is PowerState.OFF):
        client.power_on()
        did = "powered on" if action is PowerAction.ON else f"was off: powered on instead of {action.value}"
    elif action is PowerAction.OFF:
        client.power_off()
        did = "powered off"
    elif action is PowerAction.CYCLE:
        client.power_cycle()
        did, sent, round_trip = "power cycled", "power cycle sent", before is wanted
    else:
        client.reset()
        did, sent, round_trip = "reset", "reset sent", before is wanted
    left: PowerState | None = None  # the first state other than `wanted` seen on a round trip
    deadline = started + confirm_timeout_s
    while True:
        state = client.power_state()
        elapsed = clock.now() - started
        if round_trip and left is None and state is not wanted:
            left = state
        if state is wanted and (not round_trip or left is not None):
            how = f"{left.value}, then {state.value}" if left is not None else state.value
            return Outcome(True, state, f"{did}: {how} after {elapsed:.1f} s", elapsed)
        if clock.now() >= deadline:
            if round_trip and left is None:
                return Outcome(
                    True,
                    state,
                    f"{sent}; the BMC reported no transition ({state.value} throughout {confirm_timeout_s:g} s)",
                    elapsed,
                    confirmed=False,
                )
            return Outcome(False, state, f"{did}, but still {state.value} after {confirm_timeout_s:g} s", elapsed)
        sleep(min(poll_s, max(0.0, deadline - clock.now())))


def record(session: Session, clock: Clock, node: str, state: PowerState | None, error: str | None) -> None:
    """Keep what a BMC said last: its state when read, else the error (the old state stays, dated)."""
    bmc = session.scalar(select(Bmc).join(Node, Node.id == Bmc.node_id).where(Node.name == node))
    if bmc is None:
        return  # removed while the action ran
    if state is not None:
        bmc.power_state = state.value
        bmc.power_read_at = to_datetime(clock.now())
    bmc.last_error = error[:MAX_ERROR] if error else None


# Running a plan as a task
def connector(settings: PowerSettings) -> Connect:
    """The real BMC clients, by protocol."""

    def connect(t: BmcTarget) -> BmcClient:
        if t.protocol == "redfish":
            return RedfishClient(t, timeout_s=settings.bmc_timeout_s)
        if t.protocol == "ipmi":
            return IpmiClient(t, timeout_s=settings.bmc_timeout_s, cipher_suite=settings.ipmi_cipher_suite)
        raise BmcError(f"unknown BMC protocol {t.protocol!r}")

    return connect


def run(
    task: TaskContext,
    power_plan: PowerPlan,
    *,
    sessions: sessionmaker[Session],
    clock: Clock,
    settings: PowerSettings,
    connect: Connect,
    sleep: Sleep = time.sleep,
) -> str:
    """The task's work: every node of the plan, fanned out. Returns the task's summary."""
    states: dict[str, str] = {}

    def one(node: str) -> TargetResult:
        client: BmcClient | None = None
        try:
            client = connect(power_plan.targets[node])
            outcome = act(
                client,
                power_plan.action,
                clock=clock,
                confirm_timeout_s=settings.confirm_timeout_s,
                poll_s=settings.poll_s,
                sleep=sleep,
            )
        except BmcError as exc:
            with transaction(sessions) as session:
                record(session, clock, node, None, str(exc))
            states[node] = "failed"
            return TargetResult(False, str(exc))
        finally:
            close = getattr(client, "close", None)  # the real clients hold a connection pool
            if callable(close):
                close()
        with transaction(sessions) as session:
            record(session, clock, node, outcome.state, None if outcome.ok else outcome.detail)
        if not outcome.ok:
            states[node] = "failed"
        else:
            states[node] = outcome.state.value if outcome.confirmed else "unconfirmed"
        data: dict[str, Any] = {"power_state": outcome.state.value, "seconds": round(outcome.seconds, 1)}
        if not outcome.confirmed:
            data["confirmed"] = False
        return TargetResult(outcome.ok, outcome.detail, data)

    task.fan_out(power_plan.nodes, one, limit=power_plan.limit, stagger_s=power_plan.stagger_s)
    counts: dict[str, int] = {}
    for node in power_plan.nodes:  # a node whose work raised something else failed too (fan_out says why)
        value = states.get(node, "failed")
        counts[value] = counts.get(value, 0) + 1
    tally = ", ".join(f"{n} {s}" for s, n in sorted(counts.items(), key=lambda kv: (kv[0] == "failed", kv[0])))
    return f"power {power_plan.action.value} {hostlist.collect(power_plan.nodes)}: {tally or 'nothing done'}"


def create_task(
    session: Session, clock: Clock, power_plan: PowerPlan, actor: str, params: dict[str, Any] | None = None
) -> Task:
    """The task of a planned power action, one target per node (`params` are added to the plan's own: a
    campaign names itself). The caller commits, then starts `work`."""
    return tasks.create(
        session,
        clock,
        kind=f"power.{power_plan.action.value}",
        targets=power_plan.nodes,
        params=power_plan.params() | (params or {}),
        created_by=actor,
    )


def work(
    power_plan: PowerPlan,
    *,
    sessions: sessionmaker[Session],
    clock: Clock,
    settings: PowerSettings,
    connect: Connect,
) -> Callable[[TaskContext], str]:
    """The work of a task `create_task` recorded: `run` over the plan."""

    def run_plan(task_ctx: TaskContext) -> str:
        return run(task_ctx, power_plan, sessions=sessions, clock=clock, settings=settings, connect=connect)

    return run_plan
