"""`gpufleet doctor` as a process against a real HTTPS head: a clean head and node pass, and each planted
problem (a wrong clock under libfaketime, a missing unit, an unreachable database, a CA mismatch, a
full disk) fails with its fix. One head serves the whole module."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpufleet import __version__
from tests.e2e.conftest import GPUFLEET, Head, base_env, free_port
from tests.services import need

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("test_doctor_e2e")]
ROOMY = ("--min-free-gb", "0.01", "--min-free-pct", "0.01")  # the clean cases do not judge the test machine's disk


@pytest.fixture(scope="module")
def head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Head]:
    h = Head(tmp_path_factory.mktemp("doctor-head"), tls=True).start()
    yield h
    h.kill(signal.SIGTERM)


@pytest.fixture(scope="module")
def other_ca(head: Head) -> Path:
    """The data directory of another head: its own CA, which the running head does not serve."""
    other = head.tmp / "other-head"
    subprocess.run(
        [*GPUFLEET, "server", "init", "--data-dir", str(other)], env=base_env(head.tmp), check=True, timeout=60
    )
    return other


def _node(tmp: Path, head: Head, ca: Path | None = None, unit: bool = True) -> tuple[Path, Path]:
    """A joined node's state directory (its credential and the CA it pinned) and unit directory."""
    state = tmp / "agent"
    state.mkdir(mode=0o700)
    credential = {"server": head.url, "node": "gpu001", "node_id": 1, "token": "gfn_doctor", "heartbeat_interval_s": 1}
    (state / "credential.json").write_text(json.dumps(credential))
    shutil.copy(ca or head.ca_file, state / "head-ca.pem")
    units = tmp / "units"
    units.mkdir()
    if unit:
        (units / "gpufleet-agent.service").write_text("[Service]\nExecStart=/usr/bin/gpufleet agent\n")
    return state, units


def _head_units(tmp: Path) -> Path:
    units = tmp / "head-units"
    units.mkdir()
    (units / "gpufleet-server.service").write_text("[Service]\nExecStart=/usr/bin/gpufleet server\n")
    return units


def doctor(
    tmp: Path, *args: str, env: dict[str, str] | None = None, fake_time: str | None = None
) -> tuple[int, dict[str, Any], dict[str, dict[str, str]]]:
    """`gpufleet doctor ARGS -o json`: its exit status, its answer and its checks by name."""
    command = [*GPUFLEET, "doctor", *args, "-o", "json"]
    if fake_time is not None:
        faketime = shutil.which("faketime")
        if faketime is None:
            need("faketime", "faketime (libfaketime) is not installed (bash scripts/services/faketime.sh install)")
        assert faketime is not None
        command = [faketime, "-f", fake_time, *command]
    done = subprocess.run(
        command, env=base_env(tmp) | (env or {}), capture_output=True, text=True, timeout=60, check=False
    )
    assert "Traceback" not in done.stderr, done.stderr
    answer = json.loads(done.stdout)
    return done.returncode, answer, {c["check"]: c for c in answer["checks"]}


def _failed(found: dict[str, dict[str, str]]) -> set[str]:
    return {name for name, c in found.items() if c["status"] == "fail"}


def _head_env(head: Head) -> dict[str, str]:
    return {"GPUFLEET_LISTEN": f"127.0.0.1:{head.port}"}


def test_a_clean_node_passes(head: Head, tmp_path: Path) -> None:
    state, units = _node(tmp_path, head)
    no_head = ("--data-dir", str(tmp_path / "no-head"))  # whatever this machine's /var/lib/gpufleet holds
    rc, answer, found = doctor(
        tmp_path, "--state-dir", str(state), "--unit-dir", str(units), "--no-expect-gpus", *no_head, *ROOMY
    )
    assert rc == 0, answer
    assert answer["role"] == "node"  # told by the credential and the agent's unit
    assert list(found) == ["head", "versions", "clock", "credential", "tls", "nvml", "unit", "disk (state)"]
    assert {name for name, c in found.items() if c["status"] != "ok"} <= {"nvml"}  # no GPUs here, or some
    assert found["versions"]["finding"] == f"gpufleet {__version__} here and on the head"
    assert head.url in found["head"]["finding"]  # the head the credential came from
    assert "the head serves the CA this node pinned" in found["tls"]["finding"]


def test_a_clean_head_passes_and_prints_a_table(head: Head, tmp_path: Path) -> None:
    units = _head_units(tmp_path)
    args = ("--data-dir", str(head.tmp / "head"), "--unit-dir", str(units), *ROOMY)
    rc, answer, found = doctor(tmp_path, *args, env=_head_env(head))
    assert rc == 0, answer
    assert answer["role"] == "head"
    assert answer["status"] == "ok"
    assert list(found) == ["head", "versions", "clock", "database", "tls", "unit", "disk (data)"]
    assert "schema at revision" in found["database"]["finding"]
    assert "signed by the CA sha256:" in found["tls"]["finding"]
    shown = subprocess.run(
        [*GPUFLEET, "doctor", *args],
        env=base_env(tmp_path) | _head_env(head) | {"COLUMNS": "250"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "gpufleet doctor: head" in shown.stdout
    assert "0 failed, 0 warning(s), 7 ok" in shown.stdout


def test_a_wrong_clock_fails_with_the_time_sync_fix(head: Head, tmp_path: Path) -> None:
    state, units = _node(tmp_path, head)
    rc, _, found = doctor(
        tmp_path,
        "--role",
        "node",
        "--state-dir",
        str(state),
        "--unit-dir",
        str(units),
        "--no-expect-gpus",
        *ROOMY,
        fake_time="+300s",
    )
    assert rc == 1
    assert _failed(found) == {"clock"}
    assert "s ahead of the head's" in found["clock"]["finding"]
    assert found["clock"]["finding"].startswith(("this clock is 29", "this clock is 30"))
    assert "timedatectl set-ntp true" in found["clock"]["fix"]
    assert "chrony" in found["clock"]["fix"]


def test_a_missing_unit_fails_with_install_unit(head: Head, tmp_path: Path) -> None:
    state, units = _node(tmp_path, head, unit=False)
    rc, _, found = doctor(
        tmp_path, "--role", "node", "--state-dir", str(state), "--unit-dir", str(units), "--no-expect-gpus", *ROOMY
    )
    assert rc == 1
    assert _failed(found) == {"unit"}
    assert found["unit"]["finding"] == f"gpufleet-agent.service is not in {units}"
    assert found["unit"]["fix"] == "`gpufleet agent install-unit`"


def test_an_unreachable_database_fails(head: Head, tmp_path: Path) -> None:
    url = f"postgresql+psycopg://gpufleet:hunter2@127.0.0.1:{free_port()}/gpufleet"
    env = _head_env(head) | {"GPUFLEET_DATABASE_URL": url}
    units = _head_units(tmp_path)
    rc, _, found = doctor(tmp_path, "--data-dir", str(head.tmp / "head"), "--unit-dir", str(units), *ROOMY, env=env)
    assert rc == 1
    assert _failed(found) == {"database"}
    assert "cannot reach the database postgresql+psycopg://gpufleet:***@127.0.0.1" in found["database"]["finding"]
    assert "hunter2" not in json.dumps(found)
    assert "database_url" in found["database"]["fix"]


def test_a_ca_mismatch_fails_with_both_fingerprints(head: Head, other_ca: Path, tmp_path: Path) -> None:
    state, units = _node(tmp_path, head, ca=other_ca / "tls" / "ca.pem")
    rc, _, found = doctor(
        tmp_path, "--role", "node", "--state-dir", str(state), "--unit-dir", str(units), "--no-expect-gpus", *ROOMY
    )
    assert rc == 1
    assert _failed(found) == {"tls"}
    served = _fingerprint(head.ca_file)
    pinned = _fingerprint(other_ca / "tls" / "ca.pem")
    assert f"the head serves CA {served}, but this node pinned {pinned}" in found["tls"]["finding"]
    assert f"delete {state / 'head-ca.pem'}" in found["tls"]["fix"]


def test_a_full_disk_fails_with_the_path_and_numbers(head: Head, tmp_path: Path) -> None:
    state, units = _node(tmp_path, head)
    rc, _, found = doctor(
        tmp_path,
        "--role",
        "node",
        "--state-dir",
        str(state),
        "--unit-dir",
        str(units),
        "--no-expect-gpus",
        "--min-free-gb",
        "1000000",
    )
    assert rc == 1
    assert _failed(found) == {"disk (state)"}
    assert found["disk (state)"]["finding"].startswith(f"{state}: ")
    assert "GB free of" in found["disk (state)"]["finding"]
    assert "below 1e+06 GB" in found["disk (state)"]["finding"]
    assert f"filesystem holding {state}" in found["disk (state)"]["fix"]


def test_five_planted_problems_on_a_head_each_with_its_fix(head: Head, other_ca: Path, tmp_path: Path) -> None:
    """A wrong clock, no unit, an unreachable database, a CA the running head does not serve, and a full
    disk, all at once."""
    env = _head_env(head) | {"GPUFLEET_DATABASE_URL": f"postgresql+psycopg://gpufleet@127.0.0.1:{free_port()}/x"}
    empty_units = tmp_path / "no-units"
    empty_units.mkdir()
    rc, answer, found = doctor(
        tmp_path,
        "--role",
        "head",
        "--data-dir",
        str(other_ca),
        "--unit-dir",
        str(empty_units),
        "--min-free-gb",
        "1000000",
        env=env,
        fake_time="+300s",
    )
    assert rc == 1
    assert answer["status"] == "fail"
    assert _failed(found) == {"clock", "database", "tls", "unit", "disk (data)"}
    assert found["head"]["status"] == found["versions"]["status"] == "ok"
    assert "chrony" in found["clock"]["fix"]
    assert "pg_isready" in found["database"]["fix"]
    assert f"the running head serves CA {_fingerprint(head.ca_file)}" in found["tls"]["finding"]
    assert "systemctl restart gpufleet-server.service" in found["tls"]["fix"]
    assert found["unit"]["fix"] == "`gpufleet server install-unit`"
    assert str(other_ca) in found["disk (data)"]["fix"]


def test_an_unreachable_head_fails_and_skips_what_needs_it(tmp_path: Path) -> None:
    state = tmp_path / "agent"
    state.mkdir()
    units = tmp_path / "units"
    units.mkdir()
    (units / "gpufleet-agent.service").touch()
    server = f"http://127.0.0.1:{free_port()}"
    rc, _, found = doctor(
        tmp_path,
        "--role",
        "node",
        "--state-dir",
        str(state),
        "--unit-dir",
        str(units),
        "--no-expect-gpus",
        *ROOMY,
        env={"GPUFLEET_SERVER": server},
    )
    assert rc == 1
    assert _failed(found) == {"head"}
    assert list(found) == ["head", "credential", "nvml", "unit", "disk (state)"]
    assert found["credential"]["status"] == "warn"  # not joined yet


def test_no_role_to_tell_is_a_usage_error(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            *GPUFLEET,
            "doctor",
            "--data-dir",
            str(tmp_path / "d"),
            "--state-dir",
            str(tmp_path / "s"),
            "--unit-dir",
            str(tmp_path),
        ],
        env=base_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "pass --role head or --role node" in done.stderr


def _fingerprint(path: Path) -> str:
    from gpufleet.core.tls import fingerprint

    return fingerprint(path.read_text())
