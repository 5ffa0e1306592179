"""Run Slurm's client programs (`scontrol`, `sinfo`, `sbatch`...): argument lists, never a shell.

`SlurmCommands` is the one place gpufleet starts a Slurm program. It passes `SLURM_CONF` when one is
configured, bounds each call with a timeout, and turns every failure into an error that names the command
and carries Slurm's own message: `Unavailable` when Slurm cannot be reached or the program is missing or
hangs, `InvalidInput` when Slurm refuses what was asked (an unknown node, a bad state). Tests inject a
`Runner` in place of `subprocess.run`.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from gpufleet.core.errors import InvalidInput, Unavailable

DEFAULT_TIMEOUT_S = 10.0
# Slurm's messages when slurmctld (or munge) cannot be reached, as opposed to a refused request.
_UNREACHABLE = re.compile(
    r"unable to contact slurm controller|connection refused|socket timed out|communication connection failure"
    r"|zero bytes were transmitted|munge|authentication failure|slurm_load_|error: slurm_receive_msg"
    r"|could not establish a configuration source|unable to establish a configuration source",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Completed:
    """What one program run returned."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


class Runner(Protocol):
    def __call__(self, argv: Sequence[str], *, env: Mapping[str, str], timeout_s: float) -> Completed:
        """Run `argv` (no shell) with exactly `env`; raise FileNotFoundError or subprocess.TimeoutExpired."""
        ...


def run_subprocess(argv: Sequence[str], *, env: Mapping[str, str], timeout_s: float) -> Completed:
    """The real runner: `subprocess.run` with an argument list, no stdin, text output."""
    done = subprocess.run(  # an argument list, never a shell
        list(argv),
        env=dict(env),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    return Completed(tuple(argv), done.returncode, done.stdout, done.stderr)


def _quoted(argv: Sequence[str]) -> str:
    return shlex.join(argv)


class SlurmCommands:
    """Runs Slurm programs against one cluster (one `slurm.conf`)."""

    def __init__(
        self,
        slurm_conf: str | None = None,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        runner: Runner = run_subprocess,
        base_env: Mapping[str, str] | None = None,
    ) -> None:
        self.slurm_conf = slurm_conf
        self.timeout_s = timeout_s
        self.runner = runner
        env = dict(os.environ if base_env is None else base_env)
        if slurm_conf:
            env["SLURM_CONF"] = slurm_conf
        # Slurm's programs read their defaults from SLURM_*/SBATCH_*/SQUEUE_* variables; a stray one in the
        # head's environment (e.g. SQUEUE_FORMAT) would change the output we parse. Keep only SLURM_CONF.
        self.env = {k: v for k, v in env.items() if not k.startswith(("SBATCH_", "SQUEUE_", "SINFO_", "SLURM_"))}
        if "SLURM_CONF" in env:
            self.env["SLURM_CONF"] = env["SLURM_CONF"]
        self.env.setdefault("LC_ALL", "C")

    def run(
        self, argv: Sequence[str], *, timeout_s: float | None = None, extra_env: Mapping[str, str] | None = None
    ) -> str:
        """Run one Slurm program and return its stdout.

        `argv` must be a list of arguments (a str is refused: it would be one program name, or tempt a shell).
        `extra_env` is added to the program's environment (sbatch passes named variables on to the job).
        Raises Unavailable when the program is missing, times out or cannot reach slurmctld, and
        InvalidInput when Slurm refuses the request; both name the command and carry Slurm's stderr.
        """
        if isinstance(argv, str) or not argv or not all(isinstance(a, str) for a in argv):
            raise TypeError("a Slurm command is a non-empty list of str arguments, never a shell string")
        limit = self.timeout_s if timeout_s is None else timeout_s
        command = _quoted(argv)
        try:
            done = self.runner(argv, env=self.env | dict(extra_env or {}), timeout_s=limit)
        except FileNotFoundError:
            raise Unavailable(f"Slurm: {argv[0]} not found (is the Slurm client installed?): {command}") from None
        except subprocess.TimeoutExpired:
            raise Unavailable(f"Slurm: {command} did not answer within {limit:g} s") from None
        except OSError as exc:
            raise Unavailable(f"Slurm: cannot run {command}: {exc.strerror or exc}") from None
        if done.returncode == 0:
            return done.stdout
        message = (done.stderr.strip() or done.stdout.strip() or "no message").splitlines()
        detail = " / ".join(line.strip() for line in message[:5])
        if _UNREACHABLE.search(detail):
            raise Unavailable(f"Slurm unreachable: {command} exited {done.returncode}: {detail}")
        raise InvalidInput(f"Slurm refused: {command} exited {done.returncode}: {detail}")
