"""Projects as Slurm accounts, without a Slurm: sacctmgr's and scontrol's output parsed (captured from Slurm
22.05.8 with slurmdbd, tests/fixtures/slurm), the plan computed from it, and the sync's commands run through
a scripted runner: which commands, in which order, what is left alone, and what a failure does."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker
from typer.testing import CliRunner, Result

from gpufleet.api.app import create_app
from gpufleet.api.routers import slurm_accounts as route
from gpufleet.api.served_routes import API_PREFIX
from gpufleet.auth import projects
from gpufleet.auth import service as auth
from gpufleet.auth.policy import Role
from gpufleet.auth.schemas import UserCreate, UserUpdate
from gpufleet.auth.users import create_user, update_user
from gpufleet.cli import slurm_accounts as cli
from gpufleet.cli.state import CliState
from gpufleet.client import HeadClient
from gpufleet.core.clock import FakeClock
from gpufleet.core.config import load_settings
from gpufleet.core.db import transaction
from gpufleet.core.errors import InvalidInput, Unavailable
from gpufleet.jobs.slurm.accounts import (
    AccountingConfig,
    AccountingOff,
    AccountsSnapshot,
    DesiredAccount,
    Plan,
    SlurmAccountSync,
    desired_accounts,
    parse_accounts,
    parse_associations,
    parse_config,
    parse_default_accounts,
    parse_tres,
    plan_sync,
)
from gpufleet.jobs.slurm.commands import Completed, SlurmCommands
from tests.conftest import FIXTURES

SLURM = FIXTURES / "slurm"
# Slurm as captured: gpufleet's proj-a (gres/gpu=2; alice, bob) and proj-b (carol), hand-made physics.
AS_CAPTURED = [
    DesiredAccount("proj-a", frozenset({"alice", "bob"}), 2),
    DesiredAccount("proj-b", frozenset({"carol"}), None),
]


def text(name: str) -> str:
    return (SLURM / name).read_text()


@pytest.fixture
def config() -> AccountingConfig:
    return parse_config(text("scontrol-show-config-slurmdbd.txt"))


@pytest.fixture
def snapshot() -> AccountsSnapshot:
    return AccountsSnapshot(
        accounts=parse_accounts(text("sacctmgr-account.txt")),
        associations=tuple(parse_associations(text("sacctmgr-assoc.txt"))),
        default_accounts=parse_default_accounts(text("sacctmgr-user.txt")),
    )


def commands_of(plan: Plan) -> list[tuple[str, ...]]:
    return [step.argv for step in plan.steps]


# --- parsing ---


def test_config_with_slurmdbd() -> None:
    config = parse_config(text("scontrol-show-config-slurmdbd.txt"))
    assert config.cluster == "gpufleet"
    assert config.storage == "accounting_storage/slurmdbd"
    assert config.enforce == {"associations", "limits"}
    assert config.limits_enforced
    assert "gres/gpu" in config.tres


def test_config_without_slurmdbd() -> None:
    config = parse_config(text("scontrol-show-config-no-dbd.txt"))
    assert (config.cluster, config.storage) == ("gpufleet", "accounting_storage/none")
    assert config.enforce == frozenset()
    assert not config.limits_enforced
    assert "gres/gpu" not in config.tres


def test_config_without_a_cluster_name_is_refused() -> None:
    with pytest.raises(InvalidInput, match="no ClusterName"):
        parse_config("Slurmctld(primary) at vm is UP\n")


def test_associations() -> None:
    rows = parse_associations(text("sacctmgr-assoc.txt"))
    assert len(rows) == 11
    physics = next(r for r in rows if r.account == "physics" and not r.user)
    assert (physics.cluster, physics.parent, dict(physics.grp_tres)) == (
        "gpufleet",
        "root",
        {"cpu": "4", "gres/gpu": "1"},
    )
    dave = next(r for r in rows if r.user == "dave")
    assert (dave.account, dave.partition) == ("physics", "gpu")
    proj_b = next(r for r in rows if r.account == "proj-b" and not r.user)
    assert proj_b.grp_tres == {}


def test_accounts_keep_a_separator_inside_the_description() -> None:
    accounts = parse_accounts(text("sacctmgr-account.txt"))
    assert set(accounts) == {"physics", "proj-a", "proj-b", "root"}
    assert accounts["physics"].description == "made by hand | for physics"
    assert not accounts["physics"].managed
    assert accounts["proj-a"].managed
    assert not accounts["root"].managed


def test_default_accounts() -> None:
    defaults = parse_default_accounts(text("sacctmgr-user.txt"))
    assert defaults["bob"] == "proj-a"
    assert defaults["erin"] == ""  # removed from her default account, Slurm left her none


@pytest.mark.parametrize("bad", ["cpu", "=4", "cpu=4,,gres"])
def test_malformed_tres_is_refused(bad: str) -> None:
    with pytest.raises(InvalidInput, match="TRES"):
        parse_tres(bad)


def test_a_row_of_the_wrong_width_is_refused() -> None:
    with pytest.raises(InvalidInput, match="line 2 has 2 fields, not 6"):
        parse_associations("gpufleet|root||||\ngpufleet|root\n")


# --- the plan ---


def test_slurm_as_it_should_be_needs_no_command(config: AccountingConfig, snapshot: AccountsSnapshot) -> None:
    plan = plan_sync(config, snapshot, AS_CAPTURED)
    assert plan.steps == ()
    assert (plan.cluster, plan.notes, plan.warnings) == ("gpufleet", (), ())


def test_a_new_project_becomes_an_account_with_its_quota(config: AccountingConfig, snapshot: AccountsSnapshot) -> None:
    plan = plan_sync(config, snapshot, [*AS_CAPTURED, DesiredAccount("proj-c", frozenset({"alice", "erin"}), 1)])
    assert commands_of(plan) == [
        (
            "sacctmgr", "-i", "add", "account", "Name=proj-c", "Description=gpufleet project proj-c",
            "Organization=gpufleet", "Cluster=gpufleet", "GrpTRES=gres/gpu=1",
        ),
        ("sacctmgr", "-i", "add", "user", "Name=alice", "Account=proj-c", "Cluster=gpufleet"),
        ("sacctmgr", "-i", "add", "user", "Name=erin", "Account=proj-c", "Cluster=gpufleet"),
    ]  # fmt: skip
    assert [s.action for s in plan.steps] == ["add-account", "add-user", "add-user"]


def test_quotas_set_changed_and_cleared(config: AccountingConfig, snapshot: AccountsSnapshot) -> None:
    plan = plan_sync(
        config,
        snapshot,
        [
            DesiredAccount("proj-a", frozenset({"alice", "bob"}), None),
            DesiredAccount("proj-b", frozenset({"carol"}), 0),
        ],
    )
    assert commands_of(plan) == [
        (
            "sacctmgr",
            "-i",
            "modify",
            "account",
            "where",
            "name=proj-a",
            "cluster=gpufleet",
            "set",
            "GrpTRES=gres/gpu=-1",
        ),
        (
            "sacctmgr",
            "-i",
            "modify",
            "account",
            "where",
            "name=proj-b",
            "cluster=gpufleet",
            "set",
            "GrpTRES=gres/gpu=0",
        ),
    ]
    assert [s.why for s in plan.steps] == ["project proj-a has no GPU limit", "project proj-b has at most 0 GPUs"]


def test_a_removed_member_loses_the_association(config: AccountingConfig, snapshot: AccountsSnapshot) -> None:
    plan = plan_sync(config, snapshot, [DesiredAccount("proj-a", frozenset({"bob"}), 2), AS_CAPTURED[1]])
    # alice had only proj-a: Slurm deletes her user with it, no default to move.
    assert commands_of(plan) == [
        ("sacctmgr", "-i", "remove", "user", "where", "name=alice", "account=proj-a", "cluster=gpufleet")
    ]


def test_a_member_losing_the_default_account_gets_another_first(
    config: AccountingConfig, snapshot: AccountsSnapshot
) -> None:
    plan = plan_sync(config, snapshot, [DesiredAccount("proj-a", frozenset({"alice"}), 2), AS_CAPTURED[1]])
    # bob's default is proj-a; he keeps the hand-made physics, which becomes his default before the removal.
    assert commands_of(plan) == [
        ("sacctmgr", "-i", "modify", "user", "where", "name=bob", "cluster=gpufleet", "set", "DefaultAccount=physics"),
        ("sacctmgr", "-i", "remove", "user", "where", "name=bob", "account=proj-a", "cluster=gpufleet"),
    ]


def test_the_new_default_may_be_an_account_the_plan_adds(config: AccountingConfig, snapshot: AccountsSnapshot) -> None:
    plan = plan_sync(config, snapshot, [AS_CAPTURED[0], DesiredAccount("proj-b", frozenset({"alice"}), None)])
    assert [(s.action, s.user, s.account) for s in plan.steps] == [
        ("add-user", "alice", "proj-b"),
        ("remove-user", "carol", "proj-b"),  # carol had only proj-b: no default left to give her
    ]
    everyone_to_b = [
        DesiredAccount("proj-a", frozenset(), 2),
        DesiredAccount("proj-b", frozenset({"alice", "carol"}), None),
    ]
    plan = plan_sync(config, snapshot, everyone_to_b)
    assert [(s.action, s.user, s.account) for s in plan.steps] == [
        ("add-user", "alice", "proj-b"),
        ("set-default-account", "alice", "proj-b"),  # after she joins proj-b, before she leaves proj-a
        ("set-default-account", "bob", "physics"),
        ("remove-user", "alice", "proj-a"),
        ("remove-user", "bob", "proj-a"),
    ]


def test_a_project_gone_removes_its_account(config: AccountingConfig, snapshot: AccountsSnapshot) -> None:
    plan = plan_sync(config, snapshot, [AS_CAPTURED[0]])
    # The account's removal takes carol's association with it: no separate remove-user.
    assert commands_of(plan) == [("sacctmgr", "-i", "remove", "account", "where", "name=proj-b", "cluster=gpufleet")]


def test_no_project_at_all_removes_only_gpufleets_accounts(
    config: AccountingConfig, snapshot: AccountsSnapshot
) -> None:
    plan = plan_sync(config, snapshot, [])
    assert [(s.action, s.account) for s in plan.steps] == [
        ("set-default-account", "physics"),  # bob, whose default proj-a goes
        ("remove-account", "proj-a"),
        ("remove-account", "proj-b"),
    ]
    touched = {s.account for s in plan.steps if s.action != "set-default-account"}
    assert touched.isdisjoint({"physics", "root"})


def test_a_hand_made_account_is_left_alone(config: AccountingConfig, snapshot: AccountsSnapshot) -> None:
    plan = plan_sync(config, snapshot, [*AS_CAPTURED, DesiredAccount("physics", frozenset({"alice"}), 8)])
    assert plan.steps == ()
    (note,) = plan.notes
    assert "physics" in note
    assert "not made by gpufleet" in note
    assert "'physics'" in note  # its organization


def test_the_root_account_is_never_taken_over(config: AccountingConfig, snapshot: AccountsSnapshot) -> None:
    plan = plan_sync(config, snapshot, [*AS_CAPTURED, DesiredAccount("root", frozenset(), 0)])
    assert plan.steps == ()
    assert len(plan.notes) == 1


def test_other_clusters_associations_are_ignored(config: AccountingConfig, snapshot: AccountsSnapshot) -> None:
    other = AccountingConfig("elsewhere", config.storage, config.enforce, config.tres)
    plan = plan_sync(other, snapshot, [AS_CAPTURED[0]])
    assert [s.action for s in plan.steps] == ["add-account", "add-user", "add-user"]
    assert all("Cluster=elsewhere" in s.argv for s in plan.steps)


def test_without_gres_gpu_in_the_tres_quotas_are_not_set(config: AccountingConfig, snapshot: AccountsSnapshot) -> None:
    no_gpu = AccountingConfig(config.cluster, config.storage, config.enforce, config.tres - {"gres/gpu"})
    plan = plan_sync(no_gpu, snapshot, [DesiredAccount("proj-a", frozenset({"alice", "bob"}), 7), AS_CAPTURED[1]])
    assert plan.steps == ()
    (warning,) = plan.warnings
    assert "AccountingStorageTRES lacks gres/gpu" in warning
    plan = plan_sync(no_gpu, snapshot, [*AS_CAPTURED, DesiredAccount("proj-c", frozenset(), 3)])
    assert not any(a.startswith("GrpTRES") for a in plan.steps[0].argv)


def test_without_enforced_limits_a_warning(config: AccountingConfig, snapshot: AccountsSnapshot) -> None:
    lax = AccountingConfig(config.cluster, config.storage, frozenset({"associations"}), config.tres)
    plan = plan_sync(lax, snapshot, AS_CAPTURED)
    assert plan.warnings == (
        "AccountingStorageEnforce lacks limits: Slurm records the GPU quotas but does not enforce them",
    )
    safe = AccountingConfig(config.cluster, config.storage, frozenset({"safe"}), config.tres)
    assert plan_sync(safe, snapshot, AS_CAPTURED).warnings == ()


# --- the sync, through a scripted Slurm ---


Answer = Callable[[Sequence[str]], Completed | None]
READS = {"assoc": "sacctmgr-assoc.txt", "account": "sacctmgr-account.txt", "user": "sacctmgr-user.txt"}


class ScriptedSlurm:
    """Answers scontrol and sacctmgr's reads with the captured outputs, and each change with `change`
    (success by default); records every argv."""

    def __init__(self, config: str = "scontrol-show-config-slurmdbd.txt", change: Answer | None = None) -> None:
        self.config = config
        self.change = change
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, argv: Sequence[str], *, env: Mapping[str, str], timeout_s: float) -> Completed:
        self.calls.append(tuple(argv))
        if argv[0] == "scontrol":
            return Completed(tuple(argv), 0, text(self.config), "")
        if "show" in argv:
            kind = argv[argv.index("show") + 1]
            return Completed(tuple(argv), 0, text(READS[kind]), "")
        answer = self.change(argv) if self.change else None
        return answer or Completed(tuple(argv), 0, " Adding ...\n", "")

    def changes(self) -> list[tuple[str, ...]]:
        return [c for c in self.calls if c[:2] == ("sacctmgr", "-i")]


def syncer(slurm: ScriptedSlurm) -> SlurmAccountSync:
    return SlurmAccountSync(SlurmCommands("/etc/slurm/slurm.conf", runner=slurm, base_env={}))


def test_without_slurmdbd_the_part_is_off_before_any_sacctmgr() -> None:
    slurm = ScriptedSlurm("scontrol-show-config-no-dbd.txt")
    with pytest.raises(AccountingOff, match=r"accounts are off.*accounting_storage/none.*slurmdbd") as caught:
        syncer(slurm).sync(AS_CAPTURED)
    assert caught.value.http_status == 409
    assert [c[0] for c in slurm.calls] == ["scontrol"]


def test_sacctmgr_saying_no_slurmdbd_turns_the_part_off() -> None:
    def no_dbd(argv: Sequence[str], *, env: Mapping[str, str], timeout_s: float) -> Completed:
        if argv[0] == "scontrol":
            return Completed(tuple(argv), 0, text("scontrol-show-config-slurmdbd.txt"), "")
        return Completed(tuple(argv), 1, "", text("sacctmgr-no-dbd-stderr.txt"))

    with pytest.raises(AccountingOff, match="not slurmdbd"):
        SlurmAccountSync(SlurmCommands(runner=no_dbd, base_env={})).plan(AS_CAPTURED)


def test_slurmdbd_down_is_unavailable() -> None:
    def down(argv: Sequence[str], *, env: Mapping[str, str], timeout_s: float) -> Completed:
        if argv[0] == "scontrol":
            return Completed(tuple(argv), 0, text("scontrol-show-config-slurmdbd.txt"), "")
        return Completed(tuple(argv), 1, "", text("sacctmgr-dbd-down-stderr.txt"))

    with pytest.raises(Unavailable, match="Connection refused"):
        SlurmAccountSync(SlurmCommands(runner=down, base_env={})).plan(AS_CAPTURED)


def test_reads_are_argument_lists_for_this_cluster() -> None:
    slurm = ScriptedSlurm()
    syncer(slurm).plan(AS_CAPTURED)
    assert slurm.calls == [
        ("scontrol", "show", "config"),
        ("sacctmgr", "-P", "-n", "show", "account", "format=Account,Organization,Description"),
        ("sacctmgr", "-P", "-n", "show", "assoc", "where", "cluster=gpufleet",
         "format=Cluster,Account,User,Partition,ParentName,GrpTRES"),
        ("sacctmgr", "-P", "-n", "show", "user", "format=User,DefaultAccount"),
    ]  # fmt: skip


def test_a_dry_run_changes_nothing() -> None:
    slurm = ScriptedSlurm()
    result = syncer(slurm).sync([AS_CAPTURED[0]], dry_run=True)
    assert [o.status for o in result.outcomes] == ["planned"]
    assert result.outcomes[0].step.action == "remove-account"
    assert slurm.changes() == []
    assert result.failed == 0


def test_the_sync_runs_the_plan_in_order() -> None:
    slurm = ScriptedSlurm()
    desired = [DesiredAccount("proj-a", frozenset({"alice"}), 4), DesiredAccount("proj-c", frozenset({"dave"}), None)]
    result = syncer(slurm).sync(desired)
    assert slurm.changes() == [s.argv for s in result.plan.steps]
    assert [s.action for s in result.plan.steps] == [
        "add-account", "set-gpu-limit", "add-user", "set-default-account", "remove-user", "remove-account",
    ]  # fmt: skip
    assert {o.status for o in result.outcomes} == {"done"}


def test_a_refused_step_fails_alone_and_an_existing_change_is_not_a_failure() -> None:
    def change(argv: Sequence[str]) -> Completed | None:
        if "name=bob" in argv and "remove" in argv:
            return Completed(tuple(argv), 1, "", " Error with request: Job(s) active, cancel job(s) before remove\n")
        if "add" in argv and "user" in argv:
            return Completed(tuple(argv), 1, " Nothing new added.\n", "")
        return None

    slurm = ScriptedSlurm(change=change)
    desired = [DesiredAccount("proj-a", frozenset({"alice", "erin"}), 2)]
    result = syncer(slurm).sync(desired)
    statuses = [(o.step.action, o.step.user or o.step.account, o.status) for o in result.outcomes]
    assert statuses == [
        ("add-user", "erin", "unchanged"),
        ("set-default-account", "bob", "done"),
        ("remove-user", "bob", "failed"),
        ("remove-account", "proj-b", "done"),  # ran although the step before failed
    ]
    failed = result.outcomes[2]
    assert failed.error is not None
    assert "Job(s) active" in failed.error
    assert result.failed == 1


def test_once_slurm_is_unreachable_the_rest_is_not_run() -> None:
    def change(argv: Sequence[str]) -> Completed | None:
        return Completed(tuple(argv), 1, "", text("sacctmgr-dbd-down-stderr.txt"))

    slurm = ScriptedSlurm(change=change)
    result = syncer(slurm).sync([])
    assert [o.status for o in result.outcomes] == ["failed", "not run", "not run"]
    assert len(slurm.changes()) == 1
    assert result.failed == 3


# --- gpufleet's side: projects, members and quotas from the database ---


def add_user(session: Session, clock: FakeClock, name: str) -> None:
    create_user(session, clock, UserCreate(username=name))


def test_desired_accounts_from_projects(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    with transaction(sessions) as s:
        for name in ("alice", "bob", "carol"):
            add_user(s, clock, name)
        projects.create_project(s, clock, "vision")
        projects.create_project(s, clock, "nlp")
        for user in ("alice", "bob", "carol"):
            projects.add_member(s, clock, "vision", user)
        projects.set_quota(s, "vision", max_gpus=8, gpu_hours_budget=None)
        update_user(s, clock, "carol", UserUpdate(enabled=False))
    with transaction(sessions, readonly=True) as s:
        desired = desired_accounts(s)
    assert desired == [
        DesiredAccount("nlp", frozenset(), None),
        DesiredAccount("vision", frozenset({"alice", "bob"}), 8),  # carol is disabled: no association
    ]


# --- the API route and the CLI (the route is registered by the app; here it is added by hand) ---


@pytest.fixture
def api(sessions: sessionmaker[Session], clock: FakeClock, tmp_path: Path) -> TestClient:
    settings = load_settings(client_file=tmp_path / "none.toml", data_dir=tmp_path)
    app = create_app(settings, sessions, clock, run_loops=False)
    if not any(getattr(r, "path", "") == API_PREFIX + "/slurm/accounts/sync" for r in app.routes):
        app.include_router(route.router, prefix=API_PREFIX)
    return TestClient(app)


def token(sessions: sessionmaker[Session], clock: FakeClock, role: Role) -> dict[str, str]:
    with transaction(sessions) as s:
        secret = auth.create_api_token(s, clock, f"{role} token", role, None)
    return {"Authorization": f"Bearer {secret}"}


def test_the_route_needs_projects_write(api: TestClient, sessions: sessionmaker[Session], clock: FakeClock) -> None:
    response = api.post("/api/v1/slurm/accounts/sync", headers=token(sessions, clock, Role.VIEWER))
    assert response.status_code == 403


def test_the_route_refuses_without_slurm_as_the_workload_manager(
    api: TestClient, sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    response = api.post("/api/v1/slurm/accounts/sync?dry_run=true", headers=token(sessions, clock, Role.ADMIN))
    assert response.status_code == 409
    assert "workload_manager = 'slurm'" in response.text


def test_slurm_commands_follow_the_settings(tmp_path: Path) -> None:
    settings = load_settings(
        client_file=tmp_path / "none.toml",
        data_dir=tmp_path,
        workload_manager="slurm",
        slurm_conf=tmp_path / "slurm.conf",
        slurm_timeout_s=3,
    )
    commands = route.slurm_commands(settings)
    assert (commands.slurm_conf, commands.timeout_s) == (str(tmp_path / "slurm.conf"), 3)


SYNCED = {
    "cluster": "gpufleet",
    "dry_run": True,
    "steps": [
        {
            "action": "add-user",
            "account": "proj-a",
            "user": "erin",
            "argv": ["sacctmgr", "-i", "add", "user", "Name=erin", "Account=proj-a", "Cluster=gpufleet"],
            "why": "erin is a member of project proj-a",
            "status": "planned",
            "error": None,
        }
    ],
    "notes": ["account physics exists in Slurm and was not made by gpufleet"],
    "warnings": [],
    "failed": 0,
}


def run_cli(monkeypatch: pytest.MonkeyPatch, answer: dict[str, object], *args: str) -> tuple[Result, httpx.Request]:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=answer)

    transport = httpx.MockTransport(handler)
    monkeypatch.setattr(CliState, "client", lambda self: HeadClient("http://head", "t", transport=transport))
    result = CliRunner().invoke(cli.app, list(args), obj=CliState())
    (request,) = seen
    return result, request


def test_cli_dry_run_prints_the_commands(monkeypatch: pytest.MonkeyPatch) -> None:
    result, request = run_cli(monkeypatch, SYNCED, "sync", "--dry-run")
    assert (request.method, request.url.path, request.url.params["dry_run"]) == ("POST", cli.SYNC_PATH, "true")
    output = result.stdout
    assert result.exit_code == 0, output
    assert "would run 1 sacctmgr commands" in output
    assert "sacctmgr -i add user Name=erin Account=proj-a Cluster=gpufleet" in output
    assert "left alone: account physics" in output


def test_cli_exits_non_zero_when_a_step_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    failed = SYNCED | {"dry_run": False, "failed": 1}
    result, request = run_cli(monkeypatch, failed, "sync", "-o", "json")
    assert request.url.params["dry_run"] == "false"
    assert result.exit_code == 1
    assert '"failed": 1' in result.stdout
