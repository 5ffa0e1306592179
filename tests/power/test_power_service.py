"""The power domain with fake BMCs: one node's action confirmed by polling, planning all or nothing,
the refusal to take nodes with running jobs down unless forced, staggered power-ons, one failing BMC
among good ones, and passwords sealed at rest."""

from __future__ import annotations

import stat
import time
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.core.clock import FakeClock, to_datetime
from gpufleet.core.credentials import CredentialBox, ensure_key_file
from gpufleet.core.db import transaction
from gpufleet.core.errors import ConfigError, Conflict, InvalidInput, NotFound
from gpufleet.inventory import service as inventory
from gpufleet.inventory.schemas import NodeSettings
from gpufleet.jobs.models import Job, JobState
from gpufleet.power import service as power
from gpufleet.power.ports import PowerState
from gpufleet.power.schemas import PowerAction
from gpufleet.tasks import service as tasks
from gpufleet.tasks.models import Task
from gpufleet.tasks.runner import TaskRunner
from tests.power.conftest import FakeBmc, FakeFleet

BOX = CredentialBox.generate()
SETTINGS = power.PowerSettings(fanout=4, stagger_s=0.0, confirm_timeout_s=30, poll_s=1.0)


def ticking(clock: FakeClock) -> power.Sleep:
    """A sleep that moves the fake clock instead of waiting."""
    return clock.advance


# One node
def test_an_action_is_confirmed_only_once_the_bmc_shows_the_wanted_state() -> None:
    clock = FakeClock()
    bmc = FakeBmc(state=PowerState.OFF, lag=3)
    outcome = power.act(bmc, PowerAction.ON, clock=clock, confirm_timeout_s=30, sleep=ticking(clock))
    assert outcome.ok
    assert outcome.state is PowerState.ON
    assert bmc.actions() == ["power_on"]
    assert [n for n, _ in bmc.calls].count("power_state") == 5  # before, then 3 lagging reads, then on
    assert outcome.detail == "powered on: on after 3.0 s"


def test_a_node_that_never_gets_there_fails_after_the_timeout() -> None:
    clock = FakeClock()
    bmc = FakeBmc(state=PowerState.ON, stuck=True)
    outcome = power.act(bmc, PowerAction.OFF, clock=clock, confirm_timeout_s=10, poll_s=1, sleep=ticking(clock))
    assert not outcome.ok
    assert outcome.state is PowerState.ON
    assert outcome.detail == "powered off, but still on after 10 s"


@pytest.mark.parametrize(
    ("action", "before", "sent"),
    [
        (PowerAction.ON, PowerState.ON, []),  # already there: nothing sent
        (PowerAction.OFF, PowerState.OFF, []),
        (PowerAction.CYCLE, PowerState.ON, ["power_cycle"]),
        (PowerAction.CYCLE, PowerState.OFF, ["power_on"]),  # IPMI ignores a cycle of an off node
        (PowerAction.RESET, PowerState.ON, ["reset"]),
        (PowerAction.STATUS, PowerState.OFF, []),
    ],
)
def test_what_each_action_sends(action: PowerAction, before: PowerState, sent: list[str]) -> None:
    clock = FakeClock()
    bmc = FakeBmc(state=before, lag=0)
    outcome = power.act(bmc, action, clock=clock, confirm_timeout_s=5, sleep=ticking(clock))
    assert outcome.ok
    assert bmc.actions() == sent
    assert outcome.state is power.WANTED.get(action, before)


class ScriptedBmc(FakeBmc):
    """A BMC whose power state reads follow `script`, the last repeated: what a BMC shows after a cycle."""

    def __init__(self, *script: PowerState) -> None:
        super().__init__(state=script[0])
        self.script = list(script)

    def power_state(self) -> PowerState:
        self._call("power_state")
        return self.script.pop(0) if len(self.script) > 1 else self.script[0]


@pytest.mark.parametrize("action", [PowerAction.CYCLE, PowerAction.RESET])
def test_a_cycle_or_reset_is_confirmed_only_once_the_state_left_on_and_came_back(action: PowerAction) -> None:
    clock = FakeClock()
    on, off, unknown = PowerState.ON, PowerState.OFF, PowerState.UNKNOWN
    # Before the request, then twice still "on" (the BMC has not acted yet), off, powering on, on.
    bmc = ScriptedBmc(on, on, on, off, unknown, on)
    outcome = power.act(bmc, action, clock=clock, confirm_timeout_s=30, sleep=ticking(clock))
    did = "power cycled" if action is PowerAction.CYCLE else "reset"
    assert (outcome.ok, outcome.confirmed, outcome.state) == (True, True, on)
    assert outcome.detail == f"{did}: off, then on after 4.0 s"  # not "on after 0.0 s": that proved nothing


@pytest.mark.parametrize("action", [PowerAction.CYCLE, PowerAction.RESET])
def test_a_cycle_or_reset_that_never_shows_is_ok_but_unconfirmed_and_one_stuck_off_fails(
    action: PowerAction,
) -> None:
    clock = FakeClock()
    bmc = ScriptedBmc(PowerState.ON)  # a warm reset: many BMCs show "on" throughout
    outcome = power.act(bmc, action, clock=clock, confirm_timeout_s=10, poll_s=1, sleep=ticking(clock))
    sent = "power cycle sent" if action is PowerAction.CYCLE else "reset sent"
    assert (outcome.ok, outcome.confirmed, outcome.state) == (True, False, PowerState.ON)
    assert outcome.detail == f"{sent}; the BMC reported no transition (on throughout 10 s)"
    assert clock.now() >= 10  # it watched until the deadline before saying so
    clock = FakeClock()
    bmc = ScriptedBmc(PowerState.ON, PowerState.OFF)
    outcome = power.act(bmc, action, clock=clock, confirm_timeout_s=10, poll_s=1, sleep=ticking(clock))
    assert not outcome.ok
    assert outcome.detail.endswith(", but still off after 10 s")


def test_an_unconfirmed_reset_says_so_in_the_task(
    sqlite_sessions: sessionmaker[Session], clock: FakeClock, fleet: FakeFleet
) -> None:
    _nodes(sqlite_sessions, clock, fleet, "gpu[01-02]")
    fleet.bmcs["bmc-gpu01"].state = PowerState.ON  # FakeBmc's reset never leaves "on"
    fleet.bmcs["bmc-gpu02"].state = PowerState.ON
    fleet.bmcs["bmc-gpu02"].lag = 1
    with transaction(sqlite_sessions, readonly=True) as s:
        resets = power.plan(s, BOX, SETTINGS, PowerAction.RESET, ["gpu01"])
        cycles = power.plan(s, BOX, SETTINGS, PowerAction.CYCLE, ["gpu02"])  # FakeBmc's cycle goes off first
    task = _run(sqlite_sessions, clock, fleet, resets, sleep=ticking(clock))
    (result,) = task.targets
    assert (result.state, result.data) == ("ok", {"power_state": "on", "seconds": 30.0, "confirmed": False})
    assert result.detail == "reset sent; the BMC reported no transition (on throughout 30 s)"
    assert task.summary == "power reset gpu01: 1 unconfirmed"
    task = _run(sqlite_sessions, clock, fleet, cycles, sleep=ticking(clock))
    (result,) = task.targets
    assert result.data == {"power_state": "on", "seconds": 1.0}
    assert result.detail == "power cycled: off, then on after 1.0 s"
    assert task.summary == "power cycle gpu02: 1 on"


# Credentials
def test_passwords_are_sealed_and_only_the_key_opens_them(tmp_path: Path) -> None:
    key = tmp_path / "keys" / "bmc.key"
    box = CredentialBox.from_key_file(key)
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    sealed = box.seal("s3cret-Passw0rd")
    assert "s3cret" not in sealed
    assert box.open(sealed) == "s3cret-Passw0rd"
    assert CredentialBox.from_key_file(key).open(sealed) == "s3cret-Passw0rd"  # the same file: the same key
    with pytest.raises(Conflict, match="key file"):
        CredentialBox.generate().open(sealed)
    # Rotation: a new key first seals; the old one, second, still opens what it sealed.
    rotated = tmp_path / "rotated.key"
    ensure_key_file(rotated)
    rotated.write_bytes(rotated.read_bytes() + key.read_bytes())
    both = CredentialBox.from_key_file(rotated)
    assert both.open(sealed) == "s3cret-Passw0rd"
    with pytest.raises(Conflict):
        box.open(both.seal("new"))
    key.chmod(0o644)
    with pytest.raises(ConfigError, match="readable by others"):
        CredentialBox.from_key_file(key)


# BMCs in the database
def _nodes(sessions: sessionmaker[Session], clock: FakeClock, fleet: FakeFleet, expression: str) -> list[str]:
    with transaction(sessions) as s:
        nodes = inventory.add_nodes(s, clock, [expression], NodeSettings())
        for node in nodes:
            fleet.add(f"bmc-{node.name}")
            spec = power.BmcSpec("ipmi", f"bmc-{node.name}", "admin", f"pw-{node.name}")
            power.set_bmc(s, clock, BOX, node.name, spec)
        return [n.name for n in nodes]


def _running_job(sessions: sessionmaker[Session], clock: FakeClock, nodes: list[str]) -> int:
    with transaction(sessions) as s:
        job = Job(
            user="alice",
            submitted_by="user:alice",
            state=JobState.RUNNING,
            time_limit_s=3600,
            submitted_at=to_datetime(clock.now()),
            allocation={n: [0] for n in nodes},
        )
        s.add(job)
        s.flush()
        return job.id


def test_the_password_column_holds_no_plaintext(
    sessions: sessionmaker[Session], clock: FakeClock, fleet: FakeFleet
) -> None:
    _nodes(sessions, clock, fleet, "gpu01")
    with transaction(sessions, readonly=True) as s:
        stored = s.execute(text("SELECT username, password_sealed FROM bmcs")).one()
        assert stored[0] == "admin"
        assert "pw-gpu01" not in stored[1]
        _, bmc = power.get_bmc(s, "gpu01")
        assert power.target(bmc, BOX).password == "pw-gpu01"
        assert "password" not in power.bmc_out(*power.get_bmc(s, "gpu01")).model_dump()


def test_a_bmc_that_cannot_work_is_refused(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    with transaction(sessions) as s:
        inventory.add_nodes(s, clock, ["gpu01"], NodeSettings())
    for spec, message in [
        (power.BmcSpec("snmp", "h", "u", "p"), "protocol"),
        (power.BmcSpec("ipmi", "-oProxyCommand=x", "u", "p"), "not a BMC address"),
        (power.BmcSpec("ipmi", "https://h", "u", "p"), "host name"),
        (power.BmcSpec("redfish", "https://h/redfish/v1", "u", "p"), "base URL"),
        (power.BmcSpec("redfish", "https://h", "u", "p", port=443), "in its URL"),
        (power.BmcSpec("ipmi", "h", "u", ""), "password"),
    ]:
        with pytest.raises(InvalidInput, match=message), transaction(sessions) as s:
            power.set_bmc(s, clock, BOX, "gpu01", spec)
    with transaction(sessions, readonly=True) as s:
        assert s.execute(text("SELECT count(*) FROM bmcs")).scalar_one() == 0
    with pytest.raises(NotFound), transaction(sessions) as s:
        power.set_bmc(s, clock, BOX, "gpu02", power.BmcSpec("ipmi", "h", "u", "p"))


def test_an_address_with_credentials_in_it_is_refused_without_repeating_them(
    sqlite_sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    with transaction(sqlite_sessions) as s:
        inventory.add_nodes(s, clock, ["gpu01"], NodeSettings())
    for protocol, address, shown in [
        ("redfish", "https://admin:s3cr@t@10.0.0.1", "https://***@10.0.0.1"),
        ("redfish", "admin:s3cr@t@10.0.0.1:8443", "***@10.0.0.1:8443"),  # https:// is added to these
        ("redfish", "https://s3cr@t@10.0.0.1/", "https://***@10.0.0.1/"),
        ("ipmi", "s3cr@t@10.0.0.2", "***@10.0.0.2"),
        ("ipmi", "admin:s3cr://@t@10.0.0.2", "***@10.0.0.2"),  # no scheme, whatever "://" it holds
    ]:
        assert power.redact_address(address) == shown
        spec = power.BmcSpec(protocol, address, "admin", "pw")
        with (
            pytest.raises(InvalidInput, match="--username and --password-stdin") as refused,
            transaction(sqlite_sessions) as s,
        ):
            power.set_bmc(s, clock, BOX, "gpu01", spec)
        assert "s3cr" not in str(refused.value)
        assert shown in str(refused.value)
    assert power.redact_address("https://10.0.0.1:8443") == "https://10.0.0.1:8443"
    with transaction(sqlite_sessions, readonly=True) as s:
        assert s.execute(text("SELECT count(*) FROM bmcs")).scalar_one() == 0


def test_planning_is_all_or_nothing(sessions: sessionmaker[Session], clock: FakeClock, fleet: FakeFleet) -> None:
    _nodes(sessions, clock, fleet, "gpu[01-03]")
    with transaction(sessions) as s:
        inventory.add_nodes(s, clock, ["gpu04"], NodeSettings())  # no BMC
    with transaction(sessions, readonly=True) as s:
        with pytest.raises(NotFound, match="gpu09"):
            power.plan(s, BOX, SETTINGS, PowerAction.ON, ["gpu[01-03],gpu09"])
        with pytest.raises(Conflict, match="no BMC set for gpu04"):
            power.plan(s, BOX, SETTINGS, PowerAction.ON, ["gpu[01-04]"])
        found = power.plan(s, BOX, SETTINGS, PowerAction.ON, ["gpu[03,01]"], limit=2, stagger_s=1.5)
    assert found.nodes == ["gpu03", "gpu01"]  # the hostlist's order
    assert (found.limit, found.stagger_s) == (2, 1.5)
    out = found.out(SETTINGS)
    assert out.steps[0].startswith("gpu03: ipmitool -I lanplus -H bmc-gpu03 -p 623 -U admin -E -C 3")
    assert "pw-" not in " ".join(out.steps)
    assert "pw-" not in str(found.params())


def test_nodes_running_jobs_are_not_taken_down_without_force(
    sessions: sessionmaker[Session], clock: FakeClock, fleet: FakeFleet
) -> None:
    _nodes(sessions, clock, fleet, "gpu[01-04]")
    job = _running_job(sessions, clock, ["gpu02", "gpu03"])
    with transaction(sessions, readonly=True) as s:
        for action in (PowerAction.OFF, PowerAction.CYCLE, PowerAction.RESET):
            with pytest.raises(Conflict, match=rf"gpu\[02-03\] run jobs \({job}\).*--force"):
                power.plan(s, BOX, SETTINGS, action, ["gpu[01-04]"])
        assert power.plan(s, BOX, SETTINGS, PowerAction.ON, ["gpu[01-04]"]).forced == {}
        assert power.plan(s, BOX, SETTINGS, PowerAction.OFF, ["gpu[01,04]"]).forced == {}
        forced = power.plan(s, BOX, SETTINGS, PowerAction.OFF, ["gpu[01-04]"], force=True)
    assert forced.forced == {"gpu02": [job], "gpu03": [job]}
    assert forced.params()["forced"] == {"gpu02": [job], "gpu03": [job]}


def _run(
    sessions: sessionmaker[Session],
    clock: FakeClock,
    fleet: FakeFleet,
    found: power.PowerPlan,
    sleep: power.Sleep = lambda _: None,
) -> Task:
    with transaction(sessions) as s:
        task_id = tasks.create(
            s, clock, kind=f"power.{found.action.value}", targets=found.nodes, params=found.params(), created_by="t"
        ).id
    runner = TaskRunner(sessions, clock)
    runner.start(
        task_id,
        lambda ctx: power.run(
            ctx, found, sessions=sessions, clock=clock, settings=SETTINGS, connect=fleet.connect, sleep=sleep
        ),
    )
    runner.wait(task_id, 30)
    with transaction(sessions, readonly=True) as s:
        return tasks.get(s, task_id)


def test_a_failing_bmc_fails_its_node_only_and_states_are_recorded(
    sessions: sessionmaker[Session], clock: FakeClock, fleet: FakeFleet
) -> None:
    names = _nodes(sessions, clock, fleet, "gpu[01-06]")
    for name in names:
        fleet.bmcs[f"bmc-{name}"].lag = 0
    fleet.bmcs["bmc-gpu03"].fail = "bmc-gpu03:623: Unable to establish IPMI v2 / RMCP+ session"
    with transaction(sessions, readonly=True) as s:
        found = power.plan(s, BOX, SETTINGS, PowerAction.ON, ["gpu[01-06]"])
    task = _run(sessions, clock, fleet, found)
    results = {t.target: (t.state, t.detail) for t in task.targets}
    assert results.pop("gpu03") == ("failed", "bmc-gpu03:623: Unable to establish IPMI v2 / RMCP+ session")
    assert set(results.values()) == {("ok", "powered on: on after 0.0 s")}
    assert (task.state, task.done, task.failed) == ("failed", 6, 1)
    assert task.summary == "power on gpu[01-06]: 5 on, 1 failed"
    assert {t.password for t in fleet.seen} == {f"pw-{n}" for n in names}  # each node's own credentials
    with transaction(sessions, readonly=True) as s:
        table = {row.node: row for row in power.power_table(s, ["gpu[01-06]"])}
    assert table["gpu01"].power_state == "on"
    assert table["gpu01"].power_read_at is not None
    assert table["gpu03"].power_state is None
    assert "RMCP+" in (table["gpu03"].last_error or "")


def test_power_ons_are_staggered_and_the_fanout_is_limited(
    sessions: sessionmaker[Session], clock: FakeClock, fleet: FakeFleet
) -> None:
    names = _nodes(sessions, clock, fleet, "gpu[01-05]")
    for name in names:
        fleet.bmcs[f"bmc-{name}"].lag = 0
    with transaction(sessions, readonly=True) as s:
        found = power.plan(s, BOX, SETTINGS, PowerAction.ON, ["gpu[01-05]"], limit=5, stagger_s=0.2)
        off = power.plan(s, BOX, SETTINGS, PowerAction.OFF, ["gpu[01-05]"], limit=2, stagger_s=0.2)
    assert off.stagger_s == 0.0  # only power coming back draws inrush
    started = time.monotonic()
    assert _run(sessions, clock, fleet, found).state == "succeeded"
    ons = sorted(t for bmc in fleet.bmcs.values() for name, t in bmc.calls if name == "power_on")
    assert len(ons) == 5
    # Each start waits 0.2 s after the one before, so the fifth power-on comes 0.8 s after the first
    # start at the earliest (without the stagger, five fake BMCs are done in a few milliseconds).
    assert ons[-1] - started >= 0.8
    for bmc in fleet.bmcs.values():
        bmc.lag = 5
    fleet.most_at_once = 0
    assert _run(sessions, clock, fleet, off, sleep=lambda _: time.sleep(0.02)).state == "succeeded"
    assert fleet.most_at_once == 2
