"""The dashboard's administration pages over HTTP: the audit log, the users and the projects."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from gpufleet.api.dashboard.admin import UserRow
from gpufleet.api.templates import TEMPLATES
from gpufleet.auth import audit
from gpufleet.core.clock import FakeClock, to_datetime
from gpufleet.core.db import transaction
from gpufleet.directory.schemas import DirectoryStatus, SourceStatus
from tests.api.dashboard_helpers import PASSWORD, csrf_header, logged_in

# One database: pages over the services that tests/auth runs on both.
pytestmark = pytest.mark.one_database


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    """SQLite only: pages, forms and input parsing are HTTP translation, the same on both databases (the
    domain tests run both)."""
    return f"sqlite:///{tmp_path / 'gpufleet.db'}"


def _rows(page: str, table: str, attribute: str) -> list[str]:
    """The `attribute` of every row of table `table`, in order."""
    body = page.split(f'id="{table}"', 1)[1].split("</table>", 1)[0]
    return [html.unescape(v) for v in re.findall(rf'<tr [^>]*{attribute}="([^"]*)"', body)]


def _row(page: str, attribute: str, value: str) -> str:
    """The HTML of the row whose `attribute` is `value`."""
    found = re.search(rf'<tr [^>]*{attribute}="{re.escape(value)}".*?</tr>', page, re.S)
    assert found is not None, f"no row {attribute}={value}"
    return found.group(0)


def _nav(page: str) -> list[str]:
    found = re.search(r'<nav aria-label="Main">(.*?)</nav>', page, re.S)
    assert found is not None
    return re.findall(r'href="([^"]+)"', found.group(1))


def _audit(client: TestClient, clock: FakeClock, *records: tuple[str, str, int]) -> None:
    """Audit records (actor, action, result), one second apart, as the middleware writes them."""
    ctx = client.app.state.ctx  # type: ignore[attr-defined]
    for actor, action, result in records:
        clock.advance(1)
        with transaction(ctx.sessions) as session:
            audit.record(session, clock, actor=actor, action=action, target="/x", source="10.0.0.9", result=result)


# --- audit log -----------------------------------------------------------------------------------


def test_the_audit_log_lists_changes_newest_first_with_every_column(client: TestClient, clock: FakeClock) -> None:
    browser = logged_in(client, "admin", "root")
    clock.advance(60)
    assert client.post("/api/v1/users", json={"username": "carol"}).status_code == 201
    page = browser.get("/audit")
    assert page.status_code == 200
    actions = _rows(page.text, "audit", "data-audit-action")
    assert actions[:2] == ["users.create_user", "web_login.login"]  # newest first
    row = _row(page.text, "data-audit-action", "users.create_user")
    assert "/api/v1/users" in row  # target
    assert "testclient" in row  # source address
    assert "201 ok" in row
    assert re.search(r"<td>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d</td>", row)
    for column in ("Time (UTC)", "Actor", "Action", "Target", "Source address", "Result"):
        assert f'<th scope="col">{column}</th>' in page.text
    assert 'aria-current="page">Audit log' in page.text


def test_the_audit_log_filters_by_actor_action_result_and_time(client: TestClient, clock: FakeClock) -> None:
    browser = logged_in(client, "admin", "root")
    _audit(
        client,
        clock,
        ("user:alice", "nodes.drain", 200),
        ("user:alice", "nodes.resume", 403),
        ("user:bob", "nodes.drain", 500),
        ("user:bob", "users.delete_user", 204),
    )

    def shown(query: str) -> list[tuple[str, str]]:
        page = browser.get(f"/audit?{query}")
        assert page.status_code == 200, page.text
        return list(
            zip(_rows(page.text, "audit", "data-actor"), _rows(page.text, "audit", "data-audit-action"), strict=True)
        )

    assert shown("actor=user:alice") == [("user:alice", "nodes.resume"), ("user:alice", "nodes.drain")]
    assert shown("action=DRAIN") == [("user:bob", "nodes.drain"), ("user:alice", "nodes.drain")]
    assert shown("action=drain&result=failed") == [("user:bob", "nodes.drain")]
    assert shown("result=refused") == [("user:alice", "nodes.resume")]
    assert shown("result=204") == [("user:bob", "users.delete_user")]
    assert ("user:alice", "nodes.drain") not in shown("result=ok&actor=user:bob")
    # The four records are one second apart, after the login: pick the middle two by time.
    at = [r.at for r in audit.list_records(client.app.state.ctx.sessions(), limit=4)]  # type: ignore[attr-defined]
    middle = f"since={at[2].strftime('%Y-%m-%dT%H:%M:%S')}&until={at[1].strftime('%Y-%m-%dT%H:%M:%S')}"
    assert shown(middle) == [("user:bob", "nodes.drain"), ("user:alice", "nodes.resume")]
    assert shown("actor=user:nobody") == []
    assert "No audit record matches." in browser.get("/audit?actor=user:nobody").text


def test_the_audit_filter_form_keeps_its_values_and_actor_cells_link_to_the_actor(client: TestClient) -> None:
    browser = logged_in(client, "admin", "root")
    page = browser.get("/audit?actor=user:root&action=login&result=ok&since=2020-01-02T03:04:05").text
    assert 'name="actor" value="user:root"' in page
    assert 'name="action" value="login"' in page
    assert "<option selected>ok</option>" in page
    assert 'name="since" value="2020-01-02T03:04:05"' in page
    assert 'href="/audit?actor=user%3Aroot"' in page


def test_the_audit_log_is_paged_a_hundred_at_a_time(client: TestClient, clock: FakeClock) -> None:
    browser = logged_in(client, "admin", "root")
    _audit(client, clock, *((f"user:u{i:03d}", "nodes.drain", 200) for i in range(150)))
    first = browser.get("/audit?action=drain").text
    actors = _rows(first, "audit", "data-actor")
    assert len(actors) == 100
    assert actors[0] == "user:u149"
    assert 'rel="next"' in first
    assert 'rel="prev"' not in first
    older = re.search(r'<a href="(/audit\?[^"]+)"[^>]*rel="next"', first)
    assert older is not None
    second = browser.get(html.unescape(older.group(1))).text
    actors = _rows(second, "audit", "data-actor")
    assert len(actors) == 50
    assert actors[0] == "user:u049"
    assert actors[-1] == "user:u000"
    assert 'rel="prev"' in second
    assert 'rel="next"' not in second
    # Unfiltered, the login's record is on page 2 as well.
    unfiltered = browser.get("/audit?page=2").text
    assert "web_login.login" in unfiltered


def test_the_audit_log_filters_in_the_database_so_old_records_stay_reachable(
    client: TestClient, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    browser = logged_in(client, "admin", "root")
    _audit(client, clock, *((f"user:u{i}", "nodes.drain", 200) for i in range(4)))
    _audit(client, clock, *((f"user:v{i}", "nodes.add", 201) for i in range(5)))
    # The newest 6 records hold one drain; the filter runs before the limit, so all four are found.
    monkeypatch.setattr(audit, "MAX_LISTED", 6)
    page = browser.get("/audit?action=DRAIN").text
    assert _rows(page, "audit", "data-actor") == ["user:u3", "user:u2", "user:u1", "user:u0"]


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("page=0", "page must be a whole number from 1 to 100"),
        ("page=two", "page must be a whole number"),
        ("page=100001", "page must be a whole number"),
        ("result=maybe", "result must be ok, refused, failed or an HTTP status"),
        ("result=99", "result must be"),
        ("since=yesterday", "since must be a time like"),
        ("until=2025-13-01", "until must be a time like"),
        ("since=2025-02-01&until=2025-01-01", "until is before since"),
        ("actor=" + "x" * 161, "actor is at most 160 characters"),
    ],
)
def test_bad_audit_filters_get_a_clear_400_page(client: TestClient, query: str, message: str) -> None:
    browser = logged_in(client, "admin", "root")
    page = browser.get(f"/audit?{query}")
    assert page.status_code == 400
    assert message in html.unescape(page.text)
    assert '<p class="error" role="alert">' in page.text
    assert "Traceback" not in page.text
    assert 'aria-label="Main"' in page.text  # the whole page, with its navigation
    fragment = browser.get(f"/audit?{query}", headers={"HX-Request": "true"})
    assert fragment.status_code == 400
    assert fragment.text.lstrip().startswith('<section id="live"><p class="error"')


def test_the_audit_fragment_is_the_live_part_alone_and_refreshes(client: TestClient) -> None:
    browser = logged_in(client, "admin", "root")
    fragment = browser.get("/audit?action=login", headers={"HX-Request": "true"})
    assert fragment.status_code == 200
    assert fragment.text.lstrip().startswith('<section id="live" hx-get="/audit?action=login"')
    assert 'hx-trigger="every 5s, refresh from:body"' in fragment.text
    assert "<html" not in fragment.text
    assert "web_login.login" in fragment.text


# --- who sees what -------------------------------------------------------------------------------


@pytest.mark.parametrize("role", ["viewer", "member", "operator"])
def test_only_admins_see_the_audit_log_and_the_users(client: TestClient, role: str) -> None:
    browser = logged_in(client, role)
    for path in ("/audit", "/users"):
        page = browser.get(path)
        assert page.status_code == 403, path
        assert f"a {role} may not see this page" in page.text
        assert "data-audit-action" not in page.text
        assert "data-method" not in page.text
    nav = _nav(browser.get("/projects").text)
    assert "/audit" not in nav
    assert "/users" not in nav
    assert "/projects" in nav
    assert browser.get("/projects").status_code == 200


def test_admins_see_every_admin_page_in_the_navigation(client: TestClient) -> None:
    nav = _nav(logged_in(client, "admin", "root").get("/").text)
    assert {"/audit", "/users", "/projects"} <= set(nav)


def test_without_a_session_the_admin_pages_redirect_to_the_login(client: TestClient) -> None:
    anonymous = TestClient(client.app)
    for path in ("/audit", "/users", "/projects"):
        assert anonymous.get(path, follow_redirects=False).headers["location"] == "/login"
        assert anonymous.get(path, headers={"HX-Request": "true"}).headers["hx-redirect"] == "/login"


# --- users ---------------------------------------------------------------------------------------


def test_the_users_page_lists_users_with_role_status_and_sessions(client: TestClient, clock: FakeClock) -> None:
    browser = logged_in(client, "admin", "root")
    for name, role in (("alice", "operator"), ("dave", "viewer")):
        made = client.post("/api/v1/users", json={"username": name, "role": role, "full_name": name.title()})
        assert made.status_code == 201
    assert client.patch("/api/v1/users/dave", json={"enabled": False}).status_code == 200
    assert client.post("/api/v1/tokens/user", json={"user": "alice"}).status_code == 201
    page = browser.get("/users")
    assert page.status_code == 200
    assert _rows(page.text, "users", "data-user") == ["alice", "dave", "root"]
    alice, dave, root = (_row(page.text, "data-user", n) for n in ("alice", "dave", "root"))
    assert "<td>Alice</td><td>operator</td>" in alice
    assert '<span class="pill up">enabled</span>' in alice
    assert '<span class="pill down">disabled</span>' in dave
    assert ">never<" in alice  # no dashboard login yet
    assert re.search(r"<td>1</td><td>0</td>", alice)  # one API token, no session
    assert "(you)" in root
    assert re.search(r"<td>0</td><td>1</td>", root)  # this browser's session
    assert ">never<" not in root
    for column in ("User", "Role", "Status", "Created (UTC)", "Last web login (UTC)", "API tokens", "Sessions"):
        assert f'<th scope="col">{column}</th>' in page.text


def test_admins_get_disable_enable_and_delete_buttons_that_call_the_api(client: TestClient) -> None:
    browser = logged_in(client, "admin", "root")
    for name in ("alice", "dave"):
        assert client.post("/api/v1/users", json={"username": name, "password": PASSWORD}).status_code == 201
    assert client.patch("/api/v1/users/dave", json={"enabled": False}).status_code == 200
    page = browser.get("/users").text
    assert '<th scope="col">Actions</th>' in page
    alice, dave, root = (_row(page, "data-user", n) for n in ("alice", "dave", "root"))
    assert ">Disable</button>" in alice
    assert ">Enable</button>" not in alice
    assert ">Enable</button>" in dave
    assert ">Delete</button>" in alice
    assert "<button" not in root  # no locking oneself out from here

    def act(row: str, label: str) -> int:
        button = re.search(rf"<button [^>]*>{label}</button>", row, re.S)
        assert button is not None
        attributes = dict(re.findall(r'data-([a-z-]+)="([^"]*)"', button.group(0)))
        attributes |= {k: html.unescape(v) for k, v in re.findall(r"data-([a-z-]+)='([^']*)'", button.group(0))}
        answer = browser.request(
            attributes.get("method", "POST"),
            attributes["action"],
            content=attributes.get("body", "{}"),
            headers=csrf_header(browser) | {"Content-Type": "application/json"},
        )
        return answer.status_code

    assert act(alice, "Disable") == 200
    assert '<span class="pill down">disabled</span>' in _row(browser.get("/users").text, "data-user", "alice")
    assert client.get("/api/v1/users/alice").json()["enabled"] is False
    assert act(dave, "Enable") == 200
    assert client.get("/api/v1/users/dave").json()["enabled"] is True
    assert act(alice, "Delete") == 204
    assert _rows(browser.get("/users").text, "users", "data-user") == ["dave", "root"]
    actions = _rows(browser.get("/audit?actor=user:root").text, "audit", "data-audit-action")
    assert actions[:3] == ["users.delete_user", "users.update_user", "users.update_user"]


def test_without_users_write_the_users_table_has_no_buttons(clock: FakeClock) -> None:
    """Only a read-scoped admin has users:read without users:write; the table must then be read-only."""
    at = to_datetime(clock.now())
    alice = UserRow("alice", "", "member", True, at, None, 0, 0, "local", None)
    directory = DirectoryStatus(identity_provider="local", sso=False, users={"local": 1}, sources=[], problems=[])
    context = {"self_url": "/users", "refresh_s": 5, "me": "root", "users": [alice], "directory": directory}
    template = TEMPLATES.get_template("fragments/users.html")
    read_only = template.render(context | {"may": {"users:read"}})
    writable = template.render(context | {"may": {"users:read", "users:write"}})
    assert 'data-user="alice"' in read_only
    assert "<button" not in read_only
    assert '<th scope="col">Actions</th>' not in read_only
    assert ">Disable</button>" in writable
    assert 'data-method="DELETE"' in writable


def test_a_directory_users_row_says_where_they_come_from_and_offers_no_local_change(clock: FakeClock) -> None:
    """A user from LDAP is changed in the directory: no Disable/Enable here, but they can be deleted; the
    directory's last sync and what its group mappings cannot apply are shown above the table."""
    at = to_datetime(clock.now())
    alice = UserRow("alice", "", "admin", True, at, None, 0, 0, "ldap", at)
    synced = SourceStatus(
        source="ldap", attempted_at=at, succeeded_at=at, error="", users=4, changed=1,
        problems=["ldap user bob: a local user has that name"],
    )  # fmt: skip
    directory = DirectoryStatus(
        identity_provider="ldap", sso=False, users={"local": 1, "ldap": 1, "oidc": 0}, sources=[synced],
        problems=["ldap: group ml-gone maps to project gone, which does not exist"],
    )  # fmt: skip
    page = TEMPLATES.get_template("fragments/users.html").render(
        {"self_url": "/users", "refresh_s": 5, "me": "root", "users": [alice], "directory": directory}
        | {"may": {"users:read", "users:write"}}
    )
    row = _row(page, "data-user", "alice")
    assert "<td>ldap</td>" in row.replace(' title="last read ' + at.strftime("%Y-%m-%d %H:%M:%S") + '"', "")
    assert ">Disable</button>" not in row
    assert 'data-method="DELETE"' in row
    assert "1 local, 1 ldap" in page
    assert "ldap user bob: a local user has that name" in page
    assert "group ml-gone maps to project gone, which does not exist" in page
    assert "break-glass" in page


def test_a_viewers_api_call_from_a_button_would_be_refused(client: TestClient) -> None:
    """The buttons are only a convenience: the API refuses the change to anyone but an admin."""
    assert client.post("/api/v1/users", json={"username": "alice"}).status_code == 201
    browser = logged_in(client, "operator")
    answer = browser.request("DELETE", "/api/v1/users/alice", headers=csrf_header(browser))
    assert answer.status_code == 403


# --- projects ------------------------------------------------------------------------------------


def test_the_projects_page_lists_members_and_quotas(client: TestClient) -> None:
    for name, role in (("alice", "member"), ("dave", "operator")):
        assert client.post("/api/v1/users", json={"username": name, "role": role}).status_code == 201
    for name in ("vision", "nlp"):
        assert client.post("/api/v1/projects", json={"name": name, "description": f"{name} team"}).status_code == 201
    for user in ("dave", "alice"):
        assert client.post("/api/v1/projects/vision/members", json={"user": user}).status_code == 200
    quota = {"max_gpus": 16, "gpu_hours_budget": 1200, "budget_period": "week"}
    assert client.put("/api/v1/projects/vision/quota", json=quota).status_code == 200
    page = logged_in(client, "viewer").get("/projects")
    assert page.status_code == 200
    assert _rows(page.text, "projects", "data-project") == ["nlp", "vision"]
    vision, nlp = (_row(page.text, "data-project", n) for n in ("vision", "nlp"))
    assert re.findall(r'data-member="([^"]+)"', vision) == ["alice", "dave"]
    assert "(member)" in vision
    assert "(operator)" in vision
    assert "<td>16</td>" in vision
    assert "1,200 GPU-h per week" in vision
    assert "vision team" in vision
    assert ">none<" in nlp
    assert nlp.count(">unlimited<") == 2
    for column in ("Project", "Members (role)", "Max GPUs", "GPU-hour budget"):
        assert f'<th scope="col">{column}</th>' in page.text
    fragment = logged_in(client, "viewer", "eve").get("/projects", headers={"HX-Request": "true"})
    assert fragment.text.lstrip().startswith('<section id="live"')
    assert "1,200 GPU-h per week" in fragment.text
