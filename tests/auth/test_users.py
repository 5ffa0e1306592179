import pytest
from pydantic import SecretStr
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.auth import passwords, users
from gpufleet.auth import service as auth
from gpufleet.auth.models import ApiToken
from gpufleet.auth.policy import Permission, Role, allowed
from gpufleet.auth.schemas import UserCreate, UserUpdate
from gpufleet.core.clock import FakeClock
from gpufleet.core.db import transaction
from gpufleet.core.errors import Conflict, InvalidInput, NotFound, Unauthorized

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGxkZXJ0ZXN0a2V5Zm9ydGVzdGluZ29ubHkx alice@laptop"


def test_users_get_posix_identities_and_hashed_passwords(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    with transaction(sessions) as s:
        alice = users.create_user(
            s, clock, UserCreate(username="alice", password=SecretStr("correct horse battery"), ssh_keys=[KEY])
        )
        bob = users.create_user(s, clock, UserCreate(username="bob", role=Role.VIEWER, uid=20000, gid=3000))
        carol = users.create_user(s, clock, UserCreate(username="carol"))
    assert (alice.uid, alice.gid) == (10000, 10000)
    assert (bob.uid, bob.gid) == (20000, 3000)
    assert carol.uid == 20001  # the next free uid
    assert alice.password_hash is not None
    assert "correct horse" not in alice.password_hash
    assert passwords.verify(alice.password_hash, "correct horse battery")
    assert not passwords.verify(alice.password_hash, "wrong horse battery")
    assert bob.password_hash is None


@pytest.mark.parametrize(
    ("spec", "error"),
    [
        ({"username": "Alice"}, InvalidInput),
        ({"username": "x" * 33}, InvalidInput),
        ({"username": "dave", "password": "short"}, InvalidInput),
        ({"username": "dave", "password": "dave-is-my-password"}, InvalidInput),
        ({"username": "dave", "password": "aaaaaaaaaaaaaa"}, InvalidInput),
        ({"username": "dave", "role": "node"}, InvalidInput),
        ({"username": "alice"}, Conflict),
        ({"username": "dave", "uid": 10000}, Conflict),
    ],
)
def test_bad_users_change_nothing(
    sessions: sessionmaker[Session], clock: FakeClock, spec: dict[str, object], error: type[Exception]
) -> None:
    with transaction(sessions) as s:
        users.create_user(s, clock, UserCreate(username="alice"))
    with pytest.raises(error), transaction(sessions) as s:
        users.create_user(s, clock, UserCreate.model_validate(spec))
    with transaction(sessions) as s:
        assert [u.username for u in users.list_users(s)] == ["alice"]


def test_user_tokens_follow_the_user(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    with transaction(sessions) as s:
        alice = users.create_user(s, clock, UserCreate(username="alice", role=Role.OPERATOR))
        token, row = auth.create_user_token(s, clock, alice, 3600, "write")
        reader, _ = auth.create_user_token(s, clock, alice, 3600, "read")
    with transaction(sessions) as s:
        who = auth.authenticate(s, clock, token)
    assert (who.role, who.user, who.actor) == (Role.OPERATOR, "alice", "user:alice")
    assert allowed(who.role, Permission.NODES_WRITE, who.scope)
    with transaction(sessions) as s:
        ro = auth.authenticate(s, clock, reader)
    assert allowed(ro.role, Permission.NODES_READ, ro.scope)
    assert not allowed(ro.role, Permission.NODES_WRITE, ro.scope)

    with transaction(sessions) as s:
        users.update_user(s, clock, "alice", UserUpdate(role=Role.VIEWER))
        assert auth.authenticate(s, clock, token).role is Role.VIEWER  # a role change applies at once
        users.update_user(s, clock, "alice", UserUpdate(enabled=False))
    with pytest.raises(Unauthorized, match="disabled"), transaction(sessions) as s:
        auth.authenticate(s, clock, token)
    with transaction(sessions) as s:
        users.update_user(s, clock, "alice", UserUpdate(enabled=True))
        auth.revoke_token(s, clock, row.id)
    with pytest.raises(Unauthorized, match="revoked"), transaction(sessions) as s:
        auth.authenticate(s, clock, token)
    with transaction(sessions) as s:
        users.delete_user(s, "alice")
    with transaction(sessions) as s:
        assert s.query(ApiToken).count() == 0  # the user's tokens went with them
    with pytest.raises(NotFound), transaction(sessions) as s:
        users.get_user(s, "alice")
