"""gpufleet-agent-ctl: start, stop and watch a node's agent, with or without systemd.

A rollout (`gpufleet node deploy-agent`, docs/deploy-agents.md) copies this file to the node beside the
agent's zipapp and runs it with the node's Python. It reads a spec (JSON) the head wrote for the node:

    {"manager": "systemd" | "detached", "unit": "gpufleet-agent", "argv": [...], "env_file": "...",
     "environment": {...}, "state_dir": "...", "pid_file": "...", "log_file": "..."}

Commands:

- `start` (detached only): stop the agent this spec started before, if it still runs, then start `argv`
  in a session of its own (double fork, setsid, stdin from /dev/null, stdout and stderr appended to
  `log_file`, working directory /), with systemd's environment for a root service (PATH, HOME, USER,
  LOGNAME, LANG), `environment` and the variables of `env_file` (KEY=VALUE lines, `#` comments, as
  systemd's EnvironmentFile= reads them), and write its pid to `pid_file`. It waits `--settle` seconds
  and fails, with the log's last lines, if the agent has already exited (a refused join, a bad setting).
  Nothing restarts it if it dies later: that is what systemd is for.
- `stop` (detached only): SIGTERM to the pid in `pid_file`, SIGKILL after `--grace` seconds; a pid whose
  command line is not `argv` (a stale file, a reused pid) is left alone.
- `status`: exit 0 and say so while the agent runs, else exit 3 (as `systemctl status` does).
- `wait-join --timeout S`: wait until the agent has joined (`state_dir/credential.json` exists) while it
  keeps running; fail with the last lines of its log (or journal) if it exits or S seconds pass.

Stdlib only, and no gpufleet import: it runs on the node before anything else of gpufleet is there.
Exit codes: 0 done, 1 failed (the reason on stderr), 2 usage, 3 not running (`status`).
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
LOG_KEEP_BYTES = 10 * 1024 * 1024  # a longer log is moved to LOG.1 at the next start
NOT_RUNNING = 3


class Failed(Exception):
    """The command failed; the message says why."""


def read_env_file(path: Path) -> dict[str, str]:
    """The variables of a systemd environment file: `KEY=VALUE` lines, blank lines and `#`/`;` comments
    skipped, one pair of surrounding quotes removed. A missing file is empty (EnvironmentFile=-)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    out: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")) or "=" not in line:
            continue
        key, _, value = line.partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out[key.strip()] = value
    return out


def service_environment(spec: Mapping[str, Any]) -> dict[str, str]:
    """What systemd gives a root service, then the spec's `environment`, then the environment file."""
    user = pwd.getpwuid(os.getuid())
    env = {"PATH": PATH, "HOME": user.pw_dir, "USER": user.pw_name, "LOGNAME": user.pw_name}
    if os.environ.get("LANG"):
        env["LANG"] = os.environ["LANG"]
    env.update({str(k): str(v) for k, v in dict(spec.get("environment") or {}).items()})
    env.update(read_env_file(Path(spec["env_file"])))
    return env


def _cmdline(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [part.decode(errors="replace") for part in raw.split(b"\0")[:-1]]


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet reaped by its new parent, does not)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return False
    return bool(fields) and fields[0] not in ("Z", "X")


def running_pid(spec: Mapping[str, Any]) -> int | None:
    """The pid in the spec's pid file, if that process runs the spec's `argv`."""
    try:
        pid = int(Path(spec["pid_file"]).read_text().strip())
    except (OSError, ValueError):
        return None
    if pid <= 1 or not _alive(pid) or _cmdline(pid) != list(spec["argv"]):
        return None
    return pid


def log_tail(spec: Mapping[str, Any], lines: int = 12) -> str:
    """The agent's last log lines: its log file (detached), else its unit's journal."""
    if spec.get("manager") == "systemd":
        journalctl = shutil.which("journalctl", path=PATH)
        if journalctl is None:
            return ""
        unit = str(spec.get("unit") or "gpufleet-agent")
        try:
            done = subprocess.run(
                [journalctl, "-u", unit, "-n", str(lines), "--no-pager", "-o", "cat"],
                capture_output=True,
                text=True,
                timeout=15,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return ""
        return done.stdout.strip()
    try:
        text = Path(spec["log_file"]).read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.strip().splitlines()[-lines:])


def _with_tail(message: str, spec: Mapping[str, Any]) -> str:
    """`message: LAST LOG LINE` on one line (what a task's result shows), the log's last lines below it."""
    tail = log_tail(spec)
    if not tail:
        return message
    return f"{message}: {tail.splitlines()[-1].strip()}\nits last log lines:\n{tail}"


def stop(spec: Mapping[str, Any], grace_s: float = 15.0) -> str:
    """Stop the detached agent the spec started, if it runs. Returns what happened."""
    if spec.get("manager") != "detached":
        raise Failed("stop is for detached agents; under systemd: systemctl stop gpufleet-agent")
    pid = running_pid(spec)
    pid_file = Path(spec["pid_file"])
    if pid is None:
        pid_file.unlink(missing_ok=True)
        return "not running"
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    how = "stopped"
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)
        how = f"killed (still running {grace_s:g} s after SIGTERM)"
    pid_file.unlink(missing_ok=True)
    return f"{how} pid {pid}"


def _open_log(path: Path) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        if path.stat().st_size > LOG_KEEP_BYTES:
            os.replace(path, path.with_name(path.name + ".1"))
    except FileNotFoundError:
        pass
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)


def _spawn(argv: Sequence[str], env: Mapping[str, str], log_fd: int) -> int:
    """Start `argv` detached (double fork, setsid); returns its pid, learnt through a pipe."""
    read_end, write_end = os.pipe()
    first = os.fork()
    if first == 0:  # the intermediate child: a session of its own, then the agent's parent for a moment
        try:
            os.close(read_end)
            os.setsid()
            second = os.fork()
            if second == 0:
                os.chdir("/")
                os.umask(0o022)
                null = os.open(os.devnull, os.O_RDONLY)
                os.dup2(null, 0)
                os.dup2(log_fd, 1)
                os.dup2(log_fd, 2)
                os.closerange(3, 65536)
                os.execve(argv[0], list(argv), dict(env))  # noqa: S606 - an argument list, no shell
            os.write(write_end, str(second).encode())
        finally:
            os._exit(0)  # a forked child never returns into the caller's code
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        got = pipe.read().decode().strip()
    os.waitpid(first, 0)
    if not got.isdigit():
        raise Failed(f"could not start {argv[0]}")
    return int(got)


def start(spec: Mapping[str, Any], settle_s: float = 2.0) -> str:
    """Start the agent detached (after stopping the one this spec started). Raises Failed, with the
    log's last lines, when it exits within `settle_s` seconds."""
    if spec.get("manager") != "detached":
        raise Failed("start is for detached agents; under systemd: systemctl restart gpufleet-agent")
    argv = [str(a) for a in spec["argv"]]
    if not os.access(argv[0], os.X_OK):
        raise Failed(f"{argv[0]} is not an executable")
    stopped = stop(spec)
    env = service_environment(spec)
    pid_file = Path(spec["pid_file"])
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    log_fd = _open_log(Path(spec["log_file"]))
    try:
        os.write(log_fd, f"--- gpufleet-agent-ctl: starting {' '.join(argv)}\n".encode())
        pid = _spawn(argv, env, log_fd)
    finally:
        os.close(log_fd)
    tmp = pid_file.with_name(f".{pid_file.name}.tmp")
    tmp.write_text(f"{pid}\n")
    os.replace(tmp, pid_file)
    deadline = time.monotonic() + settle_s
    while time.monotonic() < deadline:
        if not _alive(pid):
            pid_file.unlink(missing_ok=True)
            raise Failed(_with_tail(f"the agent (pid {pid}) exited at once", spec))
        time.sleep(0.1)
    before = "" if stopped == "not running" else f" (the one before: {stopped})"
    return f"started pid {pid}{before}; log {spec['log_file']}"


def _systemd_active(unit: str) -> bool:
    systemctl = shutil.which("systemctl", path=PATH)
    if systemctl is None:
        return False
    try:
        done = subprocess.run([systemctl, "is-active", "--quiet", unit], timeout=15, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def is_running(spec: Mapping[str, Any]) -> bool:
    if spec.get("manager") == "systemd":
        return _systemd_active(str(spec.get("unit") or "gpufleet-agent"))
    return running_pid(spec) is not None


def wait_join(spec: Mapping[str, Any], timeout_s: float, poll_s: float = 0.25) -> str:
    """Wait until the agent has its credential while it runs. Raises Failed with its last log lines."""
    credential = Path(spec["state_dir"]) / "credential.json"
    deadline = time.monotonic() + timeout_s
    while True:
        if not is_running(spec):
            raise Failed(_with_tail("the agent is not running", spec))
        if credential.exists():
            return f"joined: {credential}"
        if time.monotonic() >= deadline:
            raise Failed(_with_tail(f"the agent did not join within {timeout_s:g} s", spec))
        time.sleep(poll_s)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpufleet-agent-ctl", description=__doc__.split("\n\n")[0])
    parser.add_argument("spec", type=Path, help="the spec the rollout wrote (JSON)")
    parser.add_argument("command", choices=("start", "stop", "status", "wait-join"))
    parser.add_argument("--timeout", type=float, default=60.0, help="wait-join: seconds to wait")
    parser.add_argument("--settle", type=float, default=2.0, help="start: seconds the agent must keep running")
    parser.add_argument("--grace", type=float, default=15.0, help="stop: seconds from SIGTERM to SIGKILL")
    args = parser.parse_args(argv)
    try:
        spec = json.loads(args.spec.read_text())
        if args.command == "status":
            if not is_running(spec):
                print("not running")
                return NOT_RUNNING
            pid = running_pid(spec) if spec.get("manager") != "systemd" else None
            print("running" + (f" (pid {pid})" if pid else ""))
            return 0
        if args.command == "start":
            print(start(spec, args.settle))
        elif args.command == "stop":
            print(stop(spec, args.grace))
        else:
            print(wait_join(spec, args.timeout))
    except (Failed, OSError, ValueError, KeyError) as exc:
        print(f"gpufleet-agent-ctl: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
