"""The agent's main loop: join once, then keep the channel to the head open, reconnecting with backoff.

A stored credential the head refuses (one from another head, or revoked) is replaced by joining again
when the agent has a join token; without one the agent stops and says so."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from pydantic import ValidationError
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI

from gpufleet.agent.accounts import AccountSync, SyncReport
from gpufleet.agent.checks.ports import CheckSource
from gpufleet.agent.credentials import Credential, CredentialStore
from gpufleet.agent.faults import AGENT_FAULTS, REFUSED_ON_REAL_NODES, FaultTarget
from gpufleet.agent.gpu.mig import MigControl, MigError
from gpufleet.agent.inventory import InventorySource
from gpufleet.agent.jobs.supervisor import JobSupervisor
from gpufleet.agent.logs import LogWatcher
from gpufleet.agent.metrics.outbox import Outbox
from gpufleet.agent.metrics.ports import EventSource, SampleSource
from gpufleet.agent.topology.ibnet import IbnetParseError, TopologyReadError
from gpufleet.client import AgentHttp
from gpufleet.core.errors import GpufleetError, InvalidInput, Unauthorized, Unavailable
from gpufleet.protocol.accounts import AccountList
from gpufleet.protocol.inventory import NodeInventory
from gpufleet.protocol.jobs import JobAck, JobCancel, JobStart, JobUpdate
from gpufleet.protocol.messages import (
    CLOSE_NODE_GONE,
    CLOSE_REPLACED,
    CLOSE_UNAUTHORIZED,
    MAX_CHANNEL_MESSAGE_BYTES,
    Ack,
    FaultResult,
    Heartbeat,
    Hello,
    Welcome,
    head_message_adapter,
)
from gpufleet.protocol.metrics import CheckResult, FaultCommand
from gpufleet.protocol.mig import MigApply, MigResult
from gpufleet.protocol.software import SoftwareInventory
from gpufleet.protocol.topology import IbFabric

log = logging.getLogger(__name__)
SoftwareSource = Callable[[], SoftwareInventory]  # agent.software.collect_software, or the simulator's
FabricSource = Callable[[], IbFabric]  # agent.topology.ibnet.read_fabric
T = TypeVar("T")


class AgentStopped(GpufleetError):
    """The head refused this node for good (credential revoked, node removed); retrying cannot help."""

    exit_code = 5


@dataclass
class AgentOptions:
    server: str
    name: str
    join_token: str | None = None
    heartbeat_interval_s: float | None = None  # None: the interval the head hands out at join
    inventory_check_s: float = 60.0
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 10.0
    tls_context: ssl.SSLContext | None = None  # for wss://: the head's pinned CA (see agent.trust); None: system CAs
    accounts: AccountSync | None = None  # accounts_sync: keep the cluster users' accounts on this node
    accounts_interval_s: float = 60.0
    metrics: SampleSource | None = None  # sampled every metrics_interval_s, in a worker thread; None: no metrics
    events: EventSource | None = None  # Xid events, sent the moment they are read
    logs: LogWatcher | None = None  # the kernel and driver logs: their events, and every line for the head
    faults: FaultTarget | None = None  # simulated nodes only: where `gpufleet sim fault` lands
    metrics_interval_s: float = 5.0
    metrics_backlog: int = 60  # samples kept while the head is unreachable; the oldest go first
    checks: CheckSource | None = None  # the node's own checks, run every checks_interval_s; None: none
    checks_interval_s: float = 60.0
    jobs: JobSupervisor | None = None  # runs the jobs the head places here; None: this agent runs none
    software: SoftwareSource | None = None  # installed packages, drivers, firmware; None: not reported
    software_check_s: float = 3600.0  # read again this often; sent only when its digest changed
    fabric: FabricSource | None = None  # the InfiniBand fabric (ibnetdiscover); None: not reported
    fabric_interval_s: float = 600.0  # read again this often; sent only when its digest changed
    mig: MigControl | None = None  # applies the MIG layouts the head sends (agent.gpu.mig); None: refused


def channel_url(server: str) -> str:
    if server.startswith("https://"):
        return "wss://" + server.removeprefix("https://") + "/api/v1/agent/channel"
    return "ws://" + server.removeprefix("http://") + "/api/v1/agent/channel"


async def with_retry(call: Callable[[], Awaitable[T]], initial_s: float = 0.5, max_s: float = 10.0) -> T:
    """Call until the head answers: Unavailable is retried with backoff, anything else raised."""
    backoff = initial_s
    while True:
        try:
            return await call()
        except Unavailable as exc:
            log.warning("%s; retrying in %.1fs", exc, backoff)
        await asyncio.sleep(backoff)
        backoff = min(backoff * 2, max_s)


def _without_neighbors(inventory: NodeInventory) -> NodeInventory:
    return inventory.model_copy(update={"neighbors": []}) if inventory.neighbors else inventory


async def _cancel(tasks: set[asyncio.Task[None]]) -> None:
    """Cancel `tasks` and wait until each has finished."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


class Agent:
    """One node's agent. The simulator runs many in one process; only the inventory source differs."""

    def __init__(
        self, options: AgentOptions, store: CredentialStore, http: AgentHttp, read_inventory: InventorySource
    ) -> None:
        self.options = options
        self.store = store
        self.http = http
        self.read_inventory = read_inventory
        self.interval_s = options.heartbeat_interval_s or 1.0
        self.seq = 0
        self.acked_seq = -1
        self.last_heartbeat_at: float | None = None  # wall clock of the last heartbeat sent
        self.connected = False
        self.ever_acked = False
        self.joined_unproven = False  # the credential was just issued and no heartbeat acknowledged yet
        self._inventory: NodeInventory | None = None
        # False once the head refused the inventory's LLDP neighbours as an unknown field (a head older
        # than them): inventories then go without them, and hello's fingerprint is of what was sent.
        self.head_takes_neighbors = True
        self.software_digest: str | None = None  # of the software report the head last took
        self.fabric_digest: str | None = None  # of the InfiniBand fabric the head last took
        self.accounts_version: str | None = None  # of the account list last applied without failures
        self._accounts: AccountList | None = None  # the last list fetched, applied again each interval
        self.outbox = Outbox(max_samples=options.metrics_backlog)
        self._outbox_ready = asyncio.Event()  # something was queued, or sending may resume
        self._events_wake = asyncio.Event()  # a simulated fault may have queued an Xid: poll now
        self._mig_tasks: set[asyncio.Task[None]] = set()
        self._mig_lock = asyncio.Lock()
        self._running = asyncio.Event()  # clear while a simulated crash or hang holds metrics and events
        self._running.set()
        self.crashed = False  # simulated node-crash: nothing leaves but answers to commands
        self.hung = False  # simulated agent-hang: heartbeats only
        self.check_results: list[CheckResult] = []  # the latest round's, attached to every sample
        self._checks_ran = asyncio.Event()  # the first round of checks is over

    # -- joining ----------------------------------------------------------------------------------
    async def ensure_credential(self, *, fresh: bool = False) -> Credential:
        """The stored credential, or a new one bought with the join token (always, with `fresh`: the stored
        one was refused). Raises Unauthorized if neither."""
        credential = None if fresh else self.store.load()
        if credential is not None and credential.node == self.options.name:
            if self.options.heartbeat_interval_s is None and credential.heartbeat_interval_s:
                self.interval_s = credential.heartbeat_interval_s
            return credential
        if not self.options.join_token:
            raise Unauthorized(f"node {self.options.name} has no credential yet: pass --join-token")
        self.store.check_writable()  # before spending a join token on a credential we could not keep
        inventory = await self._current_inventory()
        # Joined without its neighbours, which a head older than them refuses (and would refuse the join
        # with them): a head that takes them asks for the inventory at hello, its fingerprint differing.
        joined = await self.http.join(self.options.join_token, self.options.name, _without_neighbors(inventory))
        credential = Credential(
            server=self.options.server,
            node=joined.name,
            node_id=joined.node_id,
            token=joined.credential,
            heartbeat_interval_s=joined.heartbeat_interval_s,
        )
        self.store.save(credential)
        self.joined_unproven = True
        if self.options.heartbeat_interval_s is None:
            self.interval_s = joined.heartbeat_interval_s
        log.info("joined the head at %s as node %s", self.options.server, joined.name)
        return credential

    async def _credential_refused(self, reason: str) -> Credential:
        """The head refused this node's credential (issued by another head, or revoked): join again with
        the join token. Raises AgentStopped without a join token, or when the credential refused is the
        one the head has just issued (joining again would only spend the join token again), and what
        `ensure_credential` raises when the join itself is refused."""
        name, server = self.options.name, self.options.server
        if not self.options.join_token:
            raise AgentStopped(
                f"the head at {server} refused the credential of node {name} ({reason}) and there is no join"
                f" token to join again: pass --join-token (the credential is {self.store.path})"
            )
        if self.joined_unproven:
            raise AgentStopped(
                f"the head at {server} refused the credential it had just issued to node {name} ({reason})"
            )
        log.warning(
            "the head at %s refused the stored credential of node %s (%s); joining again with the join token",
            server,
            name,
            reason,
        )
        # The stored credential stays until the new one is saved over it: a join that fails (the head's
        # database busy, the join token spent) leaves the node no worse off than before.
        return await self._with_retry(lambda: self.ensure_credential(fresh=True))

    async def _current_inventory(self) -> NodeInventory:
        self._inventory = await asyncio.to_thread(self.read_inventory)
        return self._inventory

    # -- running ----------------------------------------------------------------------------------
    async def run(self) -> None:
        """Run until cancelled. Raises AgentStopped or Unauthorized when the head refuses this node for good.

        Metrics and Xid events are gathered from the start and across reconnects; the outbox keeps them
        until a channel is open.
        """
        background = []
        if self.options.metrics is not None:
            background.append(asyncio.create_task(self._collect_metrics(self.options.metrics)))
        for source in (self.options.events, self.options.logs):
            if source is not None:
                background.append(asyncio.create_task(self._watch_events(source)))
        if self.options.checks is not None:
            background.append(asyncio.create_task(self._run_checks(self.options.checks)))
        try:
            await self._connect_forever()
        finally:
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            if self.options.jobs is not None:
                await self.options.jobs.close()

    async def _connect_forever(self) -> None:
        credential = await self._with_retry(self.ensure_credential)
        backoff = self.options.backoff_initial_s
        while True:
            try:
                await self._session(credential)
            except ConnectionClosed as exc:
                code = exc.rcvd.code if exc.rcvd is not None else None
                reason = exc.rcvd.reason if exc.rcvd is not None else ""
                if code == CLOSE_UNAUTHORIZED:
                    credential = await self._credential_refused(reason)
                    continue
                if code in (CLOSE_NODE_GONE, CLOSE_REPLACED):
                    raise AgentStopped(f"the head closed the channel of node {self.options.name}: {reason}") from None
                # 1001 (going away) and 1012 (service restart) are a head shutting down or restarting: routine.
                level = logging.INFO if code in (1001, 1012) else logging.WARNING
                log.log(level, "channel closed (%s %s); reconnecting", code, reason)
            except Unauthorized as exc:  # the inventory upload refused the credential the channel took
                credential = await self._credential_refused(str(exc))
                continue
            except (OSError, TimeoutError, InvalidHandshake, InvalidURI, Unavailable) as exc:
                log.warning("cannot reach the head at %s (%s); retrying in %.1fs", self.options.server, exc, backoff)
            finally:
                self.connected = False
            if self.ever_acked or self.crashed:
                # The last session worked, or a simulated crashed node keeps a channel open for `sim heal`:
                # start the backoff over.
                backoff = self.options.backoff_initial_s
                self.ever_acked = False
            # Jitter spreads a thousand agents reconnecting after a head restart.
            await asyncio.sleep(backoff * random.uniform(0.5, 1.0))  # noqa: S311
            backoff = min(backoff * 2, self.options.backoff_max_s)

    async def _with_retry(self, call: Callable[[], Awaitable[Credential]]) -> Credential:
        return await with_retry(call, self.options.backoff_initial_s, self.options.backoff_max_s)

    async def _session(self, credential: Credential) -> None:
        async with connect(
            channel_url(self.options.server),
            additional_headers={"Authorization": f"Bearer {credential.token}"},
            max_size=MAX_CHANNEL_MESSAGE_BYTES,
            open_timeout=10,
            compression=None,
            ssl=self.options.tls_context if self.options.server.startswith("https://") else None,
        ) as ws:
            if self.crashed:
                await self._crashed_session(ws)
                return
            inventory = self._inventory or await self._current_inventory()
            hello = Hello(
                heartbeat_interval_s=self.interval_s, inventory_fingerprint=self._as_sent(inventory).fingerprint()
            )
            await ws.send(hello.model_dump_json())
            # The head counts the node alive from its hello: beat from then on, not from the welcome or after
            # the inventory upload. In a join storm either can take seconds, and a node silent meanwhile was
            # marked down and back up (waves of false downs in the 200-node test).
            tasks = {asyncio.create_task(self._beat(ws))}
            try:
                if (await self._welcome(ws)).inventory_wanted:
                    await self._put_inventory(credential, inventory)
            except BaseException:
                await _cancel(tasks)
                raise
            self.connected = True
            tasks |= {
                asyncio.create_task(self._read(ws, credential)),
                asyncio.create_task(self._watch_inventory(credential)),
                asyncio.create_task(self._send_outbox(ws)),
            }
            if self.options.accounts is not None:
                tasks.add(asyncio.create_task(self._watch_accounts(credential, self.options.accounts)))
            if self.options.software is not None:
                tasks.add(asyncio.create_task(self._watch_software(credential, self.options.software)))
            if self.options.fabric is not None:
                tasks.add(asyncio.create_task(self._watch_fabric(credential, self.options.fabric)))
            if self.options.jobs is not None:
                self.options.jobs.connected()
                tasks.add(asyncio.create_task(self.options.jobs.send_forever(ws.send)))
            try:
                done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            finally:
                await _cancel(tasks)
            for task in done:
                if not task.cancelled() and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
            raise Unavailable("the head closed the channel")

    @staticmethod
    async def _welcome(ws: ClientConnection) -> Welcome:
        """The head's answer to hello."""
        try:
            welcome = head_message_adapter.validate_json(await asyncio.wait_for(ws.recv(), timeout=10))
        except ValidationError:
            raise Unavailable("the head answered hello with something this agent does not understand") from None
        if not isinstance(welcome, Welcome):
            raise Unavailable("the head did not answer hello")
        return welcome

    async def _crashed_session(self, ws: ClientConnection) -> None:
        """A simulated crashed node: no hello, so the head never counts the connection as a sign of
        life (it closes it after its hello timeout and the node stays down); only commands are read,
        so `sim heal` can still reach it. Returns once healed, to reconnect as a working agent."""
        reader = asyncio.create_task(self._read(ws))
        healed = asyncio.create_task(self._running.wait())  # set again by `heal`
        try:
            await asyncio.wait({reader, healed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (reader, healed):
                task.cancel()
            await asyncio.gather(reader, healed, return_exceptions=True)
        if reader.done() and not reader.cancelled() and reader.exception() is not None:
            raise reader.exception()  # type: ignore[misc]

    async def _read(self, ws: ClientConnection, credential: Credential | None = None) -> None:
        async for raw in ws:
            try:
                message = head_message_adapter.validate_json(raw)
            except ValidationError:
                log.debug("ignoring a message this agent does not understand: %.80r", raw)
                continue  # a newer head may send more kinds of messages
            if isinstance(message, Ack):
                self.acked_seq = max(self.acked_seq, message.seq)
                self.ever_acked = True
                self.joined_unproven = False
            elif isinstance(message, FaultCommand):
                await ws.send(self.apply_fault(message).model_dump_json())
            elif isinstance(message, MigApply) and not self.crashed:
                # Its own task: a GPU reset takes seconds, and acks and job messages must not wait on it.
                task = asyncio.create_task(self._answer_mig(ws, message, credential))
                self._mig_tasks.add(task)
                task.add_done_callback(self._mig_tasks.discard)
            elif isinstance(message, JobStart | JobCancel | JobAck) and not self.crashed:
                await self._job_message(ws, message)
        raise Unavailable("the head closed the channel normally")

    async def _job_message(self, ws: ClientConnection, message: JobStart | JobCancel | JobAck) -> None:
        jobs = self.options.jobs
        if jobs is None:
            if isinstance(message, JobStart | JobCancel):  # say so, so the head does not wait forever
                refused = JobUpdate(
                    job_id=message.job_id,
                    run=message.run,
                    rank=message.rank,
                    state="exited",
                    outcome="error",
                    message="this agent runs no jobs (it was started without an executor)",
                )
                await ws.send(refused.model_dump_json())
        elif isinstance(message, JobStart):
            jobs.start(message)
        elif isinstance(message, JobCancel):
            jobs.cancel(message)
        else:
            jobs.acknowledged(message)

    async def _beat(self, ws: ClientConnection) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            if not self.crashed:
                self.seq += 1
                await ws.send(Heartbeat(seq=self.seq).model_dump_json())
                self.last_heartbeat_at = time.time()
            # Fixed rate: a late beat shortens the next wait rather than shifting every later one.
            next_at = max(next_at + self.interval_s, loop.time())
            await asyncio.sleep(next_at - loop.time())

    # -- metrics, events, faults --------------------------------------------------------------------
    async def _collect_metrics(self, source: SampleSource) -> None:
        """Sample every interval, in a worker thread so a slow NVML never delays a heartbeat."""
        if self.options.checks is not None:
            # The head takes each sample's checks as the node's current verdict: a sample sent before the
            # checks first ran would clear a failed check's finding after every agent restart.
            await self._checks_ran.wait()
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            await self._running.wait()
            try:
                sample, events = await asyncio.to_thread(source.collect)
            except Exception:  # the sampler raises nothing on purpose; a bug in it must not end metrics
                log.exception("metrics round failed")
            else:
                if self._running.is_set():
                    if self.options.checks is not None:
                        sample = sample.model_copy(update={"checks": self.check_results})
                    self.outbox.add_events(events)
                    self.outbox.add_sample(sample)
                    self._outbox_ready.set()
            next_at = max(next_at + self.options.metrics_interval_s, loop.time())
            await asyncio.sleep(next_at - loop.time())

    async def _run_checks(self, source: CheckSource) -> None:
        """Run the node's checks every checks_interval_s, in a worker thread: a slow check never delays a
        heartbeat or a sample. Samples carry the latest results in between."""
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            await self._running.wait()
            try:
                self.check_results = await asyncio.to_thread(source.run)
            except Exception:  # the runner raises nothing on purpose; a bug in it must not end the checks
                log.exception("checks round failed; keeping the last results")
            self._checks_ran.set()
            next_at = max(next_at + self.options.checks_interval_s, loop.time())
            await asyncio.sleep(next_at - loop.time())

    async def _watch_events(self, source: EventSource) -> None:
        """Queue events as they come (NVML's Xids, the logs'), and a log watcher's lines: a blocking source
        waits in a thread (1 s at a time), the simulator's is polled when a fault was injected and once a
        metrics interval otherwise. While a simulated crash or hang holds the agent, events wait in NVML's
        queue."""
        while True:
            await self._running.wait()
            events = await asyncio.to_thread(source.poll, 1000) if source.blocking else source.poll(0)
            lines = source.take_lines() if isinstance(source, LogWatcher) else []
            if events:
                self.outbox.add_events(events)
            if lines:
                self.outbox.add_log_lines(lines)
            if events or lines:
                self._outbox_ready.set()
            if not source.blocking and not events:
                self._events_wake.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.options.metrics_interval_s):
                        await self._events_wake.wait()

    async def _send_outbox(self, ws: ClientConnection) -> None:
        """Send what the outbox holds, events first, whenever something is queued."""
        while True:
            self._outbox_ready.clear()
            while self._running.is_set() and (message := self.outbox.next_message()) is not None:
                await ws.send(message.text)
                self.outbox.sent(message)
            await self._outbox_ready.wait()

    async def _answer_mig(self, ws: ClientConnection, command: MigApply, credential: Credential | None) -> None:
        """Apply, send the inventory that results, then answer: the head reads the answer as "the new
        layout is in the inventory", and asks again only for GPUs that still differ."""
        result = await self.apply_mig(command)
        if credential is not None:
            try:
                await self._resend_if_changed(credential)
            except GpufleetError as exc:  # the periodic check sends it later; the head asks again meanwhile
                log.warning("inventory after a MIG change not sent: %s", exc)
        with contextlib.suppress(ConnectionClosed):  # the head asks again once the node is back
            await ws.send(result.model_dump_json())

    async def apply_mig(self, command: MigApply) -> MigResult:
        """Give the GPUs their MIG layouts, one after the other (each may reset its GPU: seconds on real
        hardware, so off the event loop). Raises nothing: the answer says, per GPU, what failed."""
        control = self.options.mig
        if control is None:
            return MigResult(id=command.id, errors=dict.fromkeys(command.gpus, "this agent manages no MIG"))
        errors: dict[int, str] = {}
        async with self._mig_lock:  # one request at a time: two would reset the same GPU under each other
            # The agent's own word on "idle" comes first: a rank placed here but not yet in CUDA (staging its
            # data, pulling its image) is invisible to NVML's in-use check.
            busy = self.options.jobs.gpus_in_use() if self.options.jobs is not None else set()
            for index, layout in sorted(command.gpus.items()):
                if index in busy:
                    errors[index] = "a job of this node holds the GPU; asked again once it ends"
                    continue
                try:
                    await asyncio.to_thread(control.apply_mig, index, layout)
                    log.info("GPU %d: MIG layout %s applied", index, layout)
                except MigError as exc:
                    log.warning("GPU %d: MIG layout %s not applied: %s", index, layout, exc)
                    errors[index] = str(exc)[:512]
        return MigResult(id=command.id, errors=errors)

    def apply_fault(self, command: FaultCommand) -> FaultResult:
        """Inject or heal a simulated fault; a real agent (no fault target) refuses. Raises nothing: the
        answer says what happened."""
        target = self.options.faults
        if target is None:
            return FaultResult(id=command.id, ok=False, message=REFUSED_ON_REAL_NODES)
        try:
            if command.action == "heal":
                done = target.heal()
                if self.crashed or self.hung:
                    done = f"{done}; the agent runs normally again".lstrip("; ")
                self._set_mode(crashed=False, hung=False)
            elif command.kind is None:
                raise InvalidInput("inject needs a fault kind")
            elif command.kind in AGENT_FAULTS:
                done = self._agent_fault(command.kind)
            else:
                done = target.inject(command.kind, command.gpu)
                self._events_wake.set()  # an injected Xid goes out now, not at the next poll
        except GpufleetError as exc:
            log.info("fault %s %s refused: %s", command.action, command.kind or "", exc)
            return FaultResult(id=command.id, ok=False, message=str(exc)[:512])
        log.warning("simulated fault: %s %s: %s", command.action, command.kind or "", done)
        return FaultResult(id=command.id, ok=True, message=done[:512])

    def _agent_fault(self, kind: str) -> str:
        if kind == "node-crash":
            self.outbox.clear()  # a crashed node loses what it had not sent
            if self.options.jobs is not None:
                self.options.jobs.lose_all()  # and its jobs' processes
            self._set_mode(crashed=True, hung=self.hung)
            return "node crashed: no heartbeats, metrics or events until healed"
        self._set_mode(crashed=self.crashed, hung=True)
        return "agent hung: heartbeats go on, metrics and events stop until healed"

    def _set_mode(self, *, crashed: bool, hung: bool) -> None:
        self.crashed, self.hung = crashed, hung
        if crashed or hung:
            self._running.clear()
        else:
            self._running.set()
            self._outbox_ready.set()  # send what waited

    async def _watch_inventory(self, credential: Credential) -> None:
        """Its own task: a slow nvidia-smi or a slow PUT must never delay a heartbeat."""
        while True:
            await asyncio.sleep(self.options.inventory_check_s)
            await self._resend_if_changed(credential)

    async def _resend_if_changed(self, credential: Credential) -> None:
        before = self._inventory.fingerprint() if self._inventory else None
        current = await self._current_inventory()
        if current.fingerprint() != before:
            log.info("inventory changed; sending it")
            await self._put_inventory(credential, current)

    def _as_sent(self, inventory: NodeInventory) -> NodeInventory:
        return inventory if self.head_takes_neighbors else _without_neighbors(inventory)

    async def _put_inventory(self, credential: Credential, inventory: NodeInventory) -> None:
        """Send the inventory. A head older than the LLDP neighbours refuses them as an unknown field: it
        is sent again without them, and so from then on (logged once). Raises what put_inventory raises."""
        sent = self._as_sent(inventory)
        try:
            await self.http.put_inventory(credential.token, sent)
        except InvalidInput as exc:
            if not sent.neighbors or "neighbors" not in str(exc):
                raise
            if "Extra inputs" in str(exc):
                self.head_takes_neighbors = False
                log.warning(
                    "the head at %s does not take LLDP neighbours (it is older than this agent): the inventory"
                    " goes without them",
                    self.options.server,
                )
            else:
                log.warning("the head refused this node's LLDP neighbours (%s): the inventory goes without them", exc)
            await self.http.put_inventory(credential.token, _without_neighbors(inventory))

    async def _watch_software(self, credential: Credential, read: SoftwareSource) -> None:
        """Its own task, at connect and every software_check_s: reading dpkg and pip takes seconds, and
        the report is sent only when its digest differs from the last one the head took. A failure is
        logged and retried next round; it never ends the channel."""
        interval = self.options.software_check_s
        while True:
            try:
                report = await asyncio.to_thread(read)
                if report.digest != self.software_digest:
                    await self.http.put_software(credential.token, report)
                    self.software_digest = report.digest
                    log.info("software inventory sent: %d packages", len(report.packages))
            except GpufleetError as exc:
                log.warning("software inventory not sent: %s; retrying in %.0fs", exc, interval)
            except Exception:
                log.exception("software inventory not read; retrying in %.0fs", interval)
            await asyncio.sleep(interval)

    async def _watch_fabric(self, credential: Credential, read: FabricSource) -> None:
        """Its own task, at connect and every fabric_interval_s: ibnetdiscover sweeps the whole fabric (tens
        of seconds on a large one), in a worker thread; the fabric is sent only when its digest differs from
        the last one the head took. A failure (ibnetdiscover missing or failing, the head refusing) is logged
        and tried again next round; it never ends the channel."""
        interval = self.options.fabric_interval_s
        while True:
            await self.report_fabric(credential, read)
            await asyncio.sleep(interval)

    async def report_fabric(self, credential: Credential, read: FabricSource) -> bool:
        """Read the fabric and send it if it changed. Returns whether it was sent; logs, never raises, on
        a failure (but cancellation)."""
        try:
            fabric = await asyncio.to_thread(read)
            digest = fabric.digest()
            if digest == self.fabric_digest:
                return False
            await self.http.put_fabric(credential.token, fabric)
            self.fabric_digest = digest
            log.info(
                "InfiniBand fabric sent: %d switches, %d channel adapters, %d links",
                len(fabric.switches),
                len(fabric.cas),
                len(fabric.links),
            )
        except GpufleetError as exc:
            log.warning("InfiniBand fabric not sent: %s", exc)
        except (TopologyReadError, IbnetParseError) as exc:  # ibnetdiscover missing or failing; a fabric too big
            log.warning("InfiniBand fabric not read: %s", exc)
        except Exception:
            log.exception("InfiniBand fabric not read or not sent")
        else:
            return True
        return False

    async def _watch_accounts(self, credential: Credential, sync: AccountSync) -> None:
        """Its own task, at start and every interval. A failure is logged and retried next interval: it
        never ends the channel, since heartbeats matter more than accounts."""
        interval = self.options.accounts_interval_s
        while True:
            try:
                await self.sync_accounts(credential, sync)
            except GpufleetError as exc:
                log.warning("accounts not synced: %s; retrying in %.0fs", exc, interval)
            except Exception:
                log.exception("accounts not synced; retrying in %.0fs", interval)
            await asyncio.sleep(interval)

    async def sync_accounts(self, credential: Credential, sync: AccountSync) -> SyncReport | None:
        """Fetch the account list unless the head says it is unchanged, and apply it (in a thread: it runs
        commands). An unchanged list is applied again too: that repairs local drift (a managed account
        deleted or edited by hand) and costs no command when there is none. Returns the report, or
        None before any list arrived. Raises GpufleetError."""
        fetched = await self.http.get_accounts(credential.token, self.accounts_version)
        if fetched is not None:
            self._accounts = fetched
        listing = self._accounts
        if listing is None:
            return None
        report = await asyncio.to_thread(sync.apply, listing)
        log.log(logging.INFO if report.changed or report.failed else logging.DEBUG, "accounts: %s", report.summary())
        for name, reason in report.skipped.items():
            log.warning("accounts: %s skipped: %s", name, reason)
        for note in report.notes:
            log.warning("accounts: %s", note)
        if not report.failed:  # a failed account is tried again with the next fetch
            self.accounts_version = listing.version
        return report
