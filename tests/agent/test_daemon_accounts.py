"""The agent's account task: fetch with the version it holds, apply in a thread, survive failures."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

from gpufleet.agent.accounts import AccountSync, SyncReport
from gpufleet.agent.credentials import Credential, CredentialStore
from gpufleet.agent.daemon import Agent, AgentOptions
from gpufleet.client import AgentHttp
from gpufleet.core.errors import Unavailable
from gpufleet.protocol.accounts import Account, AccountList
from gpufleet.protocol.inventory import NodeInventory

LISTING = AccountList.of([Account(username="bob", uid=20001, gid=20001)])
CREDENTIAL = Credential(server="http://head", node="n1", node_id=1, token="gfn_x")


class StubHttp:
    """Answers get_accounts like the head: the list, or None (304) when the caller holds its version."""

    def __init__(self, answers: list[Any]) -> None:
        self.answers = answers
        self.etags: list[str | None] = []

    async def get_accounts(self, credential: str, etag: str | None) -> AccountList | None:
        self.etags.append(etag)
        answer = self.answers.pop(0) if self.answers else LISTING
        if isinstance(answer, Exception):
            raise answer
        if isinstance(answer, AccountList) and answer.version == etag:
            return None
        return cast(AccountList | None, answer)


class StubSync:
    def __init__(self, failing: bool = False) -> None:
        self.applied: list[str] = []
        self.failing = failing

    def apply(self, listing: AccountList) -> SyncReport:
        self.applied.append(listing.version)
        return SyncReport(created=["bob"], failed={"bob": "boom"} if self.failing else {})


def _agent(tmp_path: Path, http: StubHttp, sync: StubSync, interval: float = 60.0) -> Agent:
    options = AgentOptions(
        server="http://head", name="n1", accounts=cast(AccountSync, sync), accounts_interval_s=interval
    )

    def read() -> NodeInventory:
        raise AssertionError("not needed")

    return Agent(options, CredentialStore(tmp_path / "credential.json"), cast(AgentHttp, http), read)


def test_an_unchanged_list_is_not_fetched_again_but_still_applied_to_repair_drift(tmp_path: Path) -> None:
    http, sync = StubHttp([LISTING, LISTING]), StubSync()
    agent = _agent(tmp_path, http, sync)

    async def scenario() -> None:
        assert await agent.sync_accounts(CREDENTIAL, cast(AccountSync, sync)) is not None
        assert await agent.sync_accounts(CREDENTIAL, cast(AccountSync, sync)) is not None  # a 304

    asyncio.run(scenario())
    assert http.etags == [None, LISTING.version]
    assert sync.applied == [LISTING.version, LISTING.version]


def test_nothing_is_applied_before_a_list_arrives(tmp_path: Path) -> None:
    http, sync = StubHttp([None]), StubSync()
    agent = _agent(tmp_path, http, sync)
    assert asyncio.run(agent.sync_accounts(CREDENTIAL, cast(AccountSync, sync))) is None
    assert sync.applied == []


def test_a_pass_with_failures_is_fetched_and_applied_again(tmp_path: Path) -> None:
    http, sync = StubHttp([LISTING, LISTING]), StubSync(failing=True)
    agent = _agent(tmp_path, http, sync)

    async def scenario() -> None:
        await agent.sync_accounts(CREDENTIAL, cast(AccountSync, sync))
        await agent.sync_accounts(CREDENTIAL, cast(AccountSync, sync))

    asyncio.run(scenario())
    assert http.etags == [None, None]
    assert sync.applied == [LISTING.version, LISTING.version]


def test_the_task_survives_failures_and_retries(tmp_path: Path) -> None:
    http = StubHttp([Unavailable("head down"), RuntimeError("bug"), LISTING])
    sync = StubSync()
    agent = _agent(tmp_path, http, sync, interval=0.01)

    async def scenario() -> None:
        task = asyncio.create_task(agent._watch_accounts(CREDENTIAL, cast(AccountSync, sync)))
        for _ in range(500):
            if sync.applied:
                break
            await asyncio.sleep(0.01)
        assert not task.done()  # neither failure ended the task (and so the channel)
        task.cancel()

    asyncio.run(scenario())
    assert sync.applied == [LISTING.version]
    assert http.etags[:3] == [None, None, None]
