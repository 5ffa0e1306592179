"""Projects as Slurm accounts against a real Slurm 22.05 with slurmdbd and MariaDB (scripts/services/slurm.sh
with GPUFLEET_SLURM_DBD=1, an instance of its own beside the plain one): accounts and associations made, a
GPU quota enforced by Slurm, a member removed, a hand-made account left alone, a second sync a no-op, and
against the plain Slurm (no slurmdbd) the part says it is off.

The sync owns every gpufleet account in the cluster (it removes those whose project is gone), so the tests
here take turns under one lock, and each starts from its own projects whatever the last one left.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from filelock import FileLock
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.api.app import create_app
from gpufleet.api.routers import slurm_accounts as route
from gpufleet.api.served_routes import API_PREFIX
from gpufleet.auth import audit, projects
from gpufleet.auth import service as auth
from gpufleet.auth.schemas import UserCreate
from gpufleet.auth.users import create_user
from gpufleet.core.clock import FakeClock
from gpufleet.core.config import load_settings
from gpufleet.core.db import transaction
from gpufleet.core.errors import InvalidInput
from gpufleet.jobs.slurm.accounts import (
    AccountingOff,
    AccountsSnapshot,
    DesiredAccount,
    SlurmAccountSync,
    desired_accounts,
)
from gpufleet.jobs.slurm.commands import SlurmCommands
from tests.slurm.conftest import SlurmCluster, start_cluster, wait_until

pytestmark = pytest.mark.slurm

# A second Slurm, apart from the plain one at /tmp/gpufleet-test-slurm (16817/16818, node sim001).
DBD_ENV = {
    "GPUFLEET_SLURM_DBD": "1",
    "GPUFLEET_SLURM_STATE": "/tmp/gpufleet-test-slurmdbd",
    "GPUFLEET_SLURMCTLD_PORT": "16827",
    "GPUFLEET_SLURMD_PORT": "16828",
    "GPUFLEET_SLURMDBD_PORT": "16829",
    "GPUFLEET_SLURM_DB_PORT": "16830",
    "GPUFLEET_SLURM_NODE": "dbd001",
}
DBD_LOCK = Path("/tmp") / "gpufleet-test-slurmdbd.lock"
ACCOUNTS_LOCK = Path("/tmp") / "gpufleet-test-slurmdbd-accounts.lock"


@pytest.fixture(scope="session")
def slurmdbd_cluster() -> Iterator[SlurmCluster]:
    """A real slurmctld + slurmd + slurmdbd + MariaDB + munge, accounting enforced, a fake 4-GPU GRES."""
    yield from start_cluster("Slurm with slurmdbd", DBD_LOCK, DBD_ENV)


@pytest.fixture
def commands(slurmdbd_cluster: SlurmCluster) -> Iterator[SlurmCommands]:
    """The dbd Slurm's programs, held by this test alone (see the module's docstring)."""
    with FileLock(str(ACCOUNTS_LOCK)):
        yield SlurmCommands(slurmdbd_cluster.conf, timeout_s=30)


@pytest.fixture
def sync(commands: SlurmCommands) -> SlurmAccountSync:
    return SlurmAccountSync(commands)


def snapshot(sync: SlurmAccountSync) -> AccountsSnapshot:
    return sync.read(sync.config())


def members(now: AccountsSnapshot, account: str) -> set[str]:
    return {a.user for a in now.associations if a.account == account and a.user}


def gpu_limit(now: AccountsSnapshot, account: str) -> str | None:
    (row,) = [a for a in now.associations if a.account == account and not a.user]
    return row.grp_tres.get("gres/gpu")


def synced(sync: SlurmAccountSync, desired: list[DesiredAccount]) -> None:
    """Sync, every step done, and a second sync finds nothing to do."""
    result = sync.sync(desired)
    assert [(o.step.argv, o.status, o.error) for o in result.outcomes if o.status != "done"] == []
    assert sync.plan(desired).steps == ()


def test_sync_creates_accounts_and_associations_from_projects(
    sync: SlurmAccountSync, sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    with transaction(sessions) as s:
        for name in ("alice", "bob"):
            create_user(s, clock, UserCreate(username=name))
        projects.create_project(s, clock, "vision")
        projects.add_member(s, clock, "vision", "alice")
        projects.add_member(s, clock, "vision", "bob")
        projects.set_quota(s, "vision", max_gpus=2, gpu_hours_budget=None)
        projects.create_project(s, clock, "nlp")
        # Names that are sacctmgr keywords, valid in gpufleet: passed as Name=..., they stay names.
        create_user(s, clock, UserCreate(username="where"))
        projects.create_project(s, clock, "set")
        projects.add_member(s, clock, "set", "where")
    with transaction(sessions, readonly=True) as s:
        desired = desired_accounts(s)
    synced(sync, desired)
    now = snapshot(sync)
    assert now.accounts["vision"].managed
    assert now.accounts["vision"].description == "gpufleet project vision"
    assert members(now, "vision") == {"alice", "bob"}
    assert gpu_limit(now, "vision") == "2"
    assert members(now, "nlp") == set()
    assert gpu_limit(now, "nlp") is None
    assert members(now, "set") == {"where"}
    assert now.default_accounts["alice"] == "vision"


def test_a_gpu_quota_is_enforced_by_slurm(
    sync: SlurmAccountSync, commands: SlurmCommands, slurmdbd_cluster: SlurmCluster
) -> None:
    # Jobs here run as root, so root is the member whose jobs are charged to the account.
    synced(sync, [DesiredAccount("quota", frozenset({"root"}), 1)])
    assert gpu_limit(snapshot(sync), "quota") == "1"
    script = slurmdbd_cluster.jobout / "sleep.sh"
    script.write_text("#!/bin/bash\nsleep 60\n")

    def submit(gpus: int) -> str:
        argv = ["sbatch", "--parsable", "--account=quota", f"--gres=gpu:{gpus}", "-o", "/dev/null", str(script)]
        return commands.run(argv).strip().split(";")[0]

    def state(job: str) -> str:
        return commands.run(["squeue", "-h", "-j", job, "-o", "%T %r"]).strip()

    over, within = submit(2), submit(1)
    try:
        wait_until("the job within the quota to run", lambda: state(within).startswith("RUNNING"))
        wait_until("the job over the quota to pend", lambda: state(over).startswith("PENDING Assoc"))
        assert state(over) == "PENDING AssocGrpGRES"
        # Lifting the quota clears GrpTRES (Slurm starts the waiting job at its next scheduling pass).
        synced(sync, [DesiredAccount("quota", frozenset({"root"}), None)])
        assert gpu_limit(snapshot(sync), "quota") is None
    finally:
        commands.run(["scancel", "--account=quota"])
        # The account cannot be removed while its jobs are active; the next test's sync removes it.
        wait_until("the jobs to end", lambda: commands.run(["squeue", "-h", "--account=quota"]).strip() == "")


def test_removing_a_member_removes_the_association(sync: SlurmAccountSync) -> None:
    both = [DesiredAccount("alpha", frozenset({"carol", "dan"}), None), DesiredAccount("beta", frozenset({"carol"}), 4)]
    synced(sync, both)
    assert snapshot(sync).default_accounts["carol"] == "alpha"
    synced(sync, [DesiredAccount("alpha", frozenset({"dan"}), None), both[1]])
    now = snapshot(sync)
    assert members(now, "alpha") == {"dan"}
    # carol lost her default account alpha: she got beta, the one she keeps, so her jobs still run.
    assert now.default_accounts["carol"] == "beta"
    # A project gone: its account goes with its associations. (dan, who had nothing else, stays a Slurm
    # user with no account and no default: `remove account` does not delete users as `remove user` does.)
    synced(sync, [both[1]])
    now = snapshot(sync)
    assert "alpha" not in {a.account for a in now.associations}
    assert not [a for a in now.associations if a.user == "dan"]
    assert now.default_accounts.get("dan", "") == ""
    assert members(now, "beta") == {"carol"}


def remove_physics(commands: SlurmCommands) -> None:
    try:
        commands.run(["sacctmgr", "-i", "remove", "account", "where", "name=physics", "cluster=gpufleet"])
    except InvalidInput as exc:
        assert "Nothing deleted" in str(exc)  # noqa: PT017 (there was none)


def test_a_hand_made_account_is_left_alone(sync: SlurmAccountSync, commands: SlurmCommands) -> None:
    remove_physics(commands)
    synced(sync, [])  # no gpufleet account left from another test
    made = ["sacctmgr", "-i", "add", "account", "physics", "Description=made by hand", "Organization=physics"]
    commands.run([*made, "Cluster=gpufleet", "GrpTRES=cpu=4,gres/gpu=3"])
    commands.run(["sacctmgr", "-i", "add", "user", "erin", "Account=physics", "Cluster=gpufleet"])
    try:
        before = [a for a in snapshot(sync).associations if a.account == "physics"]
        # A project of the same name, with other members and another quota: noted, not synced.
        desired = [DesiredAccount("physics", frozenset({"frank"}), 1)]
        result = sync.sync(desired)
        assert [o.step.account for o in result.outcomes] == []
        (note,) = result.plan.notes
        assert "not made by gpufleet" in note
        # And no sync without that project removes it.
        synced(sync, [])
        now = snapshot(sync)
        assert [a for a in now.associations if a.account == "physics"] == before
        assert gpu_limit(now, "physics") == "3"
    finally:
        remove_physics(commands)


def test_without_slurmdbd_the_part_says_it_is_off(slurm_cluster: SlurmCluster) -> None:
    plain = SlurmAccountSync(SlurmCommands(slurm_cluster.conf, timeout_s=30))
    with pytest.raises(AccountingOff, match=r"accounts are off.*accounting_storage/none.*slurmdbd"):
        plain.sync([DesiredAccount("vision", frozenset({"alice"}), 1)], dry_run=True)


def app_for(conf: str, sessions: sessionmaker[Session], clock: FakeClock, tmp_path: Path) -> TestClient:
    settings = load_settings(
        client_file=tmp_path / "none.toml",
        data_dir=tmp_path,
        workload_manager="slurm",
        slurm_conf=conf,
        slurm_timeout_s=60,  # a loaded test machine: slow is not unreachable here
    )
    app = create_app(settings, sessions, clock, run_loops=False)
    if not any(getattr(r, "path", "") == API_PREFIX + "/slurm/accounts/sync" for r in app.routes):
        app.include_router(route.router, prefix=API_PREFIX)  # until the app registers the router itself
    with transaction(sessions) as s:
        token = auth.ensure_admin_token(s, clock, None)
    return TestClient(app, headers={"Authorization": f"Bearer {token}"})


def test_the_api_route_plans_syncs_and_audits(
    sync: SlurmAccountSync,
    slurmdbd_cluster: SlurmCluster,
    sessions: sessionmaker[Session],
    clock: FakeClock,
    tmp_path: Path,
) -> None:
    # An account of this run's own: slurmdbd outlives the test's database, and this test runs once per
    # database backend, so a fixed name would already be there, synced, the second time.
    account = f"api{uuid.uuid4().hex[:8]}"
    with transaction(sessions) as s:
        create_user(s, clock, UserCreate(username="grace"))
        projects.create_project(s, clock, account)
        projects.add_member(s, clock, account, "grace")
        projects.set_quota(s, account, max_gpus=3, gpu_hours_budget=None)
    client = app_for(slurmdbd_cluster.conf, sessions, clock, tmp_path)
    dry = client.post("/api/v1/slurm/accounts/sync", params={"dry_run": "true"})
    assert dry.status_code == 200, dry.text
    planned = {(s["action"], s["account"], s["user"]) for s in dry.json()["steps"]}
    assert {("add-account", account, None), ("add-user", account, "grace")} <= planned
    assert {s["status"] for s in dry.json()["steps"]} == {"planned"}, dry.json()
    assert members(snapshot(sync), account) == set()  # the dry run changed nothing

    done = client.post("/api/v1/slurm/accounts/sync")
    assert done.status_code == 200, done.text
    assert (done.json()["failed"], {s["status"] for s in done.json()["steps"]}) == (0, {"done"})
    now = snapshot(sync)
    assert (members(now, account), gpu_limit(now, account)) == ({"grace"}, "3")
    again = client.post("/api/v1/slurm/accounts/sync")
    assert again.json()["steps"] == []
    with transaction(sessions, readonly=True) as s:
        records = audit.list_records(s, action="slurm_accounts.sync_accounts")
    assert [r.result for r in records] == [200, 200, 200]
    assert "would run" in records[-1].target  # the oldest: the dry run


def test_the_api_route_says_the_part_is_off_without_slurmdbd(
    slurm_cluster: SlurmCluster, sessions: sessionmaker[Session], clock: FakeClock, tmp_path: Path
) -> None:
    client = app_for(slurm_cluster.conf, sessions, clock, tmp_path)
    response = client.post("/api/v1/slurm/accounts/sync", params={"dry_run": "true"})
    assert response.status_code == 409
    assert "accounts are off" in response.text
