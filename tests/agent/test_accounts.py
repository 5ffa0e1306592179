"""Accounts on nodes: the argv the sync would run (fake runner), then the real useradd/usermod/groupadd
against a throwaway root directory, never the test machine's own /etc."""

from __future__ import annotations

import json
import os
import shutil
import stat
from collections.abc import Sequence
from pathlib import Path

import pytest

from gpufleet.agent.accounts import AccountSync, CommandFailed, ManagedState, _Pass, run_command
from gpufleet.agent.authorized_keys import HEADER
from gpufleet.agent.passwd import LocalAccounts, read_local_accounts
from gpufleet.core.errors import ConfigError
from gpufleet.protocol.accounts import Account, AccountList
from tests.conftest import need

KEY_A = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHRoaXNpc25vdGFyZWFsa2V5anVzdGFmaXh0dXJlISE bob@laptop"
KEY_B = "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQC7dGVzdGtleQ== bob@desktop"
KEY_C = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGNhcm9sY2Fyb2xjYXJvbGNhcm9sY2Fyb2xjYXJvbA carol@x"

PASSWD = (
    "root:x:0:0:root:/root:/bin/bash\n"
    "daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n"
    "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
    "alice:x:1500:1500:Local Alice:/home/alice:/bin/sh\n"
)
GROUP = "root:x:0:\ndaemon:x:1:\nsudo:x:27:\nnogroup:x:65534:\nalice:x:1500:\n"
SHADOW = (
    "root:*:19000:0:99999:7:::\n"
    "daemon:*:19000:0:99999:7:::\n"
    "nobody:*:19000:0:99999:7:::\n"
    "alice:$6$salt$localhash:19000:0:99999:7:::\n"
)
GSHADOW = "root:*::\ndaemon:*::\nsudo:*::\nnogroup:*::\nalice:!::\n"
LOGIN_DEFS = "UID_MIN 1000\nUID_MAX 60000\nGID_MIN 1000\nGID_MAX 60000\nUMASK 022\n"
SBIN = os.environ.get("PATH", "") + ":/usr/local/sbin:/usr/sbin:/sbin"


def make_root(base: Path, *, homes: bool) -> Path:
    """A minimal system root: etc/passwd, group, shadow, gshadow, login.defs and (with `homes`) home/."""
    root = base / "root"
    (root / "etc").mkdir(parents=True)
    for name, text, mode in (
        ("passwd", PASSWD, 0o644),
        ("group", GROUP, 0o644),
        ("shadow", SHADOW, 0o600),
        ("gshadow", GSHADOW, 0o600),
        ("login.defs", LOGIN_DEFS, 0o644),
    ):
        (root / "etc" / name).write_text(text)
        (root / "etc" / name).chmod(mode)
    if homes:
        (root / "home").mkdir()
    return root


def account(name: str, uid: int, login: str = "/bin/bash", **fields: object) -> Account:
    """An account for the list; `login` is its shell."""
    values: dict[str, object] = {"username": name, "uid": uid, "gid": uid, "full_name": name.title(), "shell": login}
    values |= fields
    return Account.model_validate(values)


class FakeRunner:
    """Records each argv; raises CommandFailed for commands whose last argument is in `fail`."""

    def __init__(self, fail: Sequence[str] = ()) -> None:
        self.calls: list[list[str]] = []
        self.fail = set(fail)

    def __call__(self, argv: Sequence[str]) -> None:
        self.calls.append(list(argv))
        if argv[-1] in self.fail:
            raise CommandFailed(f"{argv[0]} exited with 1: simulated failure")


def managed(tmp_path: Path) -> dict[str, dict[str, int]]:
    data: dict[str, dict[str, int]] = json.loads((tmp_path / "state" / "accounts.json").read_text())
    return data


# -- the argv, with a fake runner ------------------------------------------------------------------


def test_new_user_gets_a_group_and_an_account(tmp_path: Path) -> None:
    root = make_root(tmp_path, homes=False)
    runner = FakeRunner()
    sync = AccountSync(root, tmp_path / "state" / "accounts.json", runner)
    report = sync.apply(AccountList.of([account("bob", 20001, full_name="Bob: the Builder\n")]))
    r = str(root)
    assert runner.calls == [
        ["groupadd", "--root", r, "-g", "20001", "bob"],
        ["useradd", "--root", r, "-u", "20001", "-g", "20001", "-s", "/bin/bash", "-c", "Bob  the Builder",
         "-m", "-d", "/home/bob", "-p", "*", "bob"],
    ]  # fmt: skip
    assert report.created == ["bob"]
    assert managed(tmp_path) == {"users": {"bob": 20001}, "groups": {"bob": 20001}}
    assert (tmp_path / "state" / "accounts.json").stat().st_mode & 0o777 == 0o600


def test_a_home_from_the_directory_is_where_useradd_makes_it(tmp_path: Path) -> None:
    root = make_root(tmp_path, homes=False)
    runner = FakeRunner()
    report = AccountSync(root, tmp_path / "state" / "accounts.json", runner).apply(
        AccountList.of([account("dora", 20006, home="/u/research/dora")])
    )
    assert report.created == ["dora"]
    useradd = runner.calls[-1]
    assert useradd[useradd.index("-d") + 1] == "/u/research/dora"


def test_an_existing_gid_is_joined_not_created(tmp_path: Path) -> None:
    root = make_root(tmp_path, homes=False)
    runner = FakeRunner()
    AccountSync(root, tmp_path / "state" / "accounts.json", runner).apply(
        AccountList.of([account("erin", 20005, gid=1500)])
    )
    assert [call[0] for call in runner.calls] == ["useradd"]
    assert runner.calls[0][runner.calls[0].index("-g") + 1] == "1500"


def test_unmanaged_accounts_and_taken_uids_are_skipped_untouched(tmp_path: Path) -> None:
    root = make_root(tmp_path, homes=False)
    runner = FakeRunner()
    report = AccountSync(root, tmp_path / "state" / "accounts.json", runner).apply(
        AccountList.of(
            [
                account("alice", 20002),  # a local account gpufleet did not create
                account("root", 20003),  # a system account
                account("carol", 1500),  # alice's uid
                account("dan", 20004, gid=20004, enabled=False),  # disabled and absent: nothing to do
            ]
        )
    )
    assert runner.calls == []
    assert report.skipped == {
        "alice": "a local account of this name exists that gpufleet did not create",
        "root": "a local account of this name exists that gpufleet did not create",
        "carol": "uid 1500 belongs to the local account alice",
    }
    assert managed(tmp_path) == {"users": {}, "groups": {}}


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (account("Bad", 20010), "not a valid username"),
        (account("-rf", 20010), "not a valid username"),
        (account("a:b", 20010), "not a valid username"),
        (account("x" * 33, 20010), "not a valid username"),
        (account("zed", 0), "uid 0 is outside"),
        (account("zed", 20010, gid=27), "gid 27 is outside"),
        (account("zed", 20010, login="/bin/../tmp/sh"), "not a valid shell"),
        (account("zed", 20010, login="bash"), "not a valid shell"),
        (account("zed", 20010, login="/bin/sh -c evil"), "not a valid shell"),
        # A home from the directory must be the user's own, outside the system's trees.
        (account("zed", 20010, home="/root"), "not a home directory it may have"),
        (account("zed", 20010, home="/etc/zed"), "not a home directory it may have"),
        (account("zed", 20010, home="/home/other"), "not a home directory it may have"),
        (account("zed", 20010, home="/home/../root/zed"), "not a home directory it may have"),
        (account("zed", 20010, home="home/zed"), "not a home directory it may have"),
        (account("zed", 20010, home="/zed"), "not a home directory it may have"),
        (account("zed", 20010, home="/home/zed\n/etc"), "not a home directory it may have"),
    ],
)
def test_bad_entries_never_reach_a_command(tmp_path: Path, bad: Account, reason: str) -> None:
    root = make_root(tmp_path, homes=False)
    runner = FakeRunner()
    report = AccountSync(root, tmp_path / "state" / "accounts.json", runner).apply(
        AccountList.of([bad, account("good", 20011)])
    )
    assert reason in report.skipped[bad.username]
    assert all("good" in call for call in runner.calls)
    assert report.created == ["good"]


def test_duplicates_in_the_list_count_once(tmp_path: Path) -> None:
    root = make_root(tmp_path, homes=False)
    runner = FakeRunner()
    listing = AccountList(accounts=[account("bob", 20001), account("bob", 20002), account("carl", 20001)], version="x")
    report = AccountSync(root, tmp_path / "state" / "accounts.json", runner).apply(listing)
    assert report.created == ["bob"]
    assert report.skipped == {
        "bob": "listed twice: only the first entry counts",
        "carl": "uid 20001 is listed for bob as well",
    }


def test_one_failing_command_does_not_stop_the_others(tmp_path: Path) -> None:
    root = make_root(tmp_path, homes=False)
    runner = FakeRunner(fail=["bob"])
    report = AccountSync(root, tmp_path / "state" / "accounts.json", runner).apply(
        AccountList.of([account("bob", 20001), account("carol", 20002)])
    )
    assert report.failed == {"bob": "groupadd exited with 1: simulated failure"}
    assert report.created == ["carol"]
    assert managed(tmp_path)["users"] == {"carol": 20002}  # bob was never created: not gpufleet's


def _with_managed_bob(tmp_path: Path, shadow: str, **state: int) -> Path:
    """A root where gpufleet created bob earlier (uid 20001), with bob's shadow fields as given."""
    root = make_root(tmp_path, homes=False)
    with (root / "etc" / "passwd").open("a") as fh:
        fh.write("bob:x:20001:20001:Bob:/home/bob:/bin/bash\n")
    with (root / "etc" / "group").open("a") as fh:
        fh.write("bob:x:20001:\n")
    with (root / "etc" / "shadow").open("a") as fh:
        fh.write(f"bob:{shadow}\n")
    (tmp_path / "state").mkdir()
    users = {"bob": 20001} | state
    (tmp_path / "state" / "accounts.json").write_text(json.dumps({"users": users, "groups": {"bob": 20001}}))
    return root


@pytest.mark.parametrize(
    ("shadow", "enabled", "expected"),
    [
        ("*:20000::::::", False, ["-L", "-e", "1"]),
        ("*:20000::::::", True, None),
        ("!*:20000:::::1:", True, ["-U", "-e", ""]),
        ("!$6$s$h:20000:::::1:", True, ["-U", "-e", ""]),
        ("!:20000::::::", True, ["-p", "*", "-e", ""]),  # -U would refuse: an empty password
        ("!*:20000:::::1:", False, None),
        ("!*:20000::::::", False, ["-L", "-e", "1"]),  # locked but not expired: not locked enough
    ],
)
def test_lock_and_unlock(tmp_path: Path, shadow: str, enabled: bool, expected: list[str] | None) -> None:
    root = _with_managed_bob(tmp_path, shadow)
    runner = FakeRunner()
    report = AccountSync(root, tmp_path / "state" / "accounts.json", runner).apply(
        AccountList.of([account("bob", 20001, full_name="Bob", enabled=enabled)])
    )
    assert runner.calls == ([] if expected is None else [["usermod", "--root", str(root), *expected, "bob"]])
    if expected is not None:
        assert (report.locked if not enabled else report.unlocked) == ["bob"]


def test_managed_user_no_longer_listed_is_locked_and_kept(tmp_path: Path) -> None:
    root = _with_managed_bob(tmp_path, "*:20000::::::")
    runner = FakeRunner()
    report = AccountSync(root, tmp_path / "state" / "accounts.json", runner).apply(AccountList.of([]))
    assert runner.calls == [["usermod", "--root", str(root), "-L", "-e", "1", "bob"]]
    assert report.locked == ["bob"]
    assert managed(tmp_path)["users"] == {"bob": 20001}  # still gpufleet's, so it can come back


def test_changed_attributes_are_one_usermod(tmp_path: Path) -> None:
    root = _with_managed_bob(tmp_path, "*:20000::::::")
    runner = FakeRunner()
    report = AccountSync(root, tmp_path / "state" / "accounts.json", runner).apply(
        AccountList.of([account("bob", 20001, full_name="Robert", login="/bin/zsh")])
    )
    assert runner.calls == [["usermod", "--root", str(root), "-s", "/bin/zsh", "-c", "Robert", "bob"]]
    assert report.updated == ["bob"]


def test_a_managed_name_now_held_by_another_uid_is_left_alone(tmp_path: Path) -> None:
    # gpufleet gave bob uid 20009; the local bob is 20001: someone replaced the account. Hands off.
    root = _with_managed_bob(tmp_path, "*:20000::::::", bob=20009)
    runner = FakeRunner()
    sync = AccountSync(root, tmp_path / "state" / "accounts.json", runner)
    report = sync.apply(AccountList.of([account("bob", 20002, login="/bin/zsh")]))
    assert runner.calls == []
    assert "not the 20009 gpufleet gave it" in report.skipped["bob"]
    report = sync.apply(AccountList.of([]))  # nor is it locked when it leaves the list
    assert runner.calls == []
    assert "bob" not in managed(tmp_path)["users"]


def test_a_corrupt_state_file_changes_nothing(tmp_path: Path) -> None:
    root = make_root(tmp_path, homes=False)
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "accounts.json").write_text("{not json")
    runner = FakeRunner()
    with pytest.raises(ConfigError, match="corrupt managed-accounts file"):
        AccountSync(root, tmp_path / "state" / "accounts.json", runner).apply(AccountList.of([account("bob", 20001)]))
    assert runner.calls == []


def test_a_root_without_passwd_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        AccountSync(tmp_path, tmp_path / "accounts.json", FakeRunner()).apply(AccountList.of([]))


def test_the_real_root_needs_no_root_option(tmp_path: Path) -> None:
    runner = FakeRunner()
    sync = AccountSync(Path("/"), tmp_path / "accounts.json", runner)
    _Pass(sync, LocalAccounts(), ManagedState())._run("usermod", "-L", "bob")
    assert runner.calls == [["usermod", "-L", "bob"]]


def test_version_ignores_order_and_follows_content() -> None:
    a, b = account("a", 20001), account("b", 20002)
    assert AccountList.of([a, b]).version == AccountList.of([b, a]).version
    assert AccountList.of([a, b]).version != AccountList.of([a, account("b", 20002, login="/bin/sh")]).version


def test_run_command_reports_the_error_line() -> None:
    with pytest.raises(CommandFailed, match="exited with 3: boom"):
        run_command(["sh", "-c", "echo boom >&2; exit 3"])
    with pytest.raises(CommandFailed, match="no-such-program"):
        run_command(["no-such-program-gpufleet"])


# -- the real tools against a throwaway root -------------------------------------------------------


def need_account_tools() -> None:
    """Skip (in CI: fail) unless this runs as root with the shadow tools installed."""
    if os.geteuid() != 0:
        need("useradd --root", "the account tests must run as root (they chown files to other uids)")
    for tool in ("useradd", "usermod", "groupadd", "groupmod"):
        if shutil.which(tool, path=SBIN) is None:
            need("useradd --root", f"{tool} is not installed (package passwd or shadow-utils)")


@pytest.fixture
def real_root(tmp_path: Path) -> Path:
    """A throwaway root for the real useradd/usermod/groupadd (--root), with a local user alice who has keys."""
    need_account_tools()
    root = make_root(tmp_path, homes=True)
    ssh = root / "home" / "alice" / ".ssh"
    ssh.mkdir(parents=True, mode=0o700)
    (ssh / "authorized_keys").write_text("ssh-ed25519 AAAAlocal alice@her-own\n")
    for path in (root / "home" / "alice", ssh, ssh / "authorized_keys"):
        os.chown(path, 1500, 1500)
    return root


class CountingRunner:
    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str]) -> None:
        self.calls.append(list(argv))
        run_command(argv)


def _line(root: Path, file: str, name: str) -> str:
    lines = [line for line in (root / "etc" / file).read_text().splitlines() if line.split(":")[0] == name]
    assert len(lines) <= 1
    return lines[0] if lines else ""


def _alice(root: Path) -> tuple[str, str, str, bytes, tuple[int, int, int]]:
    keys = root / "home" / "alice" / ".ssh" / "authorized_keys"
    info = keys.stat()
    return (
        _line(root, "passwd", "alice"),
        _line(root, "shadow", "alice"),
        _line(root, "group", "alice"),
        keys.read_bytes(),
        (info.st_uid, info.st_gid, info.st_mode),
    )


def _keys(root: Path, name: str) -> str:
    return (root / "home" / name / ".ssh" / "authorized_keys").read_text()


def test_real_tools_create_update_lock_and_unlock(real_root: Path, tmp_path: Path) -> None:
    root = real_root
    alice_before = _alice(root)
    runner = CountingRunner()
    sync = AccountSync(root, tmp_path / "state" / "accounts.json", runner)

    # 1. Create: bob and carol get accounts, groups, homes and keys; the local alice is not touched.
    report = sync.apply(
        AccountList.of(
            [
                account("bob", 20001, full_name="Bob Builder", ssh_keys=[KEY_A, KEY_B]),
                account("carol", 20002, ssh_keys=[KEY_C]),
                account("dave", 20003, login="/bin/sh"),
                account("alice", 20004, ssh_keys=[KEY_A]),
            ]
        )
    )
    assert report.created == ["bob", "carol", "dave"]
    assert report.skipped == {"alice": "a local account of this name exists that gpufleet did not create"}
    assert report.failed == {}
    assert _line(root, "passwd", "bob") == "bob:x:20001:20001:Bob Builder:/home/bob:/bin/bash"
    assert _line(root, "group", "bob") == "bob:x:20001:"
    assert _line(root, "shadow", "bob").split(":")[1] == "*"  # no password, not locked
    ssh = root / "home" / "bob" / ".ssh"
    assert (ssh.stat().st_uid, ssh.stat().st_gid, stat.S_IMODE(ssh.stat().st_mode)) == (20001, 20001, 0o700)
    keys = ssh / "authorized_keys"
    assert (keys.stat().st_uid, keys.stat().st_gid, stat.S_IMODE(keys.stat().st_mode)) == (20001, 20001, 0o600)
    assert _keys(root, "bob") == HEADER + KEY_A + "\n" + KEY_B + "\n"
    assert (root / "home" / "bob").stat().st_uid == 20001
    assert _alice(root) == alice_before

    # 2. Change: bob's shell and one key, carol disabled, dave no longer listed.
    (root / "home" / "dave" / "work.txt").write_text("results\n")
    report = sync.apply(
        AccountList.of(
            [
                account("bob", 20001, full_name="Bob Builder", login="/bin/sh", ssh_keys=[KEY_B]),
                account("carol", 20002, ssh_keys=[KEY_C], enabled=False),
                account("alice", 20004, ssh_keys=[KEY_A]),
            ]
        )
    )
    assert report.failed == {}
    assert report.updated == ["bob"]
    assert sorted(report.locked) == ["carol", "dave"]
    assert _line(root, "passwd", "bob").endswith(":/bin/sh")
    assert _keys(root, "bob") == HEADER + KEY_B + "\n"
    for name in ("carol", "dave"):
        fields = _line(root, "shadow", name).split(":")
        assert fields[1].startswith("!")  # password locked
        assert fields[7] == "1"  # account expired: no key logins either
        assert _keys(root, name) == HEADER
    assert (root / "home" / "dave" / "work.txt").read_text() == "results\n"  # locked, not deleted
    assert _alice(root) == alice_before

    # 3. Back: carol re-enabled, dave listed again; their accounts unlock, keys return.
    listing = AccountList.of(
        [
            account("bob", 20001, full_name="Bob Builder", login="/bin/sh", ssh_keys=[KEY_B]),
            account("carol", 20002, ssh_keys=[KEY_C]),
            account("dave", 20003, login="/bin/sh"),
        ]
    )
    report = sync.apply(listing)
    assert report.failed == {}
    assert sorted(report.unlocked) == ["carol", "dave"]
    assert _line(root, "shadow", "carol").split(":")[1] == "*"
    assert _line(root, "shadow", "carol").split(":")[7] == ""
    assert _keys(root, "carol") == HEADER + KEY_C + "\n"

    # 4. Again, unchanged: not a single command.
    before = len(runner.calls)
    report = sync.apply(listing)
    assert not report.changed
    assert len(runner.calls) == before
    assert _alice(root) == alice_before


def test_real_tools_never_take_a_local_uid(real_root: Path, tmp_path: Path) -> None:
    passwd_before = (real_root / "etc" / "passwd").read_bytes()
    report = AccountSync(real_root, tmp_path / "accounts.json").apply(AccountList.of([account("carol", 1500)]))
    assert report.skipped == {"carol": "uid 1500 belongs to the local account alice"}
    assert (real_root / "etc" / "passwd").read_bytes() == passwd_before
    assert not (real_root / "home" / "carol").exists()


def test_real_group_clash_is_skipped_and_the_rest_goes_on(real_root: Path, tmp_path: Path) -> None:
    # A group named like the user but with another gid, that gpufleet did not create: bob is skipped.
    with (real_root / "etc" / "group").open("a") as fh:
        fh.write("bob:x:3000:\n")
    with (real_root / "etc" / "gshadow").open("a") as fh:
        fh.write("bob:!::\n")
    report = AccountSync(real_root, tmp_path / "accounts.json").apply(
        AccountList.of([account("bob", 20001), account("carol", 20002)])
    )
    assert report.skipped == {"bob": "gid 20001 does not exist and the local group bob has gid 3000"}
    assert report.created == ["carol"]
    local = read_local_accounts(real_root)
    assert "bob" not in local.users
    assert local.users["carol"].uid == 20002


def test_real_failure_is_reported_retried_and_the_rest_goes_on(real_root: Path, tmp_path: Path) -> None:
    (real_root / "home" / "bob").write_text("not a directory\n")  # useradd only warns; the keys cannot go in
    sync = AccountSync(real_root, tmp_path / "accounts.json")
    listing = AccountList.of([account("bob", 20001, ssh_keys=[KEY_A]), account("carol", 20002, ssh_keys=[KEY_C])])
    report = sync.apply(listing)
    assert "Not a directory" in report.failed["bob"]
    assert _keys(real_root, "carol") == HEADER + KEY_C + "\n"
    assert json.loads((tmp_path / "accounts.json").read_text())["users"] == {"bob": 20001, "carol": 20002}
    (real_root / "home" / "bob").unlink()  # an admin puts it right; the next pass finishes the job
    report = sync.apply(listing)
    assert report.failed == {}
    assert _keys(real_root, "bob") == HEADER + KEY_A + "\n"
