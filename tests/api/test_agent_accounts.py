"""GET /api/v1/agent/accounts: every user's POSIX account for the nodes, with an ETag, for node credentials only."""

from fastapi.testclient import TestClient

from gpufleet.protocol.accounts import AccountList

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHRoaXNpc25vdGFyZWFsa2V5anVzdGFmaXh0dXJlISE bob@laptop"
URL = "/api/v1/agent/accounts"


def _node(client: TestClient) -> dict[str, str]:
    join = client.post("/api/v1/tokens/join", json={"expires_in_s": 600}).json()["token"]
    response = client.post("/api/v1/agent/join", json={"name": "n1"}, headers={"Authorization": f"Bearer {join}"})
    assert response.status_code == 200, response.text
    return {"Authorization": f"Bearer {response.json()['credential']}"}


def test_accounts_list_enabled_and_disabled_users_with_an_etag(client: TestClient) -> None:
    node = _node(client)
    for body in (
        {"username": "bob", "full_name": "Bob B", "uid": 20001, "ssh_keys": [KEY]},
        {"username": "carol", "uid": 20002, "gid": 3000, "shell": "/bin/zsh", "password": "a-long-passphrase-9"},
    ):
        assert client.post("/api/v1/users", json=body).status_code == 201
    assert client.patch("/api/v1/users/carol", json={"enabled": False}).status_code == 200

    response = client.get(URL, headers=node)
    assert response.status_code == 200
    listing = AccountList.model_validate(response.json())
    assert [a.model_dump(exclude_none=True) for a in listing.accounts] == [
        {"username": "bob", "full_name": "Bob B", "uid": 20001, "gid": 20001, "shell": "/bin/bash",
         "ssh_keys": [KEY], "enabled": True},
        {"username": "carol", "full_name": "", "uid": 20002, "gid": 3000, "shell": "/bin/zsh",
         "ssh_keys": [], "enabled": False},
    ]  # fmt: skip
    assert "password" not in response.text
    assert "argon2" not in response.text
    assert '"home"' not in response.text  # none of them has one of its own: an older agent reads the list
    etag = response.headers["etag"]
    assert etag == f'"{listing.version}"'

    # The version the node holds: 304, no body. Lists and weak tags are understood too.
    for header in (etag, f'"other", W/{etag}', "*"):
        unchanged = client.get(URL, headers=node | {"If-None-Match": header})
        assert unchanged.status_code == 304, header
        assert unchanged.content == b""
        assert unchanged.headers["etag"] == etag
    assert client.get(URL, headers=node | {"If-None-Match": '"stale"'}).status_code == 200

    # A change makes a new version, and the old ETag gets the whole list again.
    assert client.patch("/api/v1/users/bob", json={"shell": "/bin/sh"}).status_code == 200
    changed = client.get(URL, headers=node | {"If-None-Match": etag})
    assert changed.status_code == 200
    assert changed.headers["etag"] != etag
    assert changed.json()["accounts"][0]["shell"] == "/bin/sh"


def test_accounts_are_for_node_credentials_only(client: TestClient) -> None:
    assert client.get(URL).status_code == 403  # the client fixture's admin token
    assert client.get(URL, headers={"Authorization": ""}).status_code == 401
