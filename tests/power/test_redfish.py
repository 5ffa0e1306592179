"""Redfish: the client's choices against canned BMC answers, then the real thing: sushy-emulator's fake
driver (scripts/services/redfish.sh), whose power changes land 1 to 11 s after the request. The bulk
power-on of 32 emulated BMCs through the API is the issue's must-show: progress while it runs, 32
per-node results, the states kept, and the audit record."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from gpufleet.power.ports import BmcError, BmcTarget, PowerState
from gpufleet.power.redfish import RedfishClient
from tests.power.conftest import REDFISH_SYSTEMS, system_id

TARGET = BmcTarget("redfish", "https://bmc.example", "root", "calvin")


def canned(
    allowed: list[str] | None, members: int = 1, info: bool = False
) -> tuple[httpx.MockTransport, list[tuple[str, str, Any]]]:
    """A BMC with `members` systems whose Reset action allows `allowed` (None: it does not say;
    with `info`, it says in an ActionInfo resource instead)."""
    seen: list[tuple[str, str, Any]] = []
    action: dict[str, Any] = {"target": "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset"}
    if allowed is not None and not info:
        action["ResetType@Redfish.AllowableValues"] = allowed
    if info:
        action["@Redfish.ActionInfo"] = "/redfish/v1/Systems/1/ResetActionInfo"

    def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        seen.append((request.method, request.url.path, body))
        assert request.headers["authorization"].startswith("Basic ")
        path = request.url.path
        if path == "/redfish/v1/Systems":
            return httpx.Response(
                200, json={"Members": [{"@odata.id": f"/redfish/v1/Systems/{i}"} for i in range(1, members + 1)]}
            )
        if path == "/redfish/v1/Systems/1":
            return httpx.Response(200, json={"PowerState": "PoweringOn", "Actions": {"#ComputerSystem.Reset": action}})
        if path.endswith("ResetActionInfo"):
            return httpx.Response(200, json={"Parameters": [{"Name": "ResetType", "AllowableValues": allowed}]})
        if path.endswith("ComputerSystem.Reset"):
            if allowed is None and body["ResetType"] == "PowerCycle":
                error = {"error": {"@Message.ExtendedInfo": [{"Message": "PowerCycle is not supported."}]}}
                return httpx.Response(400, json=error)
            return httpx.Response(204)
        return httpx.Response(404, json={"error": {"message": "no such resource"}})

    return httpx.MockTransport(answer), seen


def test_each_action_sends_the_reset_type_the_bmc_allows() -> None:
    transport, seen = canned(["On", "ForceOff", "GracefulShutdown", "ForceRestart"])
    client = RedfishClient(TARGET, transport=transport)
    assert client.power_state() is PowerState.UNKNOWN  # PoweringOn is neither on nor off yet
    client.power_on()
    client.power_off()
    client.power_cycle()  # no PowerCycle here: ForceRestart
    client.reset()
    posted = [body["ResetType"] for method, _, body in seen if method == "POST"]
    assert posted == ["On", "ForceOff", "ForceRestart", "ForceRestart"]
    assert seen[0][1] == "/redfish/v1/Systems"  # no system id: the only member is found


def test_allowable_values_from_action_info_and_refusals_are_bmc_errors() -> None:
    transport, seen = canned(["ForceOn", "ForceOff"], info=True)
    client = RedfishClient(TARGET, transport=transport)
    client.power_on()
    assert [b for m, _, b in seen if m == "POST"] == [{"ResetType": "ForceOn"}]
    with pytest.raises(BmcError, match="allows none of PowerCycle, ForceRestart, GracefulRestart"):
        client.power_cycle()
    transport, _ = canned(None)  # says nothing: the first preference is tried, the BMC's refusal reported
    with pytest.raises(BmcError, match="HTTP 400: PowerCycle is not supported"):
        RedfishClient(TARGET, transport=transport).power_cycle()
    transport, _ = canned(["On"], members=2)
    with pytest.raises(BmcError, match=r"has 2 systems .*set the node's Redfish system id"):
        RedfishClient(TARGET, transport=transport).power_state()


@pytest.mark.redfish
def test_the_emulator_answers_state_refuses_an_unknown_system_and_a_dead_bmc_fails(redfish_url: str) -> None:
    client = RedfishClient(BmcTarget("redfish", redfish_url, "u", "p", system_id=system_id(33)), timeout_s=5)
    assert client.power_state() is PowerState.OFF
    target, allowed = client.allowed_reset_types()
    assert target.endswith(f"{system_id(33)}/Actions/ComputerSystem.Reset")
    assert allowed is not None
    assert "PowerCycle" not in allowed
    assert "ForceRestart" in allowed
    with pytest.raises(BmcError, match=f"{REDFISH_SYSTEMS} systems"):
        RedfishClient(BmcTarget("redfish", redfish_url, "u", "p"), timeout_s=5).power_state()
    with pytest.raises(BmcError, match="HTTP 404"):
        RedfishClient(BmcTarget("redfish", redfish_url, "u", "p", system_id="nope"), timeout_s=5).power_state()
    with pytest.raises(BmcError, match="Connection refused"):
        RedfishClient(BmcTarget("redfish", "http://127.0.0.1:9", "u", "p", system_id="1"), timeout_s=2).power_on()


def _follow(head: TestClient, task_id: int, timeout_s: float = 45) -> tuple[dict[str, Any], list[int]]:
    """The task once it ended, and the `done` counts seen while it ran."""
    seen: list[int] = []
    deadline = time.monotonic() + timeout_s
    while True:
        task: dict[str, Any] = head.get(f"/api/v1/tasks/{task_id}").json()
        seen.append(task["done"])
        if task["state"] in ("succeeded", "failed", "interrupted") or time.monotonic() > deadline:
            return task, seen
        time.sleep(0.25)


@pytest.mark.redfish
def test_bulk_power_on_of_32_emulated_bmcs_with_progress_results_and_audit(
    heavy: None, head: TestClient, redfish_url: str
) -> None:
    assert head.post("/api/v1/nodes", json={"names": ["gpu[01-32]", "spare[1-3]"]}).status_code == 201
    bmcs = {f"gpu{n:02d}": (redfish_url, system_id(n)) for n in range(1, 33)}
    bmcs |= {"spare1": (redfish_url, system_id(35)), "spare2": (redfish_url, system_id(36))}  # on at start
    bmcs["spare3"] = ("http://127.0.0.1:9", "1")  # a BMC that does not answer: nothing listens there
    for node, (address, system) in bmcs.items():
        body = {"protocol": "redfish", "address": address, "system_id": system, "username": "admin", "password": "pw"}
        assert head.put(f"/api/v1/nodes/{node}/bmc", json=body).status_code == 200

    started = head.post("/api/v1/power/on", json={"nodes": "gpu[01-32]", "limit": 32, "stagger_s": 0.02})
    assert started.status_code == 202, started.text
    # Meanwhile, off on two others and the dead one: only the dead one fails.
    off = head.post("/api/v1/power/off", json={"nodes": "spare[1-3]"})
    assert off.status_code == 202, off.text
    task, progress = _follow(head, started.json()["id"])
    assert task["state"] == "succeeded", task["summary"]
    assert (task["total"], task["done"], task["failed"]) == (32, 32, 0)
    assert progress == sorted(progress)
    assert any(0 < done < 32 for done in progress)
    assert [t["target"] for t in task["targets"]] == [f"gpu{n:02d}" for n in range(1, 33)]
    for target in task["targets"]:
        assert target["state"] == "ok"
        assert target["data"]["power_state"] == "on"
        assert target["detail"].startswith("powered on: on after ")
    assert task["summary"] == "power on gpu[01-32]: 32 on"
    # The fake driver really took its time: the node's state was read again until it showed.
    assert max(t["data"]["seconds"] for t in task["targets"]) >= 1.0
    states = head.get("/api/v1/power", params={"nodes": "gpu[01-32]"}).json()
    assert {s["power_state"] for s in states} == {"on"}
    assert all(s["power_read_at"] for s in states)

    task, _ = _follow(head, off.json()["id"])
    results = {t["target"]: (t["state"], t["detail"]) for t in task["targets"]}
    assert results["spare3"][0] == "failed"
    assert "Connection refused" in results["spare3"][1]
    assert results["spare1"][0] == results["spare2"][0] == "ok"
    assert results["spare1"][1].startswith("powered off: off after ")
    assert task["summary"] == "power off spare[1-3]: 2 off, 1 failed"
    audit = {r["target"]: r["result"] for r in head.get("/api/v1/audit").json() if r["action"] == "power.power_action"}
    assert audit == {
        f"task {started.json()['id']}: power on gpu[01-32]": 202,
        f"task {off.json()['id']}: power off spare[1-3]": 202,
    }
    status = head.post("/api/v1/power/status", json={"nodes": "gpu01,spare[1-3]"}).json()
    task, _ = _follow(head, status["id"])
    assert [t["detail"] for t in task["targets"]][:3] == ["on", "off", "off"]
    assert task["targets"][3]["state"] == "failed"
