"""What the root command hands its subcommands: the way to build the settings (once) and a client."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import typer

from gpufleet.client import HeadClient
from gpufleet.core import tls
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

    def client(self, token: str | None = None, *, anonymous: bool = False) -> HeadClient:
        """A client for the configured head, presenting `token`, else the configured one (unless
        `anonymous`). Raises ConfigError for plain HTTP off loopback or an unreadable ca_file."""
        settings = self.settings()
        tls.check_plain_http(settings.server, settings.insecure_http)
        if token is None and not anonymous and settings.token is not None:
            token = settings.token.get_secret_value()
        verify = tls.client_context(ca_file=settings.ca_file) if settings.ca_file else True
        return HeadClient(settings.server, token, verify=verify)


def state(ctx: typer.Context) -> CliState:
    obj = ctx.find_root().obj
    if not isinstance(obj, CliState):
        obj = CliState()
        ctx.find_root().obj = obj
    return obj
