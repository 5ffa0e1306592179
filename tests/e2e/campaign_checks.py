"""What the maintenance campaign e2e tests check, apart from the campaign's own count: which nodes a watch
saw out of service while a campaign ran, and the campaign's steps as its audit log tells them."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import httpx

from tests.e2e.conftest import Head, wait_for

ENDED_BADLY = {"cancelled", "failed", "node_fail", "timeout"}


class OutWatch:
    """Polls the nodes while the campaign runs: which of them are out of service (not up, or drained) at
    each look, and which were ever out, independently of the campaign's own count."""

    def __init__(self, head: Head) -> None:
        self.head = head
        self.most = 0
        self.ever_out: set[str] = set()
        self.looks = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> OutWatch:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            try:
                nodes = self.head.nodes()
            except (httpx.HTTPError, AssertionError):
                continue  # the head is restarting
            out = {n["name"] for n in nodes if n["state"] != "up" or n["drain_reason"] is not None}
            self.most = max(self.most, len(out))
            self.ever_out |= out
            self.looks += 1


def wait_task(head: Head, answer: dict[str, Any]) -> dict[str, Any]:
    """Wait for the task an API call answered with; it must succeed."""
    path = f"/api/v1/tasks/{answer['id']}"
    wait_for(lambda: head.api("GET", path)["state"] in ("succeeded", "failed", "interrupted"), 60, 0.2)
    task: dict[str, Any] = head.api("GET", path)
    assert task["state"] == "succeeded", task
    return task


def steps(head: Head, campaign: str) -> list[dict[str, Any]]:
    """The campaign's own audit records (actor campaign:NAME), oldest first."""
    records: list[dict[str, Any]] = head.api(
        "GET", "/api/v1/audit", params={"actor": f"campaign:{campaign}", "limit": 5000}
    )
    return list(reversed(records))  # the log lists the newest first


def step_node(record: dict[str, Any]) -> str:
    """The node a step is about: targets read "CAMPAIGN: NODE ..." or "CAMPAIGN: NODE: ..."."""
    target: str = record["target"]
    return target.split(": ", 1)[1].split(" ", 1)[0].removesuffix(":")


def check_never_over(records: list[dict[str, Any]], limit: int) -> set[str]:
    """Replay the campaign's takes and returns, oldest first: never more than `limit` nodes out at any of
    its state changes. Returns the nodes still out at the end."""
    out: set[str] = set()
    for record in records:
        if record["action"] == "maintenance.take":
            out.add(step_node(record))
        elif record["action"] == "maintenance.return":
            out.discard(step_node(record))
        assert len(out) <= limit, record
    return out


def count_steps(records: list[dict[str, Any]], action: str) -> Counter[str]:
    """How many times each node had step `action` (e.g. "maintenance.take")."""
    return Counter(step_node(r) for r in records if r["action"] == action)
