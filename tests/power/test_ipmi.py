"""IPMI through ipmitool: the command line never holds the password, and against OpenIPMI's ipmi_sim
(scripts/services/ipmi.sh) status, on, off, cycle and a wrong password, alone and as a bulk task."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gpufleet.core.clock import SystemClock
from gpufleet.power import service as power
from gpufleet.power.ipmi import IpmiClient
from gpufleet.power.ports import BmcError, BmcTarget, PowerState
from gpufleet.power.schemas import PowerAction
from tests.power.conftest import IpmiBmcs

PASSWORD = "password"  # ipmi_sim's admin user (scripts/services/ipmi.sh)


def test_the_password_travels_in_the_environment_never_on_the_command_line() -> None:
    calls: list[dict[str, Any]] = []

    def run(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        calls.append({"argv": argv, **kwargs})
        return subprocess.CompletedProcess(argv, 0, "Chassis Power is on\n", "")

    client = IpmiClient(BmcTarget("ipmi", "10.0.0.9", "admin", "hunter2", port=6230), timeout_s=6, run=run)
    assert client.power_state() is PowerState.ON
    call = calls[0]
    assert call["argv"] == [
        "ipmitool", "-I", "lanplus", "-H", "10.0.0.9", "-p", "6230", "-U", "admin", "-E", "-C", "3",
        "-N", "2", "-R", "2", "chassis", "power", "status",
    ]  # fmt: skip
    assert not any("hunter2" in arg for arg in call["argv"])
    assert call["env"]["IPMI_PASSWORD"] == "hunter2"
    assert call["timeout"] == 6
    assert "shell" not in call


def test_ipmitool_failures_are_bmc_errors() -> None:
    def refused(argv: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        err = "Unable to Get Channel Cipher Suites\nError: Unable to establish IPMI v2 / RMCP+ session\n"
        return subprocess.CompletedProcess(argv, 1, "", err)

    def hangs(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        raise subprocess.TimeoutExpired(argv, kwargs["timeout"])

    target = BmcTarget("ipmi", "bmc", "admin", "x")
    with pytest.raises(BmcError, match=r"^bmc:623: Error: Unable to establish IPMI v2 / RMCP\+ session$"):
        IpmiClient(target, run=refused).power_on()
    with pytest.raises(BmcError, match="no answer within 10 s"):
        IpmiClient(target, run=hangs).power_state()
    with pytest.raises(BmcError, match="not installed"):
        IpmiClient(target, program="/nonexistent/ipmitool").power_state()


@pytest.mark.ipmi
def test_status_on_off_and_cycle_against_ipmi_sim(ipmi_bmcs: IpmiBmcs) -> None:
    target = BmcTarget("ipmi", ipmi_bmcs.host, "admin", PASSWORD, port=ipmi_bmcs.base_port)
    client = IpmiClient(target, timeout_s=10)
    clock = SystemClock()

    def act(action: PowerAction) -> power.Outcome:
        return power.act(client, action, clock=clock, confirm_timeout_s=15, poll_s=0.2)

    assert act(PowerAction.STATUS).state is PowerState.OFF
    outcome = act(PowerAction.ON)
    assert outcome.ok
    assert outcome.state is PowerState.ON
    assert ipmi_bmcs.power_file(1).read_text().strip() == "1"  # what the simulated chassis was told
    assert act(PowerAction.ON).detail == "already on"
    cycled = act(PowerAction.CYCLE)  # ipmi_sim powers off at once and on again a second later
    assert cycled.ok
    assert cycled.detail.startswith("power cycled: off, then on after")  # seen to go off: confirmed
    assert act(PowerAction.OFF).ok
    assert ipmi_bmcs.power_file(1).read_text().strip() == "0"
    wrong = IpmiClient(BmcTarget("ipmi", ipmi_bmcs.host, "admin", "wrong", port=ipmi_bmcs.base_port), timeout_s=4)
    with pytest.raises(BmcError, match="RMCP\\+ session"):
        wrong.power_state()


@pytest.mark.ipmi
def test_a_bulk_power_on_of_ipmi_nodes_through_the_api(head: TestClient, ipmi_bmcs: IpmiBmcs) -> None:
    assert head.post("/api/v1/nodes", json={"names": ["ipmi[1-2]"]}).status_code == 201
    for n in (1, 2):
        body = {
            "protocol": "ipmi",
            "address": ipmi_bmcs.host,
            "port": ipmi_bmcs.base_port + n - 1,
            "username": "admin",
            "password": PASSWORD,
        }
        assert head.put(f"/api/v1/nodes/ipmi{n}/bmc", json=body).status_code == 200
    ipmi_bmcs.power_file(1).write_text("1\n")  # the first is on already
    started = head.post("/api/v1/power/on", json={"nodes": "ipmi[1-2]"}).json()
    head.app.state.ctx.tasks.wait(started["id"], 30)  # type: ignore[attr-defined]
    task = head.get(f"/api/v1/tasks/{started['id']}").json()
    assert task["state"] == "succeeded", task
    assert [t["detail"].split(":")[0] for t in task["targets"]] == ["already on", "powered on"]
    assert ipmi_bmcs.power_file(2).read_text().strip() == "1"
    assert head.get("/api/v1/nodes/ipmi2/bmc").json()["power_state"] == "on"
