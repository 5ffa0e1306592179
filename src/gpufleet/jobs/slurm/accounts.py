"""gpufleet's projects as Slurm accounts (needs slurmdbd): members as associations, GPU quotas as GrpTRES.

One sync reads Slurm's accounts, associations and users (`sacctmgr -P -n show ...`), compares them with
gpufleet's projects in a pure function (`plan_sync`) and applies the difference with `sacctmgr -i`:

- a project becomes an account of the same name under `root`, with Organization "gpufleet" (the mark of
  the accounts gpufleet manages; Slurm lowercases it) and Description "gpufleet project <name>";
- each enabled member becomes an association (user = the gpufleet user name, which is the user's login
  name on the nodes); a member removed from the project loses the association;
- `Project.max_gpus` becomes the account's `GrpTRES=gres/gpu=N` (None clears it: `gres/gpu=-1`); other
  TRES limits on the account are left as they are;
- a gpufleet account whose project is gone is removed from the cluster.

An account gpufleet did not make (another Organization) is never changed or removed, even when a project
has its name: the plan notes it and leaves it alone. Users whose default account would be removed get
another of their accounts as default first, so their jobs without `--account` keep working.

Without slurmdbd (AccountingStorageType is not accounting_storage/slurmdbd) the whole part is off:
`AccountingOff` (409) says so, before any sacctmgr command runs.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from sqlalchemy.orm import Session

from gpufleet.auth.projects import list_projects
from gpufleet.core.errors import Conflict, GpufleetError, InvalidInput, Unavailable
from gpufleet.jobs.slurm.commands import SlurmCommands

MANAGED_ORG = "gpufleet"  # Organization of the accounts gpufleet made (Slurm stores it lowercased)
GPU_TRES = "gres/gpu"
SLURMDBD = "accounting_storage/slurmdbd"
ASSOC_FORMAT = "format=Cluster,Account,User,Partition,ParentName,GrpTRES"
# Description last: it is free text and may hold the field separator '|'.
ACCOUNT_FORMAT = "format=Account,Organization,Description"
USER_FORMAT = "format=User,DefaultAccount"
# What sacctmgr prints when there is no slurmdbd to talk to (Slurm 22.05, accounting_storage/none).
_NO_DBD = re.compile(r"not running a supported accounting_storage plugin", re.IGNORECASE)
# sacctmgr exits 1 when a change is already in place (another sync got there first): not a failure.
_ALREADY = re.compile(r"Nothing (new )?(added|deleted|modified)", re.IGNORECASE)


class AccountingOff(Conflict):
    """This Slurm has no slurmdbd, so there are no accounts to map projects to."""

    def __init__(self, storage: str) -> None:
        super().__init__(
            f"Slurm accounts are off: this Slurm's accounting storage is {storage}, not {SLURMDBD}; "
            "gpufleet maps projects to Slurm accounts only with slurmdbd (see docs/slurm.md, Accounts)"
        )


@dataclass(frozen=True)
class AccountingConfig:
    """What `scontrol show config` says about accounting."""

    cluster: str
    storage: str
    enforce: frozenset[str]
    tres: frozenset[str]

    @property
    def limits_enforced(self) -> bool:
        # `safe` implies `limits` (slurm.conf(5), AccountingStorageEnforce).
        return bool({"limits", "safe"} & self.enforce)


@dataclass(frozen=True)
class SlurmAccount:
    name: str
    organization: str
    description: str

    @property
    def managed(self) -> bool:
        return self.organization.lower() == MANAGED_ORG


@dataclass(frozen=True)
class Association:
    """One row of `sacctmgr show assoc`: an account's own (user "") or a user's."""

    cluster: str
    account: str
    user: str
    partition: str
    parent: str
    grp_tres: Mapping[str, str]


@dataclass(frozen=True)
class AccountsSnapshot:
    """Slurm's side, as read: accounts (every cluster's), this cluster's associations, users' defaults."""

    accounts: Mapping[str, SlurmAccount]
    associations: tuple[Association, ...]
    default_accounts: Mapping[str, str]


@dataclass(frozen=True)
class DesiredAccount:
    """gpufleet's side: one project, its members' user names and its GPU quota."""

    name: str
    users: frozenset[str]
    max_gpus: int | None


@dataclass(frozen=True)
class Step:
    """One sacctmgr command of a plan, and why."""

    action: str  # add-account, set-gpu-limit, add-user, set-default-account, remove-user, remove-account
    account: str
    user: str | None
    argv: tuple[str, ...]
    why: str


@dataclass(frozen=True)
class Plan:
    cluster: str
    steps: tuple[Step, ...]
    notes: tuple[str, ...] = ()  # what was left alone, and why
    warnings: tuple[str, ...] = ()  # configuration that keeps quotas from working


@dataclass(frozen=True)
class Outcome:
    step: Step
    status: str  # planned (dry run), done, unchanged, failed, not run
    error: str | None = None


@dataclass(frozen=True)
class SyncResult:
    plan: Plan
    outcomes: tuple[Outcome, ...] = field(default=())

    @property
    def failed(self) -> int:
        return sum(o.status in {"failed", "not run"} for o in self.outcomes)


# --- parsing (outputs of Slurm 22.05, tests/fixtures/slurm) ---


def parse_config(text: str) -> AccountingConfig:
    """`scontrol show config` → the cluster name and accounting settings. Raises InvalidInput if the
    output has no ClusterName (not scontrol's output)."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip()] = value.strip()
    cluster = values.get("ClusterName", "")
    if not cluster or cluster == "(null)":
        raise InvalidInput("Slurm: scontrol show config printed no ClusterName")

    def words(key: str) -> frozenset[str]:
        raw = values.get(key, "")
        return frozenset() if raw in {"", "none", "(null)"} else frozenset(w.strip() for w in raw.split(","))

    return AccountingConfig(
        cluster=cluster,
        storage=values.get("AccountingStorageType", "(not set)"),
        enforce=words("AccountingStorageEnforce"),
        tres=words("AccountingStorageTRES"),
    )


def parse_tres(text: str) -> dict[str, str]:
    """`cpu=4,gres/gpu=1` → {"cpu": "4", "gres/gpu": "1"}; "" → {}."""
    found: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InvalidInput(f"Slurm: a TRES limit is not name=value: {item!r}")
        found[key] = value
    return found


def _rows(text: str, fields: int, what: str) -> Iterable[list[str]]:
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split("|", fields - 1)
        if len(parts) != fields:
            raise InvalidInput(f"Slurm: sacctmgr show {what} line {number} has {len(parts)} fields, not {fields}")
        yield parts


def parse_associations(text: str) -> list[Association]:
    """`sacctmgr -P -n show assoc format=Cluster,Account,User,Partition,ParentName,GrpTRES`."""
    return [
        Association(cluster, account, user, partition, parent, parse_tres(tres))
        for cluster, account, user, partition, parent, tres in _rows(text, 6, "assoc")
    ]


def parse_accounts(text: str) -> dict[str, SlurmAccount]:
    """`sacctmgr -P -n show account format=Account,Organization,Description`, by name."""
    return {name: SlurmAccount(name, org, descr) for name, org, descr in _rows(text, 3, "account")}


def parse_default_accounts(text: str) -> dict[str, str]:
    """`sacctmgr -P -n show user format=User,DefaultAccount`: user → default account ("" when none)."""
    return {row[0]: row[1] for row in _rows(text, 2, "user")}


# --- the plan (pure) ---


def _sacctmgr(*args: str) -> tuple[str, ...]:
    return ("sacctmgr", "-i", *args)  # -i: commit without asking


def _gpu_limit(max_gpus: int | None) -> str:
    return f"GrpTRES={GPU_TRES}={-1 if max_gpus is None else max_gpus}"


def _config_warnings(config: AccountingConfig) -> tuple[str, ...]:
    if GPU_TRES not in config.tres:
        return (f"AccountingStorageTRES lacks {GPU_TRES}: GPU quotas are not set in Slurm; add it to slurm.conf",)
    if not config.limits_enforced:
        return ("AccountingStorageEnforce lacks limits: Slurm records the GPU quotas but does not enforce them",)
    return ()


@dataclass
class _Draft:
    """The plan being built, phase by phase (the order the commands must run in)."""

    cluster: str
    quotas: bool
    adds: list[Step] = field(default_factory=list)
    limits: list[Step] = field(default_factory=list)
    joins: list[Step] = field(default_factory=list)
    leaves: list[tuple[str, str]] = field(default_factory=list)  # (account, user)
    removed_accounts: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def account(self, want: DesiredAccount, own_row: Association | None, have: set[str]) -> None:
        """Steps for one project whose account is gpufleet's (or does not exist yet)."""
        name, cluster = want.name, self.cluster
        if own_row is None:
            # Name=, not a bare name: a project or user called "where" or "set" is then not a keyword.
            argv = [
                "add",
                "account",
                f"Name={name}",
                f"Description=gpufleet project {name}",
                f"Organization={MANAGED_ORG}",
            ]
            argv.append(f"Cluster={cluster}")
            if self.quotas and want.max_gpus is not None:
                argv.append(_gpu_limit(want.max_gpus))
            self.adds.append(Step("add-account", name, None, _sacctmgr(*argv), f"project {name} has no Slurm account"))
        elif self.quotas and own_row.grp_tres.get(GPU_TRES) != (None if want.max_gpus is None else str(want.max_gpus)):
            limit = "no GPU limit" if want.max_gpus is None else f"at most {want.max_gpus} GPUs"
            argv = [
                "modify",
                "account",
                "where",
                f"name={name}",
                f"cluster={cluster}",
                "set",
                _gpu_limit(want.max_gpus),
            ]
            self.limits.append(Step("set-gpu-limit", name, None, _sacctmgr(*argv), f"project {name} has {limit}"))
        for user in sorted(want.users - have):
            argv = ["add", "user", f"Name={user}", f"Account={name}", f"Cluster={cluster}"]
            self.joins.append(Step("add-user", name, user, _sacctmgr(*argv), f"{user} is a member of project {name}"))
        self.leaves += [(name, user) for user in sorted(have - want.users)]

    def removals(self) -> list[Step]:
        where = f"cluster={self.cluster}"
        steps = [
            Step(
                "remove-user",
                account,
                user,
                _sacctmgr("remove", "user", "where", f"name={user}", f"account={account}", where),
                f"{user} is not a member of project {account}",
            )
            for account, user in self.leaves
            if account not in self.removed_accounts  # removing the account removes its users' associations
        ]
        steps += [
            Step(
                "remove-account",
                name,
                None,
                _sacctmgr("remove", "account", "where", f"name={name}", where),
                f"gpufleet made account {name} and project {name} no longer exists",
            )
            for name in self.removed_accounts
        ]
        return steps


def plan_sync(config: AccountingConfig, slurm: AccountsSnapshot, desired: Iterable[DesiredAccount]) -> Plan:
    """The sacctmgr commands that make Slurm's gpufleet accounts match `desired`, in an order that works:
    accounts and limits, new associations, default accounts moved, then removals. Touches only accounts
    whose Organization is gpufleet's; a plan for Slurm as it already is has no steps."""
    wanted = {d.name: d for d in desired}
    assocs = [a for a in slurm.associations if a.cluster == config.cluster]
    own_rows = {a.account: a for a in assocs if not a.user and not a.partition}
    members: dict[str, set[str]] = {}
    for a in assocs:
        if a.user:
            members.setdefault(a.account, set()).add(a.user)

    draft = _Draft(config.cluster, quotas=GPU_TRES in config.tres)
    for name in sorted(wanted):
        account = slurm.accounts.get(name)
        if account is not None and not account.managed:
            draft.notes.append(
                f"account {name} exists in Slurm and was not made by gpufleet (organization "
                f"{account.organization!r}): left alone, its users and limits are not synced"
            )
        else:
            draft.account(wanted[name], own_rows.get(name), members.get(name, set()))
    for name in sorted(set(own_rows) - set(wanted)):
        account = slurm.accounts.get(name)
        if account is not None and account.managed:
            draft.removed_accounts.append(name)
            draft.leaves += [(name, user) for user in sorted(members.get(name, ()))]

    # Every account each user will have here once the plan has run (hand-made ones too).
    after: dict[str, set[str]] = {}
    for held, users in members.items():
        for user in users:
            after.setdefault(user, set()).add(held)
    for step in draft.joins:
        after.setdefault(step.user or "", set()).add(step.account)
    for left, user in draft.leaves:
        after[user].discard(left)
    defaults = _default_moves(slurm.default_accounts, config.cluster, draft.leaves, after)
    steps = (*draft.adds, *draft.limits, *draft.joins, *defaults, *draft.removals())
    return Plan(config.cluster, steps, tuple(draft.notes), _config_warnings(config))


def _default_moves(
    defaults: Mapping[str, str], cluster: str, leaves: list[tuple[str, str]], after: Mapping[str, set[str]]
) -> list[Step]:
    """Default accounts to set before the removals: a user losing their default account gets another they
    keep (Slurm would leave them with none, and their jobs without --account refused). A user joining with
    no default needs nothing: `sacctmgr add user` makes the account their default."""
    moves: dict[str, tuple[str, str]] = {}
    for account, user in leaves:
        if defaults.get(user) == account and after.get(user):
            moves[user] = (min(after[user]), f"{user}'s default account {account} is being removed")
    return [
        Step(
            "set-default-account",
            account,
            user,
            _sacctmgr(
                "modify", "user", "where", f"name={user}", f"cluster={cluster}", "set", f"DefaultAccount={account}"
            ),
            why,
        )
        for user, (account, why) in sorted(moves.items())
    ]


# --- reading and applying, through SlurmCommands ---


class SlurmAccountSync:
    """Reads Slurm's accounts, plans and applies a sync, with `sacctmgr` through `SlurmCommands`."""

    def __init__(self, commands: SlurmCommands) -> None:
        self.commands = commands

    def _sacctmgr(self, argv: list[str]) -> str:
        try:
            return self.commands.run(argv)
        except InvalidInput as exc:
            if _NO_DBD.search(str(exc)):
                raise AccountingOff(
                    "not slurmdbd (sacctmgr: 'not running a supported accounting_storage plugin')"
                ) from None
            raise

    def config(self) -> AccountingConfig:
        """The cluster and its accounting settings. Raises AccountingOff without slurmdbd, Unavailable
        when slurmctld cannot be reached."""
        config = parse_config(self.commands.run(["scontrol", "show", "config"]))
        if config.storage != SLURMDBD:
            raise AccountingOff(config.storage)
        return config

    def read(self, config: AccountingConfig) -> AccountsSnapshot:
        """Slurm's accounts, this cluster's associations and users' default accounts."""
        assoc = ["sacctmgr", "-P", "-n", "show", "assoc", "where", f"cluster={config.cluster}", ASSOC_FORMAT]
        return AccountsSnapshot(
            accounts=parse_accounts(self._sacctmgr(["sacctmgr", "-P", "-n", "show", "account", ACCOUNT_FORMAT])),
            associations=tuple(parse_associations(self._sacctmgr(assoc))),
            default_accounts=parse_default_accounts(
                self._sacctmgr(["sacctmgr", "-P", "-n", "show", "user", USER_FORMAT])
            ),
        )

    def plan(self, desired: Iterable[DesiredAccount]) -> Plan:
        config = self.config()
        return plan_sync(config, self.read(config), desired)

    def sync(self, desired: Iterable[DesiredAccount], *, dry_run: bool = False) -> SyncResult:
        """Plan, and unless `dry_run` apply the steps in order. A step Slurm refuses is recorded as failed
        and the others still run (a re-run retries it); once Slurm cannot be reached the rest are not run."""
        plan = self.plan(desired)
        if dry_run:
            return SyncResult(plan, tuple(Outcome(step, "planned") for step in plan.steps))
        outcomes: list[Outcome] = []
        reachable = True
        for step in plan.steps:
            if not reachable:
                outcomes.append(Outcome(step, "not run"))
                continue
            try:
                self._sacctmgr(list(step.argv))
            except Unavailable as exc:
                reachable = False
                outcomes.append(Outcome(step, "failed", str(exc)))
            except GpufleetError as exc:
                status = "unchanged" if _ALREADY.search(str(exc)) else "failed"
                outcomes.append(Outcome(step, status, None if status == "unchanged" else str(exc)))
            else:
                outcomes.append(Outcome(step, "done"))
        return SyncResult(plan, tuple(outcomes))


def desired_accounts(session: Session) -> list[DesiredAccount]:
    """gpufleet's projects as Slurm should see them: members who are enabled, by user name (their login
    name on the nodes), and the GPU quota."""
    return [
        DesiredAccount(
            name=project.name,
            users=frozenset(m.user.username for m in project.members if m.user.enabled),
            max_gpus=project.max_gpus,
        )
        for project in list_projects(session)
    ]
