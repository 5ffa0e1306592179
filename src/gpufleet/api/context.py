"""What the app's routes share: settings, the session factory, the clock and the live channel hub."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.orm import Session, sessionmaker

from gpufleet.api.hub import ChannelHub
from gpufleet.core.clock import Clock
from gpufleet.core.config import Settings
from gpufleet.workers.head_loops import HeadLoops


@dataclass
class HeadContext:
    settings: Settings
    sessions: sessionmaker[Session]
    clock: Clock
    hub: ChannelHub
    loops: HeadLoops
