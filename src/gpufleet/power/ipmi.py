"""An IPMI BMC through ipmitool over lanplus (IPMI 2.0, RMCP+).

The password never appears on a command line, where `ps` and /proc/PID/cmdline would show it to
every user of the head: ipmitool reads it from the IPMI_PASSWORD environment variable (`-E`), and the
child gets a minimal environment of its own. Every call is an argument list with a timeout.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Sequence

from gpufleet.power.ports import IPMI_PORT, BmcError, BmcTarget, PowerState

Run = Callable[..., "subprocess.CompletedProcess[str]"]
DEFAULT_CIPHER_SUITE = 3  # AES-128, HMAC-SHA1: what ipmitool negotiates with most BMCs; 17 on newer ones
_STATES = {"Chassis Power is on": PowerState.ON, "Chassis Power is off": PowerState.OFF}


class IpmiClient:
    """One BMC, reached by `ipmitool -I lanplus`. `run` is injectable for unit tests."""

    def __init__(
        self,
        target: BmcTarget,
        *,
        timeout_s: float = 10.0,
        cipher_suite: int = DEFAULT_CIPHER_SUITE,
        program: str = "ipmitool",
        run: Run = subprocess.run,
    ) -> None:
        if target.address.startswith("-"):
            raise BmcError(f"{target.address!r} is not a BMC address")  # never an option to ipmitool
        self._target = target
        self._timeout_s = timeout_s
        self._cipher_suite = cipher_suite
        self._program = program
        self._run = run

    def argv(self, *command: str) -> list[str]:
        """The command line for `command` (no password in it: see the module's docstring)."""
        t = self._target
        # -N: seconds per try, -R: tries; both kept inside the subprocess' own timeout.
        per_try = max(1, int(self._timeout_s / 3))
        return [
            self._program,
            "-I",
            "lanplus",
            "-H",
            t.address,
            "-p",
            str(t.port or IPMI_PORT),
            "-U",
            t.username,
            "-E",
            "-C",
            str(self._cipher_suite),
            "-N",
            str(per_try),
            "-R",
            "2",
            *command,
        ]

    def environment(self) -> dict[str, str]:
        return {
            "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
            "LC_ALL": "C",  # the output is parsed
            "IPMI_PASSWORD": self._target.password,
        }

    # The BmcClient protocol
    def power_state(self) -> PowerState:
        out = self._ipmitool(["chassis", "power", "status"])
        for line in out.splitlines():
            state = _STATES.get(line.strip())
            if state is not None:
                return state
        raise BmcError(f"{self._where()}: unexpected answer {out.strip()[:200]!r}")

    def power_on(self) -> None:
        self._ipmitool(["chassis", "power", "on"])

    def power_off(self) -> None:
        self._ipmitool(["chassis", "power", "off"])

    def power_cycle(self) -> None:
        self._ipmitool(["chassis", "power", "cycle"])

    def reset(self) -> None:
        self._ipmitool(["chassis", "power", "reset"])

    def _where(self) -> str:
        return f"{self._target.address}:{self._target.port or IPMI_PORT}"

    def _ipmitool(self, command: Sequence[str]) -> str:
        try:
            done = self._run(
                self.argv(*command),
                env=self.environment(),
                capture_output=True,
                text=True,
                timeout=self._timeout_s,
                stdin=subprocess.DEVNULL,
                check=False,
            )
        except FileNotFoundError:
            raise BmcError(f"{self._program} is not installed on the head (apt-get install ipmitool)") from None
        except subprocess.TimeoutExpired:
            raise BmcError(f"{self._where()}: no answer within {self._timeout_s:g} s") from None
        if done.returncode != 0:
            lines = [ln.strip() for ln in (done.stderr or done.stdout or "").splitlines() if ln.strip()]
            # ipmitool repeats itself per retry and warns about cipher suites; the last line says why.
            raise BmcError(f"{self._where()}: {lines[-1][:300] if lines else f'ipmitool exited {done.returncode}'}")
        return done.stdout or ""
