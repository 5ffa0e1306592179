"""A head process answers a repeated API token from memory for `auth_cache_s`, and forgets it when tokens
or users change: at once for a change it commits, within `auth_cache_s` for one it does not see."""

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, event, update
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.api.app import create_app
from gpufleet.auth.models import ApiToken, TokenKind
from gpufleet.auth.principal_cache import PrincipalCache
from gpufleet.auth.schemas import Principal
from gpufleet.core.clock import FakeClock, to_datetime
from gpufleet.core.config import load_settings
from gpufleet.core.db import make_engine, make_session_factory, transaction

pytestmark = pytest.mark.one_database


class TokenReads:
    """Counts the statements that read api_tokens."""

    def __init__(self, engine: Engine) -> None:
        self.count = 0
        event.listen(engine, "before_cursor_execute", self._seen)

    def _seen(self, _conn: object, _cursor: object, statement: str, *_: object) -> None:
        if statement.lstrip().upper().startswith("SELECT") and "FROM api_tokens" in statement:
            self.count += 1


def _app(tmp_path: Path, sessions: sessionmaker[Session], clock: FakeClock, token: str, ttl_s: float) -> TestClient:
    settings = load_settings(client_file=tmp_path / "none.toml", data_dir=tmp_path, auth_cache_s=ttl_s)
    app = create_app(settings, sessions, clock, run_loops=False)
    return TestClient(app, headers={"Authorization": f"Bearer {token}"})


@pytest.fixture
def alice(client: TestClient) -> str:
    """A member's API token."""
    assert client.post("/api/v1/users", json={"username": "alice"}).status_code == 201
    made = client.post("/api/v1/tokens/user", json={"user": "alice", "expires_in_s": 3600})
    assert made.status_code == 201
    token: str = made.json()["token"]
    return token


@pytest.fixture
def reads(engine: Engine) -> Iterator[TokenReads]:
    counter = TokenReads(engine)
    yield counter
    event.remove(engine, "before_cursor_execute", counter._seen)


def _whoami(client: TestClient, token: str) -> int:
    return client.get("/api/v1/whoami", headers={"Authorization": f"Bearer {token}"}).status_code


def test_a_repeated_token_is_read_twice(
    tmp_path: Path, sessions: sessionmaker[Session], clock: FakeClock, alice: str, reads: TokenReads
) -> None:
    """The first use is recorded (a write to api_tokens, which empties the cache), the second is kept
    (for a minute here, so that a slow machine cannot let it lapse between the calls)."""
    with _app(tmp_path, sessions, clock, alice, ttl_s=60) as client:
        assert [_whoami(client, alice) for _ in range(5)] == [200] * 5
    assert reads.count == 2


def test_a_revoked_token_or_a_disabled_user_is_refused_at_once(
    client: TestClient, alice: str, reads: TokenReads
) -> None:
    assert _whoami(client, alice) == 200
    assert client.patch("/api/v1/users/alice", json={"enabled": False}).status_code == 200
    assert _whoami(client, alice) == 401
    assert client.patch("/api/v1/users/alice", json={"enabled": True}).status_code == 200
    assert _whoami(client, alice) == 200
    assert client.patch("/api/v1/users/alice", json={"role": "viewer"}).status_code == 200
    me = client.get("/api/v1/whoami", headers={"Authorization": f"Bearer {alice}"})
    assert me.json()["role"] == "viewer"
    token_id = next(t["id"] for t in client.get("/api/v1/tokens").json() if t.get("user") == "alice")
    assert client.delete(f"/api/v1/tokens/{token_id}").status_code == 204
    assert _whoami(client, alice) == 401


def test_an_expired_token_is_refused_though_kept(
    tmp_path: Path, sessions: sessionmaker[Session], clock: FakeClock, alice: str, reads: TokenReads
) -> None:
    with _app(tmp_path, sessions, clock, alice, ttl_s=60) as client:
        assert [_whoami(client, alice) for _ in range(2)] == [200, 200]  # the second is kept
        kept = reads.count
        clock.advance(3601)
        assert _whoami(client, alice) == 401
        assert reads.count == kept + 1  # not answered from memory: read, and refused


def test_a_change_another_process_commits_is_seen_within_the_ttl(
    tmp_path: Path, db_url: str, sessions: sessionmaker[Session], clock: FakeClock, admin_token: str
) -> None:
    other = make_engine(db_url)  # another head process's engine: its commits are not watched here
    try:
        with _app(tmp_path, sessions, clock, admin_token, ttl_s=0.3) as client:
            assert _whoami(client, admin_token) == 200
            with transaction(make_session_factory(other)) as s:
                s.execute(update(ApiToken).values(revoked_at=to_datetime(clock.now())))
            deadline = time.monotonic() + 0.3 + 5.0  # the ttl, and room for a slow machine
            while _whoami(client, admin_token) == 200:
                assert time.monotonic() < deadline, "the revoked token still worked after the ttl"
                time.sleep(0.05)
    finally:
        other.dispose()


def test_no_cache_reads_every_time(
    tmp_path: Path, sessions: sessionmaker[Session], clock: FakeClock, admin_token: str, reads: TokenReads
) -> None:
    with _app(tmp_path, sessions, clock, admin_token, ttl_s=0) as client:
        assert [_whoami(client, admin_token) for _ in range(3)] == [200] * 3
    assert reads.count == 3


def test_what_is_kept_and_what_is_not() -> None:
    cache = PrincipalCache(ttl_s=60)
    now = to_datetime(1.8e9)
    api = Principal(kind=TokenKind.ADMIN, token_id=1, use_unrecorded=True)
    cache.put("a", api, cache.generation)
    kept = cache.get("a", now)
    assert kept is not None
    assert kept.token_id == 1
    assert not kept.use_unrecorded  # the use was recorded once, not at every hit
    for kind in (TokenKind.SESSION, TokenKind.NODE):  # a logout, a removed node: at once everywhere
        cache.put(kind.value, Principal(kind=kind, token_id=2), cache.generation)
        assert cache.get(kind.value, now) is None
    read_before = cache.generation
    cache.clear()  # a change committed while the read was under way: its answer may be the old state
    cache.put("b", api, read_before)
    assert cache.get("b", now) is None
    assert cache.get("a", now) is None  # emptied
