"""Node-side checks: real executables in a temporary checks directory, a fake systemctl, the real mount table."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import pytest

from gpufleet.agent.checks.executables import CustomChecks
from gpufleet.agent.checks.mounts import check_mounts, mount_check_name, read_mountinfo
from gpufleet.agent.checks.ports import MAX_CHECKS
from gpufleet.agent.checks.process import run_bounded
from gpufleet.agent.checks.runner import HostChecks, fit
from gpufleet.agent.checks.services import check_service
from gpufleet.protocol.metrics import CheckResult

TIMEOUT = 5.0


def script(directory: Path, name: str, body: str, mode: int = 0o755) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(mode)
    return path


def verdicts(checks: HostChecks | CustomChecks) -> dict[str, tuple[int, str]]:
    if isinstance(checks, CustomChecks):
        found, results = checks.find()
        results += [checks.run_one(check) for check in found]
    else:
        results = checks.run()
    return {r.name: (r.status, r.message) for r in results}


def custom(directory: Path, *, timeout_s: float = TIMEOUT, enforce_owner: bool = False) -> CustomChecks:
    return CustomChecks(directory, timeout_s=timeout_s, enforce_owner=enforce_owner)


def test_exit_code_and_first_line_are_the_verdict(tmp_path: Path) -> None:
    d = tmp_path / "checks.d"
    script(d, "pass", "echo '  all good  '; exit 0")
    script(d, "fail", "echo; echo 'check_fs_mount: /scratch not mounted'; echo second line; exit 1")
    script(d, "warn", "echo 'ECC corrected errors rising'; exit 3")
    script(d, "stderr-only", "echo 'nvidia-smi: command not found' >&2; exit 1")
    script(d, "quiet-fail", "exit 1")
    script(d, "long", "printf 'x%.0s' $(seq 400); echo; exit 1")
    script(d, "colours", "printf '\\033[31mred\\033[0m\\tbad\\n'; exit 1")

    got = verdicts(custom(d))

    assert got["pass"] == (0, "all good")
    assert got["fail"] == (1, "check_fs_mount: /scratch not mounted")
    assert got["warn"] == (2, "ECC corrected errors rising")
    assert got["stderr-only"] == (1, "nvidia-smi: command not found")
    assert got["quiet-fail"] == (1, "exited with 1")
    assert got["long"] == (1, "x" * 256)
    assert got["colours"] == (1, "[31mred [0m bad")  # control characters never reach the head


def test_a_check_that_hangs_warns_and_its_children_are_killed(tmp_path: Path) -> None:
    d = tmp_path / "checks.d"
    marker = tmp_path / "child-survived"
    # The child outlives the shell unless the whole process group is killed.
    script(d, "hangs", f"echo 'checking...'; (sleep 1.5; touch {marker}) & sleep 5")

    got = verdicts(custom(d, timeout_s=0.5))

    assert got["hangs"] == (2, "timed out after 0.5 s: checking...")
    time.sleep(1.6)  # past the moment the child would have written the marker
    assert not marker.exists()


def test_a_check_that_cannot_start_or_dies_by_a_signal_warns(tmp_path: Path) -> None:
    d = tmp_path / "checks.d"
    bad = d / "no-interpreter"
    d.mkdir()
    bad.write_text("#!/nonexistent/interpreter\n")
    bad.chmod(0o755)
    script(d, "segfaults", "kill -SEGV $$")

    got = verdicts(custom(d))

    assert got["no-interpreter"][0] == 2
    assert got["no-interpreter"][1].startswith("cannot run: ")
    assert got["segfaults"] == (2, "killed by SIGSEGV")


def test_only_executable_regular_files_with_good_names_are_checks(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    d = tmp_path / "checks.d"
    script(d, "real", "exit 0")
    script(d, "not-executable", "exit 1", mode=0o644)
    for leftover in (".hidden", "real~", "real.rpmsave", "real.rpmnew", "real.dpkg-old", "real.dpkg-dist"):
        script(d, leftover, "exit 1")
    script(d, "has space", "exit 1")
    script(d, "service:sshd", "exit 1")  # would pose as a built-in check
    (d / "subdir").mkdir()
    (d / "link").symlink_to(d / "real")
    checks = custom(d)

    with caplog.at_level(logging.WARNING):
        assert verdicts(checks) == {"real": (0, ""), "link": (0, "")}
        verdicts(checks)

    skipped = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert sorted(m.split("/")[-1].split(" skipped")[0] for m in skipped) == ["has space", "service:sshd"]  # once each


def test_a_missing_directory_means_no_custom_checks(tmp_path: Path) -> None:
    assert verdicts(custom(tmp_path / "absent")) == {}


def test_an_unreadable_directory_warns(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")

    got = verdicts(custom(not_a_dir))

    assert list(got) == ["checks_dir"]
    assert got["checks_dir"][0] == 2


def test_a_root_agent_refuses_checks_others_could_edit(tmp_path: Path) -> None:
    d = tmp_path / "checks.d"
    d.mkdir()
    d.chmod(0o755)
    script(d, "world-writable", "exit 0", mode=0o757)
    script(d, "group-writable", "exit 0", mode=0o775)
    script(d, "safe", "exit 0", mode=0o755)
    marker = tmp_path / "ran"
    script(d, "evil", f"touch {marker}; exit 0", mode=0o777)
    owned_by_root = os.geteuid() == 0

    got = verdicts(custom(d, enforce_owner=True))

    assert got["world-writable"] == (2, "refused: writable by others")
    assert got["group-writable"] == (2, "refused: writable by group")
    assert got["evil"] == (2, "refused: writable by others")
    assert not marker.exists()
    assert got["safe"] == ((0, "") if owned_by_root else (2, "refused: not owned by root"))
    # A non-root agent runs checks as itself: nothing to escalate to.
    assert verdicts(custom(d, enforce_owner=False))["world-writable"] == (0, "")


def test_a_directory_others_can_write_refuses_every_check(tmp_path: Path) -> None:
    d = tmp_path / "checks.d"
    script(d, "safe", "exit 0")
    d.chmod(0o777)

    got = verdicts(custom(d, enforce_owner=True))

    assert got["safe"][0] == 2
    # A directory of the test's own user is refused for its owner first when the tests do not run as root.
    refusal = f"refused: {d} is writable by others" if os.geteuid() == 0 else "refused: not owned by root"
    assert got["safe"][1] == refusal


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a file to another user")
def test_a_root_agent_refuses_a_check_owned_by_another_user(tmp_path: Path) -> None:
    d = tmp_path / "checks.d"
    path = script(d, "users", "exit 0")
    os.chown(path, 65534, 65534)

    assert verdicts(custom(d, enforce_owner=True))["users"] == (2, "refused: not owned by root")


def test_checks_see_a_clean_environment_and_run_in_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = tmp_path / "checks.d"
    script(d, "env", 'echo "$(pwd) ${SECRET:-unset} $PATH"; read -r line && exit 1; exit 0')
    monkeypatch.setenv("SECRET", "gfn_agent_token")

    status, message = verdicts(custom(d))["env"]

    assert status == 0  # stdin is closed: `read` finds nothing
    assert message == "/ unset /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def test_a_flood_of_output_is_bounded(tmp_path: Path) -> None:
    d = tmp_path / "checks.d"
    script(d, "chatty", "echo first; head -c 5000000 /dev/zero | tr '\\0' 'x'; exit 1")

    finished = run_bounded([str(d / "chatty")], timeout_s=TIMEOUT)

    assert finished.returncode == 1
    assert len(finished.stdout) == 64 * 1024
    assert verdicts(custom(d))["chatty"] == (1, "first")


def fake_systemctl(tmp_path: Path) -> Path:
    """Answers `is-active -- UNIT` as systemd would for a few units."""
    return script(
        tmp_path / "bin",
        "systemctl",
        '[ "$1" = is-active ] && [ "$2" = -- ] || { echo "bad usage: $*" >&2; exit 2; }\n'
        'case "$3" in\n'
        "  sshd|munge) echo active ;;\n"
        "  slurmd) echo failed; exit 3 ;;\n"
        "  nvidia-fabricmanager) echo activating; exit 3 ;;\n"
        "  nobus) echo 'Failed to connect to bus: No such file or directory' >&2; exit 1 ;;\n"
        "  slow) sleep 5 ;;\n"
        "  *) echo inactive; exit 3 ;;\n"
        "esac",
    )


def test_required_services_pass_only_when_active(tmp_path: Path) -> None:
    systemctl = str(fake_systemctl(tmp_path))

    def check(unit: str, timeout_s: float = TIMEOUT) -> tuple[int, str]:
        got = check_service(unit, timeout_s=timeout_s, systemctl=systemctl)
        assert got.name == f"service:{unit}"
        return got.status, got.message

    assert check("sshd") == (0, "sshd is active")
    assert check("slurmd") == (1, "slurmd is failed")
    assert check("nvidia-fabricmanager") == (1, "nvidia-fabricmanager is activating")
    assert check("nosuch.service") == (1, "nosuch.service is inactive")
    assert check("nobus") == (2, "systemctl is-active nobus: Failed to connect to bus: No such file or directory")
    assert check("slow", timeout_s=0.3) == (2, "systemctl is-active timed out after 0.3 s")


def test_without_systemctl_services_warn(tmp_path: Path) -> None:
    got = check_service("sshd", timeout_s=TIMEOUT, systemctl=str(tmp_path / "no-systemctl"))

    assert (got.name, got.status, got.message) == ("service:sshd", 2, "systemctl not available")


def test_required_mounts_against_the_real_mount_table(tmp_path: Path) -> None:
    got = {r.name: (r.status, r.message) for r in check_mounts(["/", str(tmp_path)])}

    assert got[mount_check_name("/")][0] == 0
    assert got[mount_check_name("/")][1].startswith("/ is mounted (")
    assert got[mount_check_name(str(tmp_path))] == (1, f"{tmp_path} is not mounted")


def test_mount_table_parsing_and_names(tmp_path: Path) -> None:
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
        "40 22 0:50 / /scratch\\040space rw - nfs4 srv:/s rw\n"
        "41 22 0:51 / /home/shared ro,nosuid - nfs4 srv:/h ro\n"
        "garbage\n"
    )
    mounts = read_mountinfo(mountinfo.read_text())
    got = {r.name: (r.status, r.message) for r in check_mounts(["/home/shared", "/home", "/"], mountinfo)}

    assert set(mounts) == {"/", "/scratch space", "/home/shared"}
    assert got == {
        "mount:home-shared": (0, "/home/shared is mounted (nfs4, read-only)"),
        "mount:home": (1, "/home is not mounted"),
        "mount:-": (0, "/ is mounted (ext4)"),
    }
    unreadable = check_mounts(["/home"], tmp_path / "absent")
    assert [(r.name, r.status) for r in unreadable] == [("mount:home", 2)]


def test_one_round_runs_everything_and_one_failure_costs_nothing_else(tmp_path: Path) -> None:
    d = tmp_path / "checks.d"
    for i in range(6):
        script(d, f"check{i}", f"sleep 0.2; echo 'check {i}'; exit {i % 2}")
    script(d, "hangs", "sleep 5")
    checks = HostChecks(
        d,
        timeout_s=1.0,
        services=["sshd", "slurmd", "sshd"],
        mounts=["/", str(tmp_path)],
        concurrency=4,
        enforce_owner=False,
        systemctl=str(fake_systemctl(tmp_path)),
    )

    results = checks.run()

    assert [r.name for r in results] == [
        *(f"check{i}" for i in range(6)),
        "hangs",
        "service:sshd",
        "service:slurmd",
        "mount:-",
        mount_check_name(str(tmp_path)),
    ]
    got = {r.name: (r.status, r.message) for r in results}
    assert got["check3"] == (1, "check 3")
    assert got["hangs"] == (2, "timed out after 1 s")
    assert got["service:slurmd"] == (1, "slurmd is failed")


def test_a_bug_in_one_check_is_that_checks_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = tmp_path / "checks.d"
    script(d, "a", "exit 0")
    script(d, "b", "exit 0")
    checks = HostChecks(d, enforce_owner=False)
    real = checks.custom.run_one

    def flaky(check: object) -> CheckResult:
        if getattr(check, "name", "") == "a":
            raise RuntimeError("boom")
        return real(check)  # type: ignore[arg-type]

    monkeypatch.setattr(checks.custom, "run_one", flaky)

    got = {r.name: (r.status, r.message) for r in checks.run()}

    assert got == {"a": (2, "check crashed: RuntimeError: boom"), "b": (0, "")}


def test_results_are_kept_small_enough_for_one_message() -> None:
    many = [CheckResult(name=f"c{i:03d}", status=1 if i % 10 == 0 else 0, message="é" * 256) for i in range(300)]

    kept = fit(many, budget=16 * 1024)

    assert len(kept) <= MAX_CHECKS
    assert sum(len(r.model_dump_json().encode()) + 1 for r in kept) <= 16 * 1024
    assert [r.name for r in kept if r.status == 1] == [f"c{i:03d}" for i in range(0, 300, 10)]  # failures kept
    assert all(r.message == "é" * 64 for r in kept if r.status == 1)
    few = many[:3]
    assert fit(few) == few


def test_names_the_protocol_would_refuse_are_left_out_not_raised(tmp_path: Path) -> None:
    checks = HostChecks(
        tmp_path / "none", services=["sshd", "bad unit"], mounts=["/", "/a b"], systemctl=str(fake_systemctl(tmp_path))
    )

    assert [r.name for r in checks.run()] == ["service:sshd", "mount:-"]
