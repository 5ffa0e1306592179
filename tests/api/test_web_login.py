"""Dashboard login: password, server-side session cookie, CSRF, slowed-down guessing, audit."""

import re

import pytest
from fastapi.testclient import TestClient

from gpufleet.core.clock import FakeClock

# Pages, forms and input parsing: HTTP translation, the same on both databases (the domain tests run both).
pytestmark = pytest.mark.one_database

PASSWORD = "correct horse battery"


def _make_user(client: TestClient, name: str = "alice", role: str = "viewer") -> None:
    spec = {"username": name, "role": role, "password": PASSWORD}
    assert client.post("/api/v1/users", json=spec).status_code == 201


def _browser(client: TestClient) -> TestClient:
    return TestClient(client.app)


def _login(browser: TestClient, username: str, password: str) -> tuple[int, str]:
    form = browser.get("/login")
    found = re.search(r'name="csrf" value="([^"]+)"', form.text)
    assert found is not None
    response = browser.post(
        "/login",
        data={"username": username, "password": password, "csrf": found.group(1)},
        follow_redirects=False,
    )
    return response.status_code, response.text


def _csrf(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found is not None
    return found.group(1)


def test_login_gives_a_session_the_dashboard_accepts(client: TestClient) -> None:
    _make_user(client)
    client.post("/api/v1/nodes", json={"names": ["gpu[001-002]"]})
    browser = _browser(client)
    assert browser.get("/", follow_redirects=False).headers["location"] == "/login"
    form = browser.get("/login")
    found = re.search(r'name="csrf" value="([^"]+)"', form.text)
    assert found is not None
    response = browser.post(
        "/login", data={"username": "alice", "password": PASSWORD, "csrf": found.group(1)}, follow_redirects=False
    )
    assert response.status_code == 303
    cookie = response.headers["set-cookie"].lower()
    assert "gpufleet_session=" in cookie
    assert "httponly" in cookie
    assert "samesite=lax" in cookie
    assert PASSWORD not in response.text
    page = browser.get("/")
    assert page.status_code == 200
    assert "gpu001" in page.text
    assert ">alice<" in page.text


def test_login_without_the_form_csrf_value_is_refused(client: TestClient) -> None:
    _make_user(client)
    browser = _browser(client)
    browser.get("/login")  # has the cookie, but a forged form cannot know its value
    forged = browser.post("/login", data={"username": "alice", "password": PASSWORD, "csrf": "guess"})
    assert forged.status_code == 403
    assert "gpufleet_session" not in browser.cookies
    fresh = _browser(client)  # no cookie at all: the other site's own request
    assert fresh.post("/login", data={"username": "alice", "password": PASSWORD}).status_code == 403


def test_wrong_password_and_unknown_user_get_the_same_answer(client: TestClient) -> None:
    _make_user(client)
    status_wrong, page_wrong = _login(_browser(client), "alice", "not the password")
    status_unknown, page_unknown = _login(_browser(client), "mallory", "not the password")
    assert status_wrong == status_unknown == 401
    assert "unknown user name or wrong password" in page_wrong
    assert "unknown user name or wrong password" in page_unknown


def test_disabled_users_cannot_log_in_and_their_sessions_end(client: TestClient) -> None:
    _make_user(client)
    browser = _browser(client)
    assert _login(browser, "alice", PASSWORD)[0] == 303
    assert client.patch("/api/v1/users/alice", json={"enabled": False}).status_code == 200
    assert browser.get("/", follow_redirects=False).status_code == 303  # back to the login page
    assert _login(_browser(client), "alice", PASSWORD)[0] == 401


def test_the_session_cookie_works_on_the_api_but_changes_need_the_csrf_token(client: TestClient) -> None:
    _make_user(client, role="operator")
    browser = _browser(client)
    assert _login(browser, "alice", PASSWORD)[0] == 303
    assert browser.get("/api/v1/nodes").status_code == 200
    refused = browser.post("/api/v1/nodes", json={"names": ["n1"]})
    assert refused.status_code == 403
    assert "CSRF" in refused.json()["detail"]
    csrf = _csrf(browser.get("/").text)
    assert browser.post("/api/v1/nodes", json={"names": ["n1"]}, headers={"X-CSRF-Token": csrf}).status_code == 201
    audit = client.get("/api/v1/audit", params={"actor": "user:alice"}).json()
    assert [(r["action"], r["result"]) for r in reversed(audit)] == [
        ("web_login.login", 303),
        ("nodes.add_nodes", 403),
        ("nodes.add_nodes", 201),
    ]


def test_a_session_secret_is_not_a_bearer_token(client: TestClient) -> None:
    _make_user(client)
    browser = _browser(client)
    _login(browser, "alice", PASSWORD)
    secret = browser.cookies["gpufleet_session"]
    response = _browser(client).get("/api/v1/nodes", headers={"Authorization": f"Bearer {secret}"})
    assert response.status_code == 401


def test_logout_ends_the_session_on_the_server(client: TestClient) -> None:
    _make_user(client)
    browser = _browser(client)
    _login(browser, "alice", PASSWORD)
    secret = browser.cookies["gpufleet_session"]
    csrf = _csrf(browser.get("/").text)
    assert browser.post("/logout", data={"csrf": csrf}, follow_redirects=False).status_code == 303
    replay = _browser(client)
    replay.cookies.set("gpufleet_session", secret)
    assert replay.get("/", follow_redirects=False).status_code == 303
    assert replay.get("/api/v1/nodes").status_code == 401
    assert replay.get("/api/v1/whoami").status_code == 401


@pytest.mark.parametrize("form", [{}, {"csrf": "stale or forged"}])
def test_logout_ends_the_session_on_the_server_without_the_forms_csrf_token(
    client: TestClient, form: dict[str, str]
) -> None:
    _make_user(client)
    browser = _browser(client)
    _login(browser, "alice", PASSWORD)
    secret = browser.cookies["gpufleet_session"]
    assert browser.get("/api/v1/whoami").status_code == 200
    answer = browser.post("/logout", data=form, follow_redirects=False)
    assert (answer.status_code, answer.headers["location"]) == (303, "/login")
    replay = _browser(client)
    replay.cookies.set("gpufleet_session", secret)
    assert replay.get("/api/v1/whoami").status_code == 401
    assert replay.get("/", follow_redirects=False).headers["location"] == "/login"
    logouts = [r for r in client.get("/api/v1/audit").json() if r["action"] == "web_login.logout"]
    assert [r["actor"] for r in logouts] == ["user:alice"]


def test_logout_without_a_session_is_harmless(client: TestClient) -> None:
    answer = _browser(client).post("/logout", follow_redirects=False)
    assert (answer.status_code, answer.headers["location"]) == (303, "/login")


def test_repeated_failures_are_slowed_down_even_with_the_right_password(client: TestClient, clock: FakeClock) -> None:
    _make_user(client)
    browser = _browser(client)
    for _ in range(3):
        assert _login(browser, "alice", "wrong password!")[0] == 401
    status, page = _login(browser, "alice", PASSWORD)  # checked only once the wait is over
    assert status == 429
    assert "too many failed logins" in page
    clock.advance(1.5)
    assert _login(browser, "alice", "wrong password!")[0] == 401  # the fourth failure: now wait 2 s
    clock.advance(1.0)
    assert _login(browser, "alice", PASSWORD)[0] == 429
    clock.advance(1.5)
    assert _login(browser, "alice", PASSWORD)[0] == 303


def test_every_login_attempt_is_audited_with_the_user_tried(client: TestClient) -> None:
    _make_user(client)
    _login(_browser(client), "alice", "wrong password!")
    _login(_browser(client), "alice", PASSWORD)
    rows = [
        (r["actor"], r["target"], r["result"])
        for r in reversed(client.get("/api/v1/audit").json())
        if r["action"] == "web_login.login"
    ]
    assert rows == [("anonymous", "user alice", 401), ("user:alice", "user alice", 303)]


def test_password_login_on_the_api_returns_a_user_token(client: TestClient, clock: FakeClock) -> None:
    _make_user(client)
    anonymous = _browser(client)
    body = {"username": "alice", "password": PASSWORD, "expires_in_s": 3600, "scope": "read"}
    created = anonymous.post("/api/v1/login", json=body)
    assert created.status_code == 201
    token = created.json()["token"]
    assert PASSWORD not in created.text
    who = anonymous.get("/api/v1/nodes", headers={"Authorization": f"Bearer {token}"})
    assert who.status_code == 200
    for _ in range(3):
        assert anonymous.post("/api/v1/login", json={**body, "password": "wrong password!"}).status_code == 401
    throttled = anonymous.post("/api/v1/login", json=body)
    assert throttled.status_code == 429
    assert throttled.headers["retry-after"] == "1"
    clock.advance(1.1)
    assert anonymous.post("/api/v1/login", json=body).status_code == 201
