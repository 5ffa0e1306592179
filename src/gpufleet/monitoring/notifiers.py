"""Alert notifications: where they go (receivers), what is sent (payloads), and delivery with retries.

Three kinds of receiver, chosen by `type`:

- `webhook`: Alertmanager's webhook JSON (version "4"), so tools written for Alertmanager read it as is;
- `slack`: a Slack incoming-webhook body (`{"text": ...}`), which Mattermost and Rocket.Chat accept too;
- `email`: a plain-text message over SMTP (smtplib in a worker thread), with STARTTLS and login.

A notifier turns a failure into `NotificationFailed`, saying whether trying again can help; `deliver`
retries those with exponential backoff. Secrets (SMTP password, Slack URL, webhook header values) are
`SecretStr` and URLs are shown redacted, so neither a repr, a log line nor an error message carries them.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import re
import smtplib
import ssl
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from email.message import EmailMessage
from email.utils import format_datetime, formataddr, make_msgid
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol, Self
from urllib.parse import urlsplit

import httpx
from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    SecretStr,
    StringConstraints,
    TypeAdapter,
    ValidationError,
    model_validator,
)

from gpufleet import __version__
from gpufleet.core import tls
from gpufleet.core.clock import Clock, SystemClock, to_datetime
from gpufleet.core.errors import ConfigError, GpufleetError, InvalidInput, describe

log = logging.getLogger(__name__)

# Alertmanager writes Go's zero time as the end of an alert that is still firing; consumers test for it.
ZERO_TIME = "0001-01-01T00:00:00Z"
MAX_LISTED = 50  # alerts spelled out in one Slack message or email; the rest are counted
_USER_AGENT = f"gpufleet/{__version__}"

Severity = Literal["critical", "warning", "info"]
Status = Literal["firing", "resolved"]


class NotificationFailed(GpufleetError):
    """A receiver did not take a notification. `retryable` says whether the same send may succeed later
    (timeouts, connection errors, 5xx, 408, 429, SMTP 4xx); `retry_after_s` is the receiver's own hint."""

    http_status = 502  # when an API call sends a test notification, the receiver is the bad gateway

    def __init__(self, message: str, *, retryable: bool, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.retry_after_s = retry_after_s


# --- what is sent ---------------------------------------------------------------------------------

_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")  # Prometheus' label names, so consumers can index them


def _utc(value: datetime) -> str:
    """RFC 3339 in UTC with a `Z`, as Go's encoder writes a UTC time."""
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


class AlertNotice(BaseModel):
    """One alert as the notifiers see it: Alertmanager's alert model, filled from gpufleet's alert rows.

    `alertname` and `severity` are also labels (they are filled in when missing); a conflicting label is
    a ValidationError, as are naive datetimes and a resolved alert without `ends_at`.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    fingerprint: str = Field(min_length=1, max_length=64)
    alertname: str = Field(min_length=1, max_length=128)
    status: Status
    severity: Severity
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    starts_at: AwareDatetime
    ends_at: AwareDatetime | None = None
    generator_url: str = ""

    @model_validator(mode="before")
    @classmethod
    def _name_and_severity_are_labels(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        labels = dict(data.get("labels") or {})
        for key in ("alertname", "severity"):
            if key in data and labels.setdefault(key, data[key]) != data[key]:
                raise ValueError(f"labels.{key} differs from {key}")
        return {**data, "labels": labels}

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        bad = [name for name in self.labels if not _LABEL_NAME.fullmatch(name)]
        if bad:
            raise ValueError(f"label names must match [a-zA-Z_][a-zA-Z0-9_]*: {', '.join(sorted(bad))}")
        if self.status == "resolved" and self.ends_at is None:
            raise ValueError("a resolved alert needs ends_at")
        if self.ends_at is not None and self.ends_at < self.starts_at:
            raise ValueError("ends_at is before starts_at")
        return self

    def headline(self) -> str:
        """`FIRING [critical] GpuXid on gpu001 GPU 3: summary`, the one line Slack and email show."""
        where = ""
        if node := self.labels.get("node"):
            where = f" on {node}" + (f" GPU {self.labels['gpu']}" if "gpu" in self.labels else "")
        text = self.annotations.get("summary") or self.annotations.get("description") or ""
        line = f"{self.status.upper()} [{self.severity}] {self.alertname}{where}" + (f": {text}" if text else "")
        return _one_line(line)


def _one_line(text: str) -> str:
    # Label values and log-derived summaries may hold newlines; a header or a chat line must not.
    return " ".join(text.split())


def _common(maps: Iterable[dict[str, str]]) -> dict[str, str]:
    """The pairs every map has with the same value (Alertmanager's commonLabels/commonAnnotations)."""
    items: set[tuple[str, str]] | None = None
    for one in maps:
        items = set(one.items()) if items is None else items & set(one.items())
    return dict(sorted(items or ()))


def _group_status(notices: Sequence[AlertNotice]) -> Status:
    return "firing" if any(n.status == "firing" for n in notices) else "resolved"


def webhook_payload(
    notices: Sequence[AlertNotice], *, receiver: str, external_url: str = "", group_by: Sequence[str] = ("alertname",)
) -> dict[str, Any]:
    """Alertmanager's webhook message (version 4) for one group of alerts.

    `groupLabels` are the `group_by` labels all alerts share; `groupKey` is built from them the way
    Alertmanager builds it for its root route.
    """
    common_labels = _common(n.labels for n in notices)
    group_labels = {k: v for k, v in common_labels.items() if k in group_by}
    group_key = "{}:{" + ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in group_labels.items()) + "}"
    return {
        "version": "4",
        "groupKey": group_key,
        "truncatedAlerts": 0,
        "status": _group_status(notices),
        "receiver": receiver,
        "groupLabels": group_labels,
        "commonLabels": common_labels,
        "commonAnnotations": _common(n.annotations for n in notices),
        "externalURL": external_url,
        "alerts": [
            {
                "status": n.status,
                "labels": dict(sorted(n.labels.items())),
                "annotations": dict(sorted(n.annotations.items())),
                "startsAt": _utc(n.starts_at),
                # Alertmanager zeroes the end of a firing alert, whatever its predicted end.
                "endsAt": _utc(n.ends_at) if n.status == "resolved" and n.ends_at else ZERO_TIME,
                "generatorURL": n.generator_url,
                "fingerprint": n.fingerprint,
            }
            for n in notices
        ],
    }


_RESOLVED_ICON = ":large_green_circle:"
_SLACK_ICONS = {"critical": ":red_circle:", "warning": ":large_orange_circle:", "info": ":large_blue_circle:"}


def _slack_escape(text: str) -> str:
    # Slack reads <...> as links and mentions; alert text must not become one. Only these three are escaped.
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_text(notices: Sequence[AlertNotice]) -> str:
    """One line per alert (at most MAX_LISTED, then a count), with an icon for severity or resolution."""
    lines = [
        f"{_RESOLVED_ICON if n.status == 'resolved' else _SLACK_ICONS[n.severity]} {_slack_escape(n.headline())}"
        for n in notices[:MAX_LISTED]
    ]
    if len(notices) > MAX_LISTED:
        lines.append(f"… and {len(notices) - MAX_LISTED} more")
    return "\n".join(lines)


def email_subject(notices: Sequence[AlertNotice]) -> str:
    """`[FIRING:2] gpufleet: GpuXid on gpu001`, in the shape of Alertmanager's default subject."""
    firing = sum(n.status == "firing" for n in notices)
    status = f"FIRING:{firing}" if firing else "RESOLVED"
    names = sorted({n.alertname for n in notices})
    what = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    nodes = sorted({n.labels["node"] for n in notices if "node" in n.labels})
    where = "" if not nodes else f" on {nodes[0]}" if len(nodes) == 1 else f" on {len(nodes)} nodes"
    return _one_line(f"[{status}] gpufleet: {what}{where}")[:200]


def email_body(notices: Sequence[AlertNotice], external_url: str = "") -> str:
    """The plain-text body: a count, then each alert's headline, annotations, times, labels and source."""
    firing = sum(n.status == "firing" for n in notices)
    parts = [f"{firing} firing, {len(notices) - firing} resolved.", ""]
    for n in notices[:MAX_LISTED]:
        parts.append(n.headline())
        in_headline = "summary" if "summary" in n.annotations else "description"
        parts.extend(
            f"  {key}: {_one_line(value)}" for key, value in sorted(n.annotations.items()) if key != in_headline
        )
        parts.append(f"  started: {_utc(n.starts_at)}")
        if n.status == "resolved" and n.ends_at:
            parts.append(f"  ended: {_utc(n.ends_at)}")
        parts.append("  labels: " + ", ".join(f"{k}={_one_line(v)}" for k, v in sorted(n.labels.items())))
        if n.generator_url:
            parts.append(f"  source: {n.generator_url}")
        parts.append("")
    if len(notices) > MAX_LISTED:
        parts.extend([f"… and {len(notices) - MAX_LISTED} more", ""])
    if external_url:
        parts.append(f"gpufleet: {external_url}")
    return "\n".join(parts)


# --- where it goes --------------------------------------------------------------------------------


def redact_url(url: str) -> str:
    """`https://hooks.slack.com/…`: scheme, host and port only, since paths and queries often hold tokens."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]  # drop user:password@
    rest = "…" if parts.path not in ("", "/") or parts.query or parts.fragment else ""
    return f"{parts.scheme}://{host}/{rest}"


def _check_url(url: str) -> str:
    parts = urlsplit(url)
    try:
        parts.port  # noqa: B018  (raises ValueError for a port that is not a number in range)
    except ValueError:
        raise ValueError("the URL has an invalid port") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("must be an http:// or https:// URL with a host")
    if any(ch.isspace() or ord(ch) < 32 for ch in url):
        raise ValueError("the URL must not contain whitespace or control characters")
    return url


class SecretUrl(SecretStr):
    """A URL that may hold a credential (a token in its path or query, user:password@): shown redacted."""

    def _display(self) -> str:
        return redact_url(self.get_secret_value())


def _check_secret_url(url: SecretUrl) -> SecretUrl:
    # Checked here rather than by Field(max_length): pydantic's own errors would echo the value.
    if len(url.get_secret_value()) > 2048:
        raise ValueError("the URL is longer than 2048 characters")
    _check_url(url.get_secret_value())
    return url


# An addr-spec of the common shape (no quoted local parts, no comments): enough for alert mail, and it
# can never carry a CR or LF into a header. Single-label domains (root@localhost) are allowed.
_DNS_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_DOMAIN = rf"{_DNS_LABEL}(?:\.{_DNS_LABEL})*"
_ATOM = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
_EMAIL = re.compile(rf"^{_ATOM}(?:\.{_ATOM})*@{_DOMAIN}$")
_HOST = re.compile(rf"^{_DOMAIN}$")
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # an RFC 9110 token


def _check_email(address: str) -> str:
    if len(address) > 254 or not _EMAIL.fullmatch(address):
        raise ValueError("not an email address of the form name@domain")
    return address


def _check_host(host: str) -> str:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if len(host) > 253 or not _HOST.fullmatch(host):
            raise ValueError("not a host name or IP address") from None
    return host


ReceiverName = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9_-]{0,62}$")]
# Shown (repr, str, JSON) as `https://host/…`; `stored_receiver` keeps the whole URL.
SecretHttpUrl = Annotated[
    SecretUrl, AfterValidator(_check_secret_url), PlainSerializer(str, return_type=str, when_used="json")
]
EmailAddress = Annotated[str, AfterValidator(_check_email)]
HeaderName = Annotated[str, StringConstraints(pattern=_HEADER_NAME.pattern, max_length=128)]
Timeout = Annotated[float, Field(gt=0, le=120)]


class _Receiver(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: ReceiverName


class WebhookReceiver(_Receiver):
    """POSTs Alertmanager's webhook JSON to `url`. The URL (it may carry a token) and the header values
    (an Authorization header, an API key) are secrets, shown redacted or masked everywhere but the request."""

    type: Literal["webhook"] = "webhook"
    url: SecretHttpUrl
    headers: dict[HeaderName, SecretStr] = Field(default_factory=dict, max_length=32)
    timeout_s: Timeout = 10.0

    @model_validator(mode="after")
    def _header_values_are_one_line(self) -> Self:
        if any(ch in value.get_secret_value() for value in self.headers.values() for ch in "\r\n\0"):
            raise ValueError("header values must not contain CR, LF or NUL")
        return self


class SlackReceiver(_Receiver):
    """POSTs `{"text": ...}` to a Slack-style incoming webhook. The whole URL is the credential."""

    type: Literal["slack"] = "slack"
    url: SecretHttpUrl
    timeout_s: Timeout = 10.0


class EmailReceiver(_Receiver):
    """Sends a plain-text email through the SMTP server `host:port`.

    `username`/`password` go together, and need `starttls` unless the server is on loopback, so a
    password never crosses the network in clear. `ca_file` trusts a private CA for STARTTLS.
    """

    type: Literal["email"] = "email"
    host: Annotated[str, AfterValidator(_check_host)]
    port: int = Field(25, ge=1, le=65535)
    sender: EmailAddress
    to: list[EmailAddress] = Field(min_length=1, max_length=100)
    starttls: bool = False
    username: Annotated[str, StringConstraints(min_length=1, max_length=256, pattern=r"^[^\r\n\x00]+$")] | None = None
    password: SecretStr | None = None
    ca_file: Path | None = None
    timeout_s: Timeout = 10.0

    @model_validator(mode="after")
    def _credentials(self) -> Self:
        if (self.username is None) != (self.password is None):
            raise ValueError("username and password go together")
        if self.username is not None and not self.starttls and not tls.is_loopback_host(self.host):
            raise ValueError("a password needs starttls: true, or it would cross the network in clear")
        if len(set(self.to)) != len(self.to):
            raise ValueError("a recipient is listed twice")
        return self


AnyReceiver = WebhookReceiver | SlackReceiver | EmailReceiver
# The discriminated union: use it as a field type, e.g. in an API schema or a settings model.
ReceiverSpec = Annotated[AnyReceiver, Field(discriminator="type")]
_RECEIVER: TypeAdapter[AnyReceiver] = TypeAdapter(ReceiverSpec)


def parse_receiver(data: object) -> AnyReceiver:
    """A receiver from its stored or submitted form (a dict with `type`). Raises InvalidInput."""
    try:
        return _RECEIVER.validate_python(data)
    except ValidationError as exc:
        raise InvalidInput(f"receiver: {describe(exc)}") from None


def _reveal(value: Any) -> Any:
    if isinstance(value, SecretStr):
        return value.get_secret_value()
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, dict):
        return {k: _reveal(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_reveal(v) for v in value]
    return value


def stored_receiver(spec: AnyReceiver) -> dict[str, Any]:
    """The receiver as JSON-ready data *with its secrets*, for storage only; `parse_receiver` reads it
    back. To show a receiver, use `spec.model_dump(mode="json")`, which masks them."""
    data: dict[str, Any] = _reveal(spec.model_dump(mode="python"))
    return data


# --- sending --------------------------------------------------------------------------------------


class Notifier(Protocol):
    """Sends one group of alerts to one receiver. Raises NotificationFailed, and nothing else on purpose."""

    @property
    def name(self) -> str:
        """The receiver's name, for logs and results."""
        ...

    async def send(self, notices: list[AlertNotice]) -> None: ...


class _RedactUrlsInHttpxLog(logging.Filter):
    """httpx logs each request's full URL at INFO; for a receiver, that URL is its credential."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) > 1 and str(args[1]) in self.urls:
            record.args = (args[0], redact_url(str(args[1])), *args[2:])
        return True


_HTTPX_LOG_FILTER = _RedactUrlsInHttpxLog()


def _keep_out_of_httpx_log(url: str) -> None:
    httpx_log = logging.getLogger("httpx")
    if _HTTPX_LOG_FILTER not in httpx_log.filters:
        httpx_log.addFilter(_HTTPX_LOG_FILTER)
    _HTTPX_LOG_FILTER.urls.add(str(httpx.URL(url)))


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after", "")
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:
        return None  # an HTTP date: rare from webhook receivers, and our own backoff is a fine stand-in


def _certificate_problem(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLCertVerificationError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


async def _post_json(
    client: httpx.AsyncClient | None,
    receiver: str,
    url: str,
    body: dict[str, Any],
    headers: dict[str, str],
    timeout_s: float,
) -> None:
    """POST `body`; return on 2xx, raise NotificationFailed otherwise. Redirects are not followed,
    so headers never go to a second host."""
    shown = redact_url(url)
    headers = {"User-Agent": _USER_AGENT, **headers}

    async def post(via: httpx.AsyncClient) -> httpx.Response:
        return await via.post(url, json=body, headers=headers, timeout=timeout_s, follow_redirects=False)

    try:
        if client is None:
            async with httpx.AsyncClient() as own:
                response = await post(own)
        else:
            response = await post(client)
    except httpx.TimeoutException:
        raise NotificationFailed(f"{receiver}: {shown} timed out after {timeout_s:g}s", retryable=True) from None
    except httpx.HTTPError as exc:
        reason = (str(exc) or type(exc).__name__).replace(url, shown)
        raise NotificationFailed(
            f"{receiver}: cannot reach {shown}: {reason}", retryable=not _certificate_problem(exc)
        ) from None
    status = response.status_code
    if 200 <= status < 300:
        return
    snippet = _one_line(response.text)[:200]
    raise NotificationFailed(
        f"{receiver}: {shown} answered {status}" + (f": {snippet}" if snippet else ""),
        retryable=status in (408, 429) or status >= 500,
        retry_after_s=_retry_after(response),
    )


class WebhookNotifier:
    """Alertmanager-compatible webhook. Pass `client` to share a connection pool between sends."""

    def __init__(
        self,
        spec: WebhookReceiver,
        *,
        external_url: str = "",
        group_by: Sequence[str] = ("alertname",),
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self.spec = spec
        self._external_url = external_url
        self._group_by = tuple(group_by)
        self._client = client
        _keep_out_of_httpx_log(spec.url.get_secret_value())

    @property
    def name(self) -> str:
        return self.spec.name

    def payload(self, notices: Sequence[AlertNotice]) -> dict[str, Any]:
        return webhook_payload(
            notices, receiver=self.spec.name, external_url=self._external_url, group_by=self._group_by
        )

    async def send(self, notices: list[AlertNotice]) -> None:
        """POST the group; raises NotificationFailed."""
        if not notices:
            return
        headers = {k: v.get_secret_value() for k, v in self.spec.headers.items()}
        url = self.spec.url.get_secret_value()
        await _post_json(self._client, self.name, url, self.payload(notices), headers, self.spec.timeout_s)


class SlackNotifier:
    """Slack incoming webhook (Mattermost and Rocket.Chat accept the same body)."""

    def __init__(self, spec: SlackReceiver, *, client: httpx.AsyncClient | None = None) -> None:
        self.spec = spec
        self._client = client
        _keep_out_of_httpx_log(spec.url.get_secret_value())

    @property
    def name(self) -> str:
        return self.spec.name

    async def send(self, notices: list[AlertNotice]) -> None:
        """POST `{"text": ...}`; raises NotificationFailed."""
        if not notices:
            return
        url = self.spec.url.get_secret_value()
        await _post_json(self._client, self.name, url, {"text": slack_text(notices)}, {}, self.spec.timeout_s)


def _smtp_failure(receiver: str, exc: Exception) -> NotificationFailed:
    """Classify an SMTP or socket error: SMTP 4xx and network trouble are worth retrying, 5xx is not."""

    def reply(code: int, text: bytes | str) -> str:
        message = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
        return f"{code} {_one_line(message)}"[:200]

    if isinstance(exc, smtplib.SMTPRecipientsRefused):
        codes = [code for code, _ in exc.recipients.values()]
        refused = "; ".join(f"{rcpt}: {reply(code, text)}" for rcpt, (code, text) in exc.recipients.items())
        return NotificationFailed(
            f"{receiver}: every recipient refused: {refused}", retryable=all(400 <= c < 500 for c in codes)
        )
    if isinstance(exc, smtplib.SMTPResponseException):  # authentication, sender, data, helo, connect
        return NotificationFailed(
            f"{receiver}: the SMTP server answered {reply(exc.smtp_code, exc.smtp_error)}",
            retryable=400 <= exc.smtp_code < 500,
        )
    if isinstance(exc, smtplib.SMTPServerDisconnected):
        return NotificationFailed(f"{receiver}: the SMTP server hung up: {exc}", retryable=True)
    if isinstance(exc, smtplib.SMTPException):  # no STARTTLS, no usable AUTH mechanism: configuration
        return NotificationFailed(f"{receiver}: {exc}", retryable=False)
    if isinstance(exc, ssl.SSLCertVerificationError):
        return NotificationFailed(f"{receiver}: the SMTP server's certificate: {exc.verify_message}", retryable=False)
    return NotificationFailed(f"{receiver}: SMTP: {exc or type(exc).__name__}", retryable=True)


class EmailNotifier:
    """Email over SMTP. smtplib blocks, so each send runs in a worker thread."""

    def __init__(self, spec: EmailReceiver, *, external_url: str = "", clock: Clock | None = None) -> None:
        self.spec = spec
        self._external_url = external_url
        self._clock = clock or SystemClock()

    @property
    def name(self) -> str:
        return self.spec.name

    def message(self, notices: Sequence[AlertNotice]) -> EmailMessage:
        msg = EmailMessage()
        msg["Subject"] = email_subject(notices)
        msg["From"] = formataddr(("gpufleet", self.spec.sender))
        msg["To"] = ", ".join(self.spec.to)
        msg["Date"] = format_datetime(to_datetime(self._clock.now()))
        # The sender's domain, not socket.getfqdn(): that can stall on DNS, and says nothing useful.
        msg["Message-ID"] = make_msgid("gpufleet", domain=self.spec.sender.rpartition("@")[2])
        msg["Auto-Submitted"] = "auto-generated"  # RFC 3834: vacation responders must not answer
        msg.set_content(email_body(notices, self._external_url))
        return msg

    async def send(self, notices: list[AlertNotice]) -> None:
        """Send one message to every recipient; raises NotificationFailed."""
        if not notices:
            return
        await asyncio.to_thread(self._send_blocking, self.message(notices))

    def _send_blocking(self, msg: EmailMessage) -> None:
        spec = self.spec
        try:
            context = tls.client_context(ca_file=spec.ca_file) if spec.starttls else None
        except ConfigError as exc:
            raise NotificationFailed(f"{self.name}: {exc}", retryable=False) from None
        try:
            with smtplib.SMTP(spec.host, spec.port, timeout=spec.timeout_s) as smtp:
                if context is not None:
                    smtp.starttls(context=context)
                if spec.username is not None and spec.password is not None:
                    smtp.login(spec.username, spec.password.get_secret_value())
                refused = smtp.send_message(msg, from_addr=spec.sender, to_addrs=spec.to)
        except (smtplib.SMTPException, OSError) as exc:
            raise _smtp_failure(self.name, exc) from None
        if refused:
            # Some recipients got it: sending again would repeat it to them, so this is not retried.
            names = ", ".join(sorted(refused))
            raise NotificationFailed(f"{self.name}: refused for {names}, sent to the others", retryable=False)


def notifier_for(
    spec: AnyReceiver,
    *,
    external_url: str = "",
    client: httpx.AsyncClient | None = None,
    clock: Clock | None = None,
) -> Notifier:
    """The notifier for a receiver. `external_url` is the head's address, linked from notifications."""
    match spec:
        case WebhookReceiver():
            return WebhookNotifier(spec, external_url=external_url, client=client)
        case SlackReceiver():
            return SlackNotifier(spec, client=client)
        case EmailReceiver():
            return EmailNotifier(spec, external_url=external_url, clock=clock)


@dataclass(frozen=True)
class DeliveryResult:
    receiver: str
    delivered: bool
    attempts: int
    last_error: str | None = None


async def deliver(
    notifier: Notifier,
    notices: list[AlertNotice],
    *,
    attempts: int = 5,
    first_delay_s: float = 1.0,
    max_delay_s: float = 30.0,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
) -> DeliveryResult:
    """Send, retrying retryable failures after 1, 2, 4 ... s (capped at `max_delay_s`, stretched to the
    receiver's Retry-After up to that cap). Stops at a permanent failure or after `attempts` sends.

    Never raises NotificationFailed: the outcome is in the result, and each failure is logged in one line.
    Raises ValueError for `attempts` < 1.
    """
    if attempts < 1:
        raise ValueError("attempts must be at least 1")
    if not notices:
        return DeliveryResult(notifier.name, delivered=True, attempts=0)
    delay = first_delay_s
    for attempt in range(1, attempts + 1):
        try:
            await notifier.send(notices)
        except NotificationFailed as exc:
            if not exc.retryable or attempt == attempts:
                why = "not retried" if not exc.retryable else "giving up"
                log.warning("notification to %s failed (attempt %d, %s): %s", notifier.name, attempt, why, exc)
                return DeliveryResult(notifier.name, delivered=False, attempts=attempt, last_error=str(exc))
            wait = min(max(delay, exc.retry_after_s or 0.0), max_delay_s)
            log.info("notification to %s failed (attempt %d), retrying in %.1fs: %s", notifier.name, attempt, wait, exc)
            await sleep(wait)
            delay = min(delay * 2, max_delay_s)
        else:
            return DeliveryResult(notifier.name, delivered=True, attempts=attempt)
    raise AssertionError("unreachable")  # the loop returns on its last attempt
