import pytest
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.auth import service as auth
from gpufleet.auth.models import ApiToken, TokenKind
from gpufleet.core.clock import FakeClock
from gpufleet.core.db import transaction
from gpufleet.core.errors import InvalidInput, Unauthorized
from gpufleet.inventory import service as inventory
from gpufleet.inventory.schemas import NodeSettings


def test_first_start_creates_one_admin_token_stored_hashed(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    with transaction(sessions) as s:
        token = auth.ensure_admin_token(s, clock, None)
    assert token is not None
    assert token.startswith("gfa_")
    with transaction(sessions) as s:
        assert auth.ensure_admin_token(s, clock, None) is None  # second start: nothing new
        rows = s.query(ApiToken).all()
        assert [r.kind for r in rows] == [TokenKind.ADMIN]
        assert token not in rows[0].token_hash
        assert auth.authenticate(s, clock, token).kind is TokenKind.ADMIN


def test_bootstrap_token_is_installed_once(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    secret = "automation-token-0123456789"
    for _ in range(2):
        with transaction(sessions) as s:
            assert auth.ensure_admin_token(s, clock, secret) is None
    with transaction(sessions) as s:
        assert s.query(ApiToken).count() == 1
        assert auth.authenticate(s, clock, secret).kind is TokenKind.ADMIN
    with pytest.raises(InvalidInput), transaction(sessions) as s:
        auth.ensure_admin_token(s, clock, "short")


def test_join_token_expiry_and_uses(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    with transaction(sessions) as s:
        token, _ = auth.create_join_token(s, clock, expires_in_s=60, uses=2)
    for _ in range(2):
        with transaction(sessions) as s:
            auth.consume_join_token(s, clock, token)
    with pytest.raises(Unauthorized, match="already used"), transaction(sessions) as s:
        auth.consume_join_token(s, clock, token)

    with transaction(sessions) as s:
        fresh, _ = auth.create_join_token(s, clock, expires_in_s=60, uses=1)
    clock.advance(61)
    with pytest.raises(Unauthorized, match="expired"), transaction(sessions) as s:
        auth.consume_join_token(s, clock, fresh)


def test_join_tokens_are_only_for_joining(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    with transaction(sessions) as s:
        token, _ = auth.create_join_token(s, clock, expires_in_s=60, uses=1)
        admin = auth.ensure_admin_token(s, clock, None)
    with pytest.raises(Unauthorized, match="only be used to join"), transaction(sessions) as s:
        auth.authenticate(s, clock, token)
    assert admin is not None
    with pytest.raises(Unauthorized, match="not a join token"), transaction(sessions) as s:
        auth.consume_join_token(s, clock, admin)
    with pytest.raises(Unauthorized, match="unknown"), transaction(sessions) as s:
        auth.authenticate(s, clock, "gfa_nope")


def test_new_node_credential_revokes_the_old(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    with transaction(sessions) as s:
        node = inventory.add_nodes(s, clock, ["n1"], NodeSettings())[0]
        first = auth.issue_node_credential(s, clock, node.id, node.name)
        second = auth.issue_node_credential(s, clock, node.id, node.name)
    with transaction(sessions) as s:
        who = auth.authenticate(s, clock, second)
        assert who.kind is TokenKind.NODE
        assert who.node_id == node.id
    with pytest.raises(Unauthorized, match="revoked"), transaction(sessions) as s:
        auth.authenticate(s, clock, first)
