"""The leader's directory sync: every `ldap_sync_interval_s`, read every directory user and bring the users
table in step (directory.sync.sync_users), so that a user removed from a group, disabled or deleted in the
directory loses what it gave them within one interval, even without logging in again.

Only the leader runs it (one reader of the directory per cluster, not one per head process). The directory
is read outside any transaction; a directory that cannot be reached changes nothing (a down directory must
not disable everyone) and is recorded as the sync's error for the admin's view.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from sqlalchemy.orm import Session, sessionmaker

from gpufleet.core.clock import Clock
from gpufleet.core.loops import run_periodic
from gpufleet.directory import sync
from gpufleet.directory.mapping import GroupMapping
from gpufleet.directory.sync import Directory


@dataclass
class DirectoryLoops:
    sessions: sessionmaker[Session]
    clock: Clock
    directory: Directory
    mapping: GroupMapping
    interval_s: float
    is_leader: Callable[[], bool]

    def sync_once(self) -> sync.SyncReport | None:
        """Read the directory and apply it. None when the directory could not be read (recorded)."""
        return sync.refresh(self.sessions, self.clock, self.directory, self.mapping)

    async def run(self, stop: asyncio.Event) -> None:
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="directory")

        def step_in_thread() -> None:
            if self.is_leader():
                self.sync_once()

        async def step() -> None:
            await asyncio.get_running_loop().run_in_executor(executor, step_in_thread)

        try:
            await run_periodic("directory", self.interval_s, step, stop)
        finally:
            executor.shutdown(wait=False)
