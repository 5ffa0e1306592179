"""Receiver specs (validation, secrets kept out of reprs and logs, the stored form) and AlertNotice."""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime
from typing import Any

import pytest
from pydantic import ValidationError

from gpufleet.core.errors import InvalidInput
from gpufleet.monitoring.notifiers import (
    AlertNotice,
    EmailReceiver,
    SlackReceiver,
    WebhookReceiver,
    deliver,
    notifier_for,
    parse_receiver,
    redact_url,
    stored_receiver,
)
from tests.monitoring.notify_servers import T0, T1, http_receiver, xid

SLACK_TOKEN = "T0123ABCD/B0456EFGH/tokEn7Secret9"


def secret_specs() -> list[tuple[Any, list[str]]]:
    """Each kind of receiver with secrets in it, and the secrets that must never show."""
    return [
        (
            WebhookReceiver(
                name="hook",
                url="https://user:pw-in-url@events.example/v1/hooks/path-token?key=query-token",
                headers={"Authorization": "Bearer header-token", "X-Api-Key": "api-key-value"},
            ),
            ["pw-in-url", "path-token", "query-token", "header-token", "api-key-value"],
        ),
        (SlackReceiver(name="chat", url=f"https://hooks.slack.com/services/{SLACK_TOKEN}"), [SLACK_TOKEN, "tokEn7"]),
        (
            EmailReceiver(
                name="mail",
                host="smtp.example.org",
                port=587,
                sender="gpufleet@example.org",
                to=["oncall@example.org"],
                starttls=True,
                username="gpufleet",
                password="smtp-password-value",
            ),
            ["smtp-password-value"],
        ),
    ]


@pytest.mark.parametrize(("spec", "secrets"), secret_specs(), ids=["webhook", "slack", "email"])
def test_secrets_never_show_in_repr_str_or_the_shown_json(spec: Any, secrets: list[str]) -> None:
    shown = [repr(spec), str(spec), f"{spec}", spec.model_dump_json(), repr(spec.model_dump(mode="json"))]
    for text in shown:
        for secret in secrets:
            assert secret not in text, f"{secret!r} leaked into {text!r}"
    assert spec.name in repr(spec)  # still a useful repr


def test_urls_show_redacted_but_still_say_where() -> None:
    spec = SlackReceiver(name="chat", url=f"https://hooks.slack.com/services/{SLACK_TOKEN}")
    assert "url=SecretUrl('https://hooks.slack.com/…')" in repr(spec)
    assert '"url":"https://hooks.slack.com/…"' in spec.model_dump_json()
    assert redact_url("https://u:p@host.example:8443/a?b=c") == "https://host.example:8443/…"
    assert redact_url("http://host.example") == "http://host.example/"
    assert redact_url("http://[::1]:9000/x") == "http://[::1]:9000/…"


@pytest.mark.parametrize(("spec", "secrets"), secret_specs(), ids=["webhook", "slack", "email"])
def test_the_stored_form_keeps_the_secrets_and_reads_back_equal(spec: Any, secrets: list[str]) -> None:
    stored = stored_receiver(spec)

    assert all(secret in repr(stored) for secret in secrets)
    assert parse_receiver(stored) == spec


def test_a_failed_delivery_logs_no_secret(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    with http_receiver() as receiver:
        receiver.fail_with(403, body=b"forbidden")
        spec = SlackReceiver(name="chat", url=f"{receiver.url}/services/{SLACK_TOKEN}")
        result = asyncio.run(deliver(notifier_for(spec), [xid()]))

    assert not result.delivered
    assert f"HTTP Request: POST {receiver.url}/… " in caplog.text  # httpx's own line, redacted
    assert "notification to chat failed" in caplog.text
    assert "tokEn7" not in caplog.text
    assert "tokEn7" not in (result.last_error or "")


def test_receivers_are_chosen_by_type() -> None:
    assert isinstance(
        parse_receiver({"type": "slack", "name": "c", "url": "https://chat.example/hooks/x"}), SlackReceiver
    )
    email = parse_receiver(
        {"type": "email", "name": "m", "host": "localhost", "sender": "a@b.c", "to": ["root@localhost"]}
    )
    assert isinstance(email, EmailReceiver)
    assert (email.port, email.starttls, email.timeout_s) == (25, False, 10.0)


@pytest.mark.parametrize(
    ("data", "complaint"),
    [
        ({"type": "pager", "name": "p"}, "type"),
        ({"type": "webhook", "name": "Ops", "url": "https://x.example/"}, "name"),
        ({"type": "webhook", "name": "-ops", "url": "https://x.example/"}, "name"),
        ({"type": "webhook", "name": "o" * 64, "url": "https://x.example/"}, "name"),
        ({"type": "webhook", "name": "ops", "url": "ftp://x.example/"}, "http"),
        ({"type": "webhook", "name": "ops", "url": "https:///nohost"}, "http"),
        ({"type": "webhook", "name": "ops", "url": "https://x.example:99999/"}, "port"),
        ({"type": "webhook", "name": "ops", "url": "https://x.example/a b"}, "whitespace"),
        ({"type": "webhook", "name": "ops", "url": "https://x.example/", "headers": {"X-A": "a\r\nEvil: 1"}}, "CR"),
        ({"type": "webhook", "name": "ops", "url": "https://x.example/", "headers": {"Bad Name": "v"}}, "headers"),
        ({"type": "webhook", "name": "ops", "url": "https://x.example/", "timeout_s": 0}, "timeout_s"),
        ({"type": "webhook", "name": "ops", "url": "https://x.example/", "extra": 1}, "extra"),
        ({"type": "slack", "name": "c", "url": "javascript:alert(1)"}, "http"),
        ({"type": "email", "name": "m", "host": "smtp.example", "sender": "a@b.c", "to": []}, "to"),
        ({"type": "email", "name": "m", "host": "smtp.example", "sender": "a@b.c", "to": ["not-an-address"]}, "to"),
        ({"type": "email", "name": "m", "host": "smtp.example", "sender": "a@b.c", "to": ["x@y.z\nBcc: e@v.il"]}, "to"),
        ({"type": "email", "name": "m", "host": "smtp.example", "sender": "a@b.c\n", "to": ["x@y.z"]}, "sender"),
        ({"type": "email", "name": "m", "host": "smtp.example", "sender": "a@b.c", "to": ["x@y.z", "x@y.z"]}, "twice"),
        ({"type": "email", "name": "m", "host": "smtp example", "sender": "a@b.c", "to": ["x@y.z"]}, "host"),
        ({"type": "email", "name": "m", "host": "h.example", "port": 0, "sender": "a@b.c", "to": ["x@y.z"]}, "port"),
        (
            {"type": "email", "name": "m", "host": "h.example", "sender": "a@b.c", "to": ["x@y.z"], "username": "u"},
            "go together",
        ),
        (
            {
                "type": "email",
                "name": "m",
                "host": "smtp.example",
                "sender": "a@b.c",
                "to": ["x@y.z"],
                "username": "u",
                "password": "p",
            },
            "starttls",
        ),
    ],
)
def test_bad_receivers_are_refused_naming_the_problem(data: dict[str, Any], complaint: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        parse_receiver(data)
    assert complaint in str(refused.value)


def test_a_password_in_clear_is_allowed_to_a_relay_on_loopback() -> None:
    spec = EmailReceiver(name="m", host="127.0.0.1", sender="a@b.c", to=["x@y.z"], username="u", password="p")
    assert not spec.starttls


def test_a_bad_value_is_not_echoed_in_the_error_message() -> None:
    with pytest.raises(InvalidInput) as refused:
        parse_receiver({"type": "slack", "name": "c", "url": "ftp://hooks.example/services/tokEn7Secret"})
    assert "tokEn7Secret" not in str(refused.value)


def test_alertname_and_severity_become_labels() -> None:
    notice = xid()
    assert notice.labels["alertname"] == "GpuXid"
    assert notice.labels["severity"] == "critical"


@pytest.mark.parametrize(
    ("change", "complaint"),
    [
        ({"starts_at": datetime(2026, 3, 1, 12, 0)}, "timezone"),
        ({"status": "resolved"}, "ends_at"),
        ({"status": "resolved", "ends_at": T0.replace(hour=11)}, "before starts_at"),
        ({"labels": {"alertname": "Other"}}, "labels.alertname"),
        ({"labels": {"gpu-index": "3"}}, "label names"),
        ({"severity": "fatal"}, "severity"),
        ({"status": "pending"}, "status"),
    ],
)
def test_inconsistent_notices_are_refused(change: dict[str, Any], complaint: str) -> None:
    fields: dict[str, Any] = {
        "fingerprint": "f",
        "alertname": "GpuXid",
        "status": "firing",
        "severity": "critical",
        "starts_at": T0,
    }
    with pytest.raises(ValidationError, match=complaint):
        AlertNotice(**{**fields, **change})


def test_a_notice_is_frozen() -> None:
    notice = xid(resolved=True)
    assert notice.ends_at == T1
    with pytest.raises(ValidationError):
        notice.status = "firing"  # type: ignore[misc]
