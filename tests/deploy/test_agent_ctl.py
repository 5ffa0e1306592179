"""gpufleet-agent-ctl, the node's control program for an agent without systemd, run as a rollout runs it
(`python3 gpufleet-agent-ctl.py SPEC COMMAND`) on real processes standing in for the agent: detached in a
session of their own, with systemd's environment and the settings file, a pid file that names only
them, restarts, refusals with the log's last lines, and the wait for the join."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpufleet.deploy import agent_ctl

CTL = Path(agent_ctl.__file__)

# The stand-in agent: records what it was started with, "joins" (writes the credential) after JOIN_S,
# then runs until stopped. `exit` in its first argument makes it fail at once, as a refused agent does.
AGENT = """
import json, os, sys, time
from pathlib import Path
state = Path(os.environ["STATE"])
if sys.argv[1] == "exit":
    print("gpufleet: error: the head refused the node", flush=True)
    sys.exit(5)
state.mkdir(parents=True, exist_ok=True)
(state / "seen.json").write_text(json.dumps({
    "env": dict(os.environ), "cwd": os.getcwd(), "sid": os.getsid(0), "pid": os.getpid(),
    "stdin": os.readlink("/proc/self/fd/0"), "argv": sys.argv,
}))
print("agent started", flush=True)
time.sleep(float(os.environ.get("JOIN_S", "0")))
if sys.argv[1] != "never":
    (state / "credential.json").write_text("{}")
time.sleep(600)
"""


@pytest.fixture
def make_spec(tmp_path: Path) -> Iterator[Any]:
    made: list[dict[str, Any]] = []

    def make(mode: str = "run", join_s: float = 0.0, env_file: str = "") -> tuple[Path, dict[str, Any]]:
        root = tmp_path / f"node{len(made)}"
        (root / "etc").mkdir(parents=True)
        script = root / "agent.py"
        script.write_text(AGENT)
        (root / "etc" / "agent.env").write_text(env_file)
        spec = {
            "manager": "detached",
            "unit": "gpufleet-agent",
            "argv": [sys.executable, str(script), mode],
            "env_file": str(root / "etc" / "agent.env"),
            "environment": {"STATE": str(root / "state"), "JOIN_S": str(join_s)},
            "state_dir": str(root / "state"),
            "pid_file": str(root / "run" / "gpufleet-agent.pid"),
            "log_file": str(root / "log" / "gpufleet-agent.log"),
        }
        path = root / "etc" / "agent-ctl.json"
        path.write_text(json.dumps(spec))
        made.append(spec)
        return path, spec

    yield make
    for spec in made:  # nothing started here outlives the test
        agent_ctl.stop({**spec, "manager": "detached"}, grace_s=2)


def _ctl(spec: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(CTL), str(spec), *args], capture_output=True, text=True, timeout=60, check=False
    )


def _pid(spec: dict[str, Any]) -> int:
    return int(Path(spec["pid_file"]).read_text())


def test_start_detaches_with_the_service_environment_and_stop_ends_it(make_spec: Any) -> None:
    path, spec = make_spec(env_file="# the rollout's\nGPUFLEET_SERVER=http://127.0.0.1:8080\nQUOTED='a b'\n")
    started = _ctl(path, "start", "--settle", "0.5")
    assert started.returncode == 0, started.stderr
    pid = _pid(spec)
    assert started.stdout.startswith(f"started pid {pid}; log {spec['log_file']}")
    assert _ctl(path, "wait-join", "--timeout", "10").returncode == 0
    seen = json.loads((Path(spec["state_dir"]) / "seen.json").read_text())
    assert seen["pid"] == pid
    # a session of its own (no terminal, no Ansible or sshd session to end with), and not its leader
    assert seen["sid"] not in (os.getsid(0), pid)
    assert seen["cwd"] == "/"
    assert seen["stdin"] == "/dev/null"
    assert seen["argv"] == spec["argv"][1:]  # the script and its argument, as the spec says
    env = seen["env"]
    assert env["GPUFLEET_SERVER"] == "http://127.0.0.1:8080"
    assert env["QUOTED"] == "a b"
    assert env["PATH"] == agent_ctl.PATH
    assert env["STATE"] == spec["state_dir"]
    assert "PYTEST_CURRENT_TEST" not in env  # the caller's environment stays behind
    assert "agent started" in Path(spec["log_file"]).read_text()
    assert Path(spec["log_file"]).stat().st_mode & 0o777 == 0o600

    status = _ctl(path, "status")
    assert (status.returncode, status.stdout.strip()) == (0, f"running (pid {pid})")
    stopped = _ctl(path, "stop")
    assert stopped.returncode == 0
    assert stopped.stdout.strip() == f"stopped pid {pid}"
    assert not Path(spec["pid_file"]).exists()
    assert not agent_ctl._alive(pid)
    assert _ctl(path, "status").returncode == agent_ctl.NOT_RUNNING


def test_start_again_replaces_the_running_agent(make_spec: Any) -> None:
    path, spec = make_spec()
    assert _ctl(path, "start", "--settle", "0.2").returncode == 0
    first = _pid(spec)
    again = _ctl(path, "start", "--settle", "0.2")
    assert again.returncode == 0, again.stderr
    second = _pid(spec)
    assert second != first
    assert f"(the one before: stopped pid {first})" in again.stdout
    assert not agent_ctl._alive(first)
    assert agent_ctl._alive(second)


def test_an_agent_that_exits_at_once_fails_the_start_with_its_log(make_spec: Any) -> None:
    path, spec = make_spec(mode="exit")
    started = _ctl(path, "start", "--settle", "3")
    assert started.returncode == 1
    assert "the agent (pid" in started.stderr
    # the reason on the first line (a task's result shows that one), the log's last lines below it
    first = started.stderr.splitlines()[0]
    assert first.endswith("exited at once: gpufleet: error: the head refused the node"), first
    assert "its last log lines:" in started.stderr
    assert not Path(spec["pid_file"]).exists()


def test_a_pid_file_naming_another_process_is_left_alone(make_spec: Any) -> None:
    path, spec = make_spec()
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        Path(spec["pid_file"]).parent.mkdir(parents=True)
        Path(spec["pid_file"]).write_text(f"{other.pid}\n")
        assert _ctl(path, "status").returncode == agent_ctl.NOT_RUNNING
        assert _ctl(path, "stop").stdout.strip() == "not running"
        assert other.poll() is None  # not killed: it is not the agent
    finally:
        other.kill()
        other.wait()


def test_wait_join_fails_with_the_reason(make_spec: Any) -> None:
    path, spec = make_spec(mode="never")
    assert _ctl(path, "start", "--settle", "0.2").returncode == 0
    waited = _ctl(path, "wait-join", "--timeout", "1")
    assert waited.returncode == 1
    assert "the agent did not join within 1 s: agent started\nits last log lines:\n" in waited.stderr
    agent_ctl.stop(spec)
    gone = _ctl(path, "wait-join", "--timeout", "5")
    assert gone.returncode == 1
    assert "the agent is not running" in gone.stderr


def test_wait_join_waits_for_a_slow_join(make_spec: Any) -> None:
    path, spec = make_spec(join_s=1.0)
    assert _ctl(path, "start", "--settle", "0.1").returncode == 0
    began = time.monotonic()
    waited = _ctl(path, "wait-join", "--timeout", "20")
    assert waited.returncode == 0, waited.stderr
    assert waited.stdout.strip() == f"joined: {spec['state_dir']}/credential.json"
    assert time.monotonic() - began >= 0.5


def test_systemd_specs_are_not_started_here(make_spec: Any) -> None:
    path, spec = make_spec()
    spec["manager"] = "systemd"
    path.write_text(json.dumps(spec))
    for command in ("start", "stop"):
        done = _ctl(path, command)
        assert done.returncode == 1
        assert "systemctl" in done.stderr


def test_the_environment_file_reads_as_systemd_reads_it(tmp_path: Path) -> None:
    env = tmp_path / "agent.env"
    env.write_text("# comment\n; comment\n\nA=1\nB = \"two words\"\nC='x'\nbroken line\nD=a=b\n")
    assert agent_ctl.read_env_file(env) == {"A": "1", "B": "two words", "C": "x", "D": "a=b"}
    assert agent_ctl.read_env_file(tmp_path / "missing") == {}
    assert os.environ.get("A") is None
