"""Webhook and Slack notifiers against a real HTTP server on loopback, and `deliver`'s retry policy."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpufleet.api.pki import init_pki
from gpufleet.monitoring.notifiers import (
    MAX_LISTED,
    AlertNotice,
    DeliveryResult,
    NotificationFailed,
    Notifier,
    SlackNotifier,
    SlackReceiver,
    WebhookNotifier,
    WebhookReceiver,
    deliver,
    notifier_for,
    webhook_payload,
)
from tests.monitoring.notify_servers import HttpReceiver, http_receiver, node_down, unused_port, xid


@pytest.fixture
def receiver() -> Iterator[HttpReceiver]:
    with http_receiver() as running:
        yield running


class Sleeps:
    """Stands in for asyncio.sleep: records the waits instead of waiting."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


def run_deliver(notifier: Notifier, notices: list[AlertNotice], **kwargs: Any) -> tuple[DeliveryResult, list[float]]:
    sleeps = Sleeps()
    result = asyncio.run(deliver(notifier, notices, sleep=sleeps, **kwargs))
    return result, sleeps.waits


def webhook(url: str, **fields: Any) -> WebhookNotifier:
    notifier = notifier_for(WebhookReceiver(name="ops-hook", url=url, **fields), external_url="https://head.example")
    assert isinstance(notifier, WebhookNotifier)
    return notifier


def test_a_firing_group_is_alertmanagers_webhook_json(receiver: HttpReceiver) -> None:
    result, _ = run_deliver(webhook(receiver.url + "/hook"), [xid("gpu001", 3), xid("gpu001", 5)])

    assert result == DeliveryResult("ops-hook", delivered=True, attempts=1)
    [request] = receiver.received
    assert request.path == "/hook"
    assert request.headers["content-type"] == "application/json"
    body = request.json()
    assert body["version"] == "4"
    assert body["groupKey"] == '{}:{alertname="GpuXid"}'
    assert body["truncatedAlerts"] == 0
    assert body["status"] == "firing"
    assert body["receiver"] == "ops-hook"
    assert body["groupLabels"] == {"alertname": "GpuXid"}
    # gpu differs between the two alerts, so it is not common; node is.
    assert body["commonLabels"] == {"alertname": "GpuXid", "node": "gpu001", "severity": "critical"}
    assert body["commonAnnotations"] == {"summary": "Xid 79: GPU has fallen off the bus"}
    assert body["externalURL"] == "https://head.example"
    assert len(body["alerts"]) == 2
    first = body["alerts"][0]
    assert set(first) == {"status", "labels", "annotations", "startsAt", "endsAt", "generatorURL", "fingerprint"}
    assert first["status"] == "firing"
    assert first["labels"] == {"alertname": "GpuXid", "severity": "critical", "node": "gpu001", "gpu": "3"}
    assert first["annotations"] == {
        "summary": "Xid 79: GPU has fallen off the bus",
        "description": "gpu001 GPU 3 reported Xid 79",
    }
    assert first["startsAt"] == "2026-03-01T12:00:00Z"
    assert first["endsAt"] == "0001-01-01T00:00:00Z"  # Alertmanager's zero time: still firing
    assert first["generatorURL"] == "https://head.example/alerts?node=gpu001"
    assert first["fingerprint"] == "xid-gpu001-3"
    assert body["alerts"][1]["labels"]["gpu"] == "5"


def test_a_resolved_group_says_resolved_and_when_it_ended(receiver: HttpReceiver) -> None:
    run_deliver(webhook(receiver.url), [xid(resolved=True)])

    body = receiver.received[0].json()
    assert body["status"] == "resolved"
    assert body["alerts"][0]["status"] == "resolved"
    assert body["alerts"][0]["endsAt"] == "2026-03-01T12:07:30.250000Z"


def test_a_group_is_firing_while_any_alert_fires_and_shares_only_common_labels(receiver: HttpReceiver) -> None:
    run_deliver(webhook(receiver.url), [xid(resolved=True), node_down()])

    body = receiver.received[0].json()
    assert body["status"] == "firing"
    assert body["groupLabels"] == {}
    assert body["groupKey"] == "{}:{}"
    assert body["commonLabels"] == {}
    assert [a["status"] for a in body["alerts"]] == ["resolved", "firing"]


def test_configured_headers_are_sent(receiver: HttpReceiver) -> None:
    run_deliver(webhook(receiver.url, headers={"Authorization": "Bearer s3cret-token", "X-Team": "hpc"}), [xid()])

    headers = receiver.received[0].headers
    assert headers["authorization"] == "Bearer s3cret-token"
    assert headers["x-team"] == "hpc"
    assert headers["user-agent"].startswith("gpufleet/")


def test_a_receiver_failing_twice_with_503_gets_the_notice_on_the_third_attempt(receiver: HttpReceiver) -> None:
    receiver.fail_with(503, times=2)

    result, waits = run_deliver(webhook(receiver.url), [xid()])

    assert result == DeliveryResult("ops-hook", delivered=True, attempts=3)
    assert waits == [1.0, 2.0]  # exponential backoff
    assert len(receiver.received) == 3
    assert receiver.received[0].body == receiver.received[2].body  # the same notice each time


def test_a_400_is_not_retried_and_its_reason_is_reported(receiver: HttpReceiver) -> None:
    receiver.fail_with(400, body=b"invalid payload\n")

    result, waits = run_deliver(webhook(receiver.url), [xid()])

    assert not result.delivered
    assert result.attempts == 1
    assert waits == []
    assert len(receiver.received) == 1
    assert result.last_error is not None
    assert "answered 400: invalid payload" in result.last_error


def test_a_redirect_is_not_followed_so_headers_stay_with_the_configured_host(receiver: HttpReceiver) -> None:
    receiver.fail_with(307, headers={"Location": "http://elsewhere.example/collect"})

    result, _ = run_deliver(webhook(receiver.url, headers={"Authorization": "Bearer t"}), [xid()])

    assert (result.delivered, result.attempts) == (False, 1)
    assert len(receiver.received) == 1
    assert "answered 307" in (result.last_error or "")


@pytest.mark.parametrize("status", [408, 429, 500, 502])
def test_timeouts_throttling_and_server_errors_are_retried(receiver: HttpReceiver, status: int) -> None:
    receiver.fail_with(status)

    result, waits = run_deliver(webhook(receiver.url), [xid()])

    assert (result.delivered, result.attempts, waits) == (True, 2, [1.0])


def test_retry_after_stretches_the_wait_up_to_the_cap(receiver: HttpReceiver) -> None:
    receiver.fail_with(429, headers={"Retry-After": "7"})
    receiver.fail_with(503, headers={"Retry-After": "3600"})

    result, waits = run_deliver(webhook(receiver.url), [xid()], max_delay_s=30.0)

    assert result.delivered
    assert waits == [7.0, 30.0]


def test_a_refused_connection_is_retried_then_reported(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="gpufleet.monitoring.notifiers")
    url = f"http://127.0.0.1:{unused_port()}/hook"

    result, waits = run_deliver(webhook(url), [xid()], attempts=4, first_delay_s=0.5, max_delay_s=1.5)

    assert not result.delivered
    assert result.attempts == 4
    assert waits == [0.5, 1.0, 1.5]
    assert result.last_error is not None
    assert "cannot reach http://127.0.0.1:" in result.last_error
    assert "/hook" not in result.last_error  # paths are redacted: they often hold tokens
    assert "giving up" in caplog.records[-1].getMessage()


def test_a_receiver_too_slow_to_answer_times_out_and_is_retryable() -> None:
    # A listening socket that never answers: the TCP handshake completes, the HTTP reply never comes.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        notifier = webhook(f"http://127.0.0.1:{silent.getsockname()[1]}", timeout_s=0.2)
        with pytest.raises(NotificationFailed) as failed:
            asyncio.run(notifier.send([xid()]))

    assert failed.value.retryable
    assert "timed out after 0.2s" in str(failed.value)


def test_nothing_to_send_sends_nothing(receiver: HttpReceiver) -> None:
    result, _ = run_deliver(webhook(receiver.url), [])

    assert result == DeliveryResult("ops-hook", delivered=True, attempts=0)
    assert receiver.received == []


def test_attempts_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        run_deliver(webhook("http://127.0.0.1:9/"), [xid()], attempts=0)


def test_slack_gets_one_readable_line_per_alert(receiver: HttpReceiver) -> None:
    notifier = notifier_for(SlackReceiver(name="chat", url=receiver.url + "/services/T0/B0/xyz"))
    assert isinstance(notifier, SlackNotifier)

    result, _ = run_deliver(notifier, [xid("gpu001", 3), node_down("gpu002"), xid("gpu003", 0, resolved=True)])

    assert result.delivered
    [request] = receiver.received
    assert request.path == "/services/T0/B0/xyz"
    assert request.json() == {
        "text": "\n".join(
            [
                ":red_circle: FIRING [critical] GpuXid on gpu001 GPU 3: Xid 79: GPU has fallen off the bus",
                ":large_orange_circle: FIRING [warning] NodeDown on gpu002: no heartbeat for 2m",
                ":large_green_circle: RESOLVED [critical] GpuXid on gpu003 GPU 0: Xid 79: GPU has fallen off the bus",
            ]
        )
    }


def test_slack_text_cannot_become_a_link_or_mention_and_long_groups_are_cut(receiver: HttpReceiver) -> None:
    sneaky = AlertNotice(
        fingerprint="f",
        alertname="LogMatch",
        status="firing",
        severity="info",
        labels={"node": "gpu001"},
        annotations={"summary": "see <!channel> & <https://evil.example|here>\nsecond line"},
        starts_at=xid().starts_at,
    )
    notices = [sneaky] + [node_down(f"gpu{i:03d}") for i in range(MAX_LISTED + 4)]

    run_deliver(notifier_for(SlackReceiver(name="chat", url=receiver.url)), notices)

    lines = receiver.received[0].json()["text"].split("\n")
    assert lines[0] == (
        ":large_blue_circle: FIRING [info] LogMatch on gpu001: "
        "see &lt;!channel&gt; &amp; &lt;https://evil.example|here&gt; second line"
    )
    assert len(lines) == MAX_LISTED + 1
    assert lines[-1] == "… and 5 more"


def test_slack_errors_are_classified_like_webhook_errors(receiver: HttpReceiver) -> None:
    receiver.fail_with(404, body=b"no_service")

    result, _ = run_deliver(notifier_for(SlackReceiver(name="chat", url=receiver.url + "/services/T/B/tok")), [xid()])

    assert (result.delivered, result.attempts) == (False, 1)
    assert result.last_error == f"chat: {receiver.url}/… answered 404: no_service"


def test_an_untrusted_https_certificate_is_not_retried(tmp_path: Path) -> None:
    files = init_pki(tmp_path, ["127.0.0.1"]).files  # a private CA the system does not trust
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(files.cert, files.key)
    with http_receiver(tls=context) as receiver:
        result, waits = run_deliver(webhook(receiver.url + "/hook"), [xid()])

    assert (result.delivered, result.attempts, waits) == (False, 1, [])
    assert result.last_error is not None
    assert "CERTIFICATE_VERIFY_FAILED" in result.last_error


def test_the_documented_webhook_example_is_what_the_code_sends() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "notifications.md").read_text()
    start = doc.index("<!-- webhook-example:start -->")
    example = doc[start : doc.index("<!-- webhook-example:end -->")].split("```json\n", 1)[1].split("```", 1)[0]

    sent = webhook_payload(
        [xid("gpu001", 3), xid("gpu001", 5, resolved=True)], receiver="ops-hook", external_url="https://head.example"
    )

    assert json.loads(example) == sent
