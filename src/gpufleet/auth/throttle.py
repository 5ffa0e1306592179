"""Slow down password guessing: after a few failures, a user name or a source address must wait.

The wait doubles with every further failure (1 s, 2 s, 4 s ... up to `max_delay_s`) and is enforced
before the password is checked, so a guesser learns nothing and costs the head no argon2 work while
waiting. Both the user name and the address count: one address trying many names, and many
addresses trying one name, are both slowed. A success clears the name's count, not the address's.

The counts live in memory, per head replica: a restart or another replica forgets them. That bounds
an attacker to a few guesses per replica per restart on top of the schedule, which argon2 and the
password policy make harmless; keeping them in the database would turn every failed login into a write.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from gpufleet.core.clock import Clock


@dataclass
class _Failures:
    count: int
    last_at: float


class LoginThrottle:
    def __init__(
        self,
        clock: Clock,
        *,
        free_failures: int = 3,
        base_delay_s: float = 1.0,
        max_delay_s: float = 60.0,
        forget_after_s: float = 3600.0,
        max_keys: int = 100_000,
    ) -> None:
        self.clock = clock
        self.free_failures = free_failures
        self.base_delay_s = base_delay_s
        self.max_delay_s = max_delay_s
        self.forget_after_s = forget_after_s
        self.max_keys = max_keys  # bounds memory when an attacker sprays random names
        self._failures: OrderedDict[str, _Failures] = OrderedDict()
        self._lock = threading.Lock()  # login routes run in FastAPI's worker threads

    @staticmethod
    def _keys(username: str, source: str) -> tuple[str, str]:
        return f"user:{username.lower()}", f"addr:{source}"

    def _delay(self, failures: _Failures) -> float:
        excess = failures.count - self.free_failures
        if excess < 0:
            return 0.0
        return float(min(self.base_delay_s * 2**excess, self.max_delay_s))

    def wait_s(self, username: str, source: str) -> float:
        """Seconds the caller must still wait before this attempt may be checked; 0 when it may."""
        now = self.clock.now()
        wait = 0.0
        with self._lock:
            for key in self._keys(username, source):
                failures = self._failures.get(key)
                if failures is None:
                    continue
                if now - failures.last_at > self.forget_after_s:
                    del self._failures[key]
                    continue
                wait = max(wait, failures.last_at + self._delay(failures) - now)
        return max(wait, 0.0)

    def failed(self, username: str, source: str) -> None:
        now = self.clock.now()
        with self._lock:
            for key in self._keys(username, source):
                failures = self._failures.pop(key, None) or _Failures(0, now)
                failures.count += 1
                failures.last_at = now
                self._failures[key] = failures  # most recent last, so eviction drops the oldest
            while len(self._failures) > self.max_keys:
                self._failures.popitem(last=False)

    def succeeded(self, username: str) -> None:
        with self._lock:
            self._failures.pop(self._keys(username, "")[0], None)
