"""The email notifier against a real SMTP server (aiosmtpd on loopback), plain and with STARTTLS + login."""

from __future__ import annotations

import asyncio
import ssl
from email import message_from_bytes
from email.message import EmailMessage
from email.policy import default as default_policy
from pathlib import Path
from typing import Any

import pytest

from gpufleet.api.pki import init_pki
from gpufleet.core.clock import FakeClock
from gpufleet.monitoring.notifiers import (
    EmailNotifier,
    EmailReceiver,
    NotificationFailed,
    deliver,
    notifier_for,
)
from tests.monitoring.notify_servers import Mailbox, node_down, password_check, smtp_server, unused_port, xid


async def no_wait(seconds: float) -> None:
    pass


def mailer(box: Mailbox, **fields: Any) -> EmailNotifier:
    spec = EmailReceiver(
        name="oncall-mail",
        host=box.host,
        port=box.port,
        sender="gpufleet@head.example",
        to=["oncall@example.org", "hpc-admins@example.org"],
        **fields,
    )
    notifier = notifier_for(spec, external_url="https://head.example", clock=FakeClock(1_772_366_400.0))
    assert isinstance(notifier, EmailNotifier)
    return notifier


def parsed(box: Mailbox, index: int = 0) -> EmailMessage:
    content = box.recorder.messages[index].content
    assert isinstance(content, bytes)
    msg = message_from_bytes(content, policy=default_policy)
    assert isinstance(msg, EmailMessage)  # what the default policy builds
    return msg


def text_of(msg: EmailMessage) -> str:
    """The body with SMTP's CRLF line ends turned back into newlines."""
    body = msg.get_content()
    assert isinstance(body, str)
    return body.replace("\r\n", "\n")


def test_an_email_lists_the_alerts_under_an_alertmanager_style_subject() -> None:
    with smtp_server() as box:
        result = asyncio.run(deliver(mailer(box), [xid("gpu001", 3), node_down("gpu001")], sleep=no_wait))

        assert result.delivered
        [envelope] = box.recorder.messages
        assert envelope.mail_from == "gpufleet@head.example"
        assert envelope.rcpt_tos == ["oncall@example.org", "hpc-admins@example.org"]
        msg = parsed(box)
    assert msg["Subject"] == "[FIRING:2] gpufleet: GpuXid, NodeDown on gpu001"
    assert msg["From"] == "gpufleet <gpufleet@head.example>"
    assert msg["To"] == "oncall@example.org, hpc-admins@example.org"
    assert msg["Date"] == "Sun, 01 Mar 2026 12:00:00 +0000"  # from the injected clock
    assert msg["Message-ID"].endswith("@head.example>")
    assert msg["Auto-Submitted"] == "auto-generated"
    assert msg.get_content_type() == "text/plain"
    body = text_of(msg)
    assert body.startswith("2 firing, 0 resolved.\n")
    assert "FIRING [critical] GpuXid on gpu001 GPU 3: Xid 79: GPU has fallen off the bus\n" in body
    assert "  description: gpu001 GPU 3 reported Xid 79\n" in body
    assert "  summary:" not in body  # the summary is in the headline already
    assert "  started: 2026-03-01T12:00:00Z\n" in body
    assert "  labels: alertname=GpuXid, gpu=3, node=gpu001, severity=critical\n" in body
    assert "  source: https://head.example/alerts?node=gpu001\n" in body
    assert "FIRING [warning] NodeDown on gpu001: no heartbeat for 2m\n" in body
    assert body.rstrip().endswith("gpufleet: https://head.example")


def test_a_resolved_email_says_so_and_when_it_ended() -> None:
    with smtp_server() as box:
        asyncio.run(mailer(box).send([xid("gpu001", 3, resolved=True), xid("gpu002", 1, resolved=True)]))
        msg = parsed(box)

    assert msg["Subject"] == "[RESOLVED] gpufleet: GpuXid on 2 nodes"
    assert "  ended: 2026-03-01T12:07:30.250000Z\n" in text_of(msg)


def test_a_temporary_smtp_refusal_is_retried() -> None:
    with smtp_server() as box:
        box.recorder.data_replies.append("451 4.3.0 try again later")

        result = asyncio.run(deliver(mailer(box), [xid()], sleep=no_wait))

        assert (result.delivered, result.attempts) == (True, 2)
        assert len(box.recorder.messages) == 1


def test_a_permanent_smtp_refusal_is_not_retried() -> None:
    with smtp_server() as box:
        box.recorder.data_replies.append("554 5.7.1 message rejected")

        result = asyncio.run(deliver(mailer(box), [xid()], sleep=no_wait))

    assert (result.delivered, result.attempts) == (False, 1)
    assert result.last_error == "oncall-mail: the SMTP server answered 554 5.7.1 message rejected"


def test_a_partly_refused_recipient_list_is_reported_and_not_resent() -> None:
    with smtp_server() as box:
        box.recorder.refuse["hpc-admins@example.org"] = "550 5.1.1 no such mailbox"

        result = asyncio.run(deliver(mailer(box), [xid()], sleep=no_wait))

        assert (result.delivered, result.attempts) == (False, 1)
        assert result.last_error == "oncall-mail: refused for hpc-admins@example.org, sent to the others"
        assert box.recorder.messages[0].rcpt_tos == ["oncall@example.org"]


def test_an_smtp_server_that_is_not_there_is_retried_then_reported() -> None:
    spec = EmailReceiver(name="m", host="127.0.0.1", port=unused_port(), sender="a@b.example", to=["c@d.example"])

    result = asyncio.run(deliver(notifier_for(spec), [xid()], attempts=3, sleep=no_wait))

    assert (result.delivered, result.attempts) == (False, 3)
    assert result.last_error is not None
    assert "Connection refused" in result.last_error


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, ssl.SSLContext]:
    """A CA and a certificate for 127.0.0.1 (made by `gpufleet server init`'s code) and a server context."""
    files = init_pki(tmp_path_factory.mktemp("smtp-pki"), ["127.0.0.1", "localhost"]).files
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(files.cert, files.key)
    return files.ca_cert, context


def secure_server(context: ssl.SSLContext) -> Any:
    return smtp_server(
        tls_context=context,
        require_starttls=True,
        auth_required=True,
        auth_require_tls=True,
        authenticator=password_check(b"gpufleet", b"correct horse"),
    )


def test_starttls_and_login(pki: tuple[Path, ssl.SSLContext]) -> None:
    ca_file, context = pki
    with secure_server(context) as box:
        notifier = mailer(box, starttls=True, username="gpufleet", password="correct horse", ca_file=ca_file)

        asyncio.run(notifier.send([xid()]))

        [session] = box.recorder.sessions
        assert session.authenticated
        assert session.ssl is not None  # the message went over the TLS session
        assert parsed(box)["Subject"] == "[FIRING:1] gpufleet: GpuXid on gpu001"


def test_a_wrong_password_is_a_permanent_failure(pki: tuple[Path, ssl.SSLContext]) -> None:
    ca_file, context = pki
    with secure_server(context) as box:
        notifier = mailer(box, starttls=True, username="gpufleet", password="wrong", ca_file=ca_file)

        with pytest.raises(NotificationFailed) as failed:
            asyncio.run(notifier.send([xid()]))

        assert not failed.value.retryable
        assert "535" in str(failed.value)
        assert box.recorder.messages == []


def test_an_untrusted_certificate_is_a_permanent_failure(pki: tuple[Path, ssl.SSLContext]) -> None:
    _, context = pki
    with secure_server(context) as box:
        # No ca_file: the system's CAs do not know our private CA.
        notifier = mailer(box, starttls=True, username="gpufleet", password="correct horse")

        with pytest.raises(NotificationFailed) as failed:
            asyncio.run(notifier.send([xid()]))

    assert not failed.value.retryable
    assert "certificate" in str(failed.value)


def test_a_server_without_starttls_is_refused_rather_than_sent_in_clear() -> None:
    with smtp_server() as box:
        notifier = mailer(box, starttls=True)

        with pytest.raises(NotificationFailed) as failed:
            asyncio.run(notifier.send([xid()]))

        assert not failed.value.retryable
        assert "STARTTLS" in str(failed.value)
        assert box.recorder.messages == []


def test_an_unreadable_ca_file_is_a_permanent_failure(tmp_path: Path) -> None:
    spec = EmailReceiver(
        name="m",
        host="127.0.0.1",
        sender="a@b.example",
        to=["c@d.example"],
        starttls=True,
        ca_file=tmp_path / "none.pem",
    )

    result = asyncio.run(deliver(notifier_for(spec), [xid()], sleep=no_wait))

    assert (result.delivered, result.attempts) == (False, 1)
    assert result.last_error is not None
    assert "cannot load the CA certificate" in result.last_error
