"""The `prometheus.yml` that scrapes a gpufleet head: one job, a bearer token read from a file.

The head's `/metrics` needs a token with `metrics:read` (every human role has it; a read-only token
is enough). Prometheus reads it from `credentials_file`, so the token never sits in the config.
"""

from __future__ import annotations

import math
from typing import Any
from urllib.parse import urlsplit

from gpufleet.core.errors import InvalidInput
from gpufleet.prometheus.rules import DEFAULT_JOB

DEFAULT_TOKEN_FILE = "/etc/prometheus/gpufleet.token"  # noqa: S105  (a path, not a token)
MAX_SCRAPE_TIMEOUT_S = 10.0


def duration(seconds: float) -> str:
    """A Prometheus duration: whole seconds as `5s`, minutes as `2m`, anything finer in `ms`.

    Raises InvalidInput for a duration under a millisecond (or not finite).
    """
    if not math.isfinite(seconds) or seconds < 0.001:
        raise InvalidInput(f"not a usable interval: {seconds!r} s")
    ms = round(seconds * 1000)
    if ms % 60_000 == 0:
        return f"{ms // 60_000}m"
    if ms % 1000 == 0:
        return f"{ms // 1000}s"
    return f"{ms}ms"


def scrape_config(
    server: str,
    interval_s: float,
    *,
    token_file: str = DEFAULT_TOKEN_FILE,
    ca_file: str | None = None,
    job: str = DEFAULT_JOB,
    rule_files: tuple[str, ...] = ("gpufleet-rules.yml",),
    evaluation_interval_s: float = 15.0,
) -> dict[str, Any]:
    """The prometheus.yml document for a head at `server` (its URL as Prometheus reaches it).

    Scrapes every `interval_s` (match the agents' `metrics_interval_s`: faster only repeats the same
    sample). With several head replicas, list each: a replica exposes the GPUs of the nodes whose
    channels it holds. Raises InvalidInput for a URL that is not http(s)://host[:port][/prefix].
    """
    url = urlsplit(server)
    if url.scheme not in {"http", "https"} or not url.hostname:
        raise InvalidInput(f"not an http(s) URL of the head: {server!r}")
    port = url.port or (443 if url.scheme == "https" else 80)
    host = f"[{url.hostname}]" if ":" in url.hostname else url.hostname
    job_config: dict[str, Any] = {
        "job_name": job,
        "scheme": url.scheme,
        "metrics_path": url.path.rstrip("/") + "/metrics",
        "scrape_interval": duration(interval_s),
        "scrape_timeout": duration(min(interval_s, MAX_SCRAPE_TIMEOUT_S)),
        "authorization": {"type": "Bearer", "credentials_file": token_file},
    }
    if url.scheme == "https" and ca_file:
        job_config["tls_config"] = {"ca_file": ca_file}
    job_config["static_configs"] = [{"targets": [f"{host}:{port}"]}]
    return {
        "global": {"evaluation_interval": duration(evaluation_interval_s)},
        "rule_files": list(rule_files),
        "scrape_configs": [job_config],
    }
