"""The settings for switches polled over SNMP (gpufleet.network), and the agent's InfiniBand fabric report.

Kept apart from `core.config` like the directory's; `Settings` inherits these fields, so they are set like
any other (`switch_poll_interval_s = 60` in the config file, GPUFLEET_SWITCH_POLL_INTERVAL_S in the
environment). Switches themselves, and their SNMP secrets, are registered through the API, not here.
"""

from __future__ import annotations

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings


class NetworkSettings(BaseSettings):
    switch_poll_interval_s: float = Field(
        30.0, ge=1, le=3600, description="how often the leader polls every switch over SNMP"
    )
    snmp_timeout_s: float = Field(2.0, gt=0, le=60, description="how long one SNMP request may take")
    snmp_retries: int = Field(1, ge=0, le=5, description="SNMP retries after a timeout")
    switch_poll_concurrency: int = Field(8, ge=1, le=64, description="switches polled at once")
    switch_error_quiet_s: float = Field(
        300.0, ge=0, le=86400, description="how long a port's errors must stop rising before its alert resolves"
    )
    fabric_interval_s: float = Field(
        0.0,
        ge=0,
        le=86400,
        description="how often the agent reads the InfiniBand fabric with ibnetdiscover (sent when changed); 0: off",
    )

    @field_validator("fabric_interval_s")
    @classmethod
    def _fabric_interval(cls, value: float) -> float:
        # A sweep of a large fabric takes tens of seconds (ibnet.TIMEOUT_S allows 120): rounds closer than a
        # minute would have ibnetdiscover running most of the time, on every node that has it on.
        if 0 < value < 60:
            raise ValueError("must be 0 (off) or at least 60 seconds")
        return value
