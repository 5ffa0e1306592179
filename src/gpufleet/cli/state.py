"""What the root command hands its subcommands: the way to build the settings (once) and a client."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import typer

from gpufleet.client import HeadClient
from gpufleet.core.config import Settings, load_settings


@dataclass
class CliState:
    config_file: Path | None = None
    overrides: dict[str, Any] = field(default_factory=dict)
    _settings: Settings | None = None

    def settings(self, **extra: Any) -> Settings:
        """Build the settings once: file and environment, then root options, then the subcommand's own."""
        if self._settings is None:
            merged = {**self.overrides, **{k: v for k, v in extra.items() if v is not None}}
            self._settings = load_settings(self.config_file, **merged)
        return self._settings

    def client(self) -> HeadClient:
        settings = self.settings()
        token = settings.token.get_secret_value() if settings.token else None
        return HeadClient(settings.server, token)


def state(ctx: typer.Context) -> CliState:
    obj = ctx.find_root().obj
    if not isinstance(obj, CliState):
        obj = CliState()
        ctx.find_root().obj = obj
    return obj
