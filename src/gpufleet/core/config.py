"""Settings: defaults < client file (written by `gpufleet login`) < TOML config file < GPUFLEET_* env < CLI options.

Settings are built once, by `load_settings`, at the entry point, and passed down explicitly; nothing
reads the environment behind the caller's back.
"""

from __future__ import annotations

import os
import posixpath
import re
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from gpufleet.core.config_directory import DirectorySettings
from gpufleet.core.config_images import ImageSettings
from gpufleet.core.config_network import NetworkSettings
from gpufleet.core.config_storage import StorageSettings
from gpufleet.core.errors import ConfigError, describe

DEFAULT_CONFIG_FILE = Path("/etc/gpufleet/gpufleet.toml")
_UNIT_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,119}")
_MOUNT_PATTERN = re.compile(r"/[A-Za-z0-9._@/-]{0,119}")


def default_client_file() -> Path:
    """Where `gpufleet login` keeps the server URL and token: $GPUFLEET_CLIENT_CONFIG or the XDG config dir."""
    explicit = os.environ.get("GPUFLEET_CLIENT_CONFIG")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "gpufleet" / "client.toml"


class Settings(DirectorySettings, NetworkSettings, StorageSettings, ImageSettings):
    """Every knob of gpufleet, for the head node, the agent and the CLI alike."""

    model_config = SettingsConfigDict(env_prefix="GPUFLEET_", extra="forbid", frozen=True)

    # Head node
    data_dir: Path = Field(Path("/var/lib/gpufleet"), description="where the head keeps its database and state")
    listen: str = Field("127.0.0.1:8080", description="HOST:PORT the head node listens on")
    database_url: SecretStr | None = Field(
        None, description="SQLAlchemy URL; default: SQLite in WAL mode under data_dir"
    )
    bootstrap_token: SecretStr | None = Field(
        None, description="admin token to install on start instead of generating one (automation)"
    )
    heartbeat_interval_s: float = Field(1.0, ge=0.05, le=3600, description="heartbeat period agents are told")
    down_after_intervals: float = Field(
        2.5, gt=1.0, le=100, description="missed heartbeat intervals before a node is down"
    )
    sweep_interval_s: float = Field(0.1, gt=0, le=60, description="how often the leader looks for silent nodes")
    flush_interval_s: float = Field(0.25, gt=0, le=60, description="how often heartbeat receipts are made durable")
    lease_ttl_s: float = Field(5.0, gt=0.5, le=600, description="leadership lease; a dead leader is replaced after it")
    leader_grace_s: float = Field(
        10.0, ge=0, le=3600, description="time a new leader gives every node to reconnect before sweeping it"
    )
    max_request_bytes: int = Field(256 * 1024, ge=1024, le=64 * 1024 * 1024)
    request_threads: int = Field(
        2,
        ge=1,
        le=256,
        description="threads running blocking request handlers in each head process; more contend for the interpreter",
    )
    auth_cache_s: float = Field(
        1.0,
        ge=0,
        le=60,
        description="how long a head process answers a repeated API token from memory; 0: never",
    )
    workers: int = Field(
        1, ge=1, le=64, description="head processes serving the listen address together (several need PostgreSQL)"
    )
    agent_listen: str | None = Field(
        None,
        description="HOST:PORT where a channel process of its own serves the agents (their server URL), apart"
        " from the API's processes on listen; unset: agents and API share listen",
    )
    metrics_interval_s: float = Field(
        5.0, ge=0.1, le=3600, description="how often agents sample metrics (the head judges staleness by it)"
    )
    metrics_raw_retention_s: float = Field(86_400.0, ge=60, description="how long raw metric samples are kept")
    metrics_rollup_retention_s: float = Field(
        30 * 86_400.0, ge=3600, description="how long one-minute metric roll-ups are kept"
    )
    log_retention_s: float = Field(
        7 * 86_400.0, gt=0, description="how long the agents' log lines and their events are kept at the head"
    )
    cve_evaluate_interval_s: float = Field(
        10.0, gt=0, le=3600, description="how often the leader looks for new advisories or software to evaluate"
    )
    package_links: list[str] = Field(
        default_factory=list,
        description="distribution packages advisories name in another ecosystem, beyond gpufleet's own:"
        " 'PACKAGE = ECOSYSTEM:NAME' each (e.g. 'nvidia-container-toolkit = Go:github.com/NVIDIA/"
        "nvidia-container-toolkit'); see docs/assets.md",
    )
    log_forward_url: str | None = Field(
        None, description="send log events as JSON lines to a collector: tcp://HOST:PORT or an http(s) URL"
    )
    log_template_learning_s: float = Field(
        86_400.0, ge=0, description="a node category's first lines only teach the template miner for this long"
    )
    log_template_window_s: float = Field(60.0, ge=1, le=3600, description="window of log template rates")
    log_template_burst_factor: float = Field(
        10.0, gt=1, description="a template written this many times its usual rate in a window is a burst"
    )
    log_template_burst_min: int = Field(50, ge=1, description="... and at least this many times")
    log_template_pass_s: float = Field(5.0, gt=0, le=600, description="how often the leader mines new log lines")
    resume_after_healthy_samples: int = Field(
        3, ge=1, le=1000, description="healthy samples in a row before a node gpufleet drained is resumed"
    )
    external_url: str | None = Field(None, description="the head's URL as people reach it, for links in alerts")
    # Jobs (the built-in workload manager)
    scheduler_interval_s: float = Field(1.0, gt=0, le=600, description="how often the leader schedules the queue")
    scheduler_backfill: bool = Field(True, description="let later jobs start when they cannot delay the top one")
    scheduler_placement: str = Field("pack", description="pack (fill nodes) or spread (balance load)")
    scheduler_placement_by_category: dict[str, str] = Field(
        default_factory=dict, description="pack or spread per node category, over scheduler_placement"
    )
    fair_share_half_life_s: float = Field(
        7 * 86_400.0, gt=0, description="half-life of past GPU use in projects' fair-share order"
    )
    job_default_time_limit_s: float = Field(3600.0, gt=0, description="time limit of a job that names none")
    job_templates_dir: Path | None = Field(
        None, description="admin job templates (*.toml), beside the built-in ones; default data_dir/job-templates"
    )
    burnin_profiles_dir: Path | None = Field(
        None, description="admin burn-in profiles (*.toml), beside the built-in ones; default data_dir/burnin-profiles"
    )
    burnin_admission: str | None = Field(
        None,
        pattern=r"^[a-z0-9][a-z0-9-]{0,62}$",
        description="a burn-in profile every new node must pass before it takes work (None: nodes join in service)",
    )
    burnin_user: str = Field("root", min_length=1, max_length=32, description="the node user burn-in step jobs run as")
    maintenance_interval_s: float = Field(
        1.0, gt=0, le=600, description="how often the leader moves maintenance campaigns on"
    )
    job_max_time_limit_s: float = Field(14 * 86_400.0, gt=0, description="the longest time limit a job may ask for")
    job_max_requeues: int = Field(3, ge=0, le=100, description="how often a requeue-on-node-failure job is run again")
    job_output_max_chars: int = Field(
        16 * 1024 * 1024, ge=1024, description="output kept per job on the head; the rest stays in the node's spool"
    )
    service_check_interval_s: float = Field(
        2.0, gt=0, le=3600, description="how often the leader health-checks inference service replicas"
    )
    service_proxy_timeout_s: float = Field(
        60.0, gt=0, le=3600, description="how long the head waits for a replica to answer a proxied call"
    )
    job_spool_dir: Path = Field(
        Path("/var/lib/gpufleet-agent/jobs"), description="where the agent keeps each job's full output"
    )
    artifact_dirs: list[Path] = Field(
        default_factory=list,
        description="directories a model's or dataset's path location must lie under; empty: any absolute path",
    )
    artifact_cache_dir: Path = Field(
        Path("/var/cache/gpufleet/artifacts"), description="the node cache models and datasets are staged into"
    )
    artifact_cache_gb: float = Field(
        200.0, gt=0, description="the node cache's size limit in GB; least recently used artifacts go first"
    )
    job_kill_grace_s: float = Field(
        10.0, ge=0, le=3600, description="SIGTERM to SIGKILL, when a job is cancelled or out of time"
    )
    job_min_uid: int = Field(1000, ge=0, description="jobs never run as a local account with a lower uid")
    job_podman_env: dict[str, str] = Field(
        default_factory=dict, description="extra environment for podman, e.g. CONTAINERS_CONF"
    )
    # The workload manager: the built-in scheduler, or a real Slurm (jobs.slurm)
    workload_manager: Literal["builtin", "slurm"] = Field(
        "builtin", description="who runs jobs and holds drains: builtin (gpufleet's scheduler) or slurm"
    )
    slurm_conf: Path | None = Field(None, description="slurm.conf the Slurm programs read; None: Slurm's default")
    slurm_timeout_s: float = Field(10.0, gt=0, le=600, description="how long one Slurm command may take")
    slurm_poll_interval_s: float = Field(
        2.0, gt=0, le=600, description="how often the leader reads Slurm's jobs and node states"
    )
    slurm_partition: str | None = Field(None, description="partition for jobs that name none; None: Slurm's default")
    slurm_output_dir: Path | None = Field(
        None, description="shared directory for Slurm jobs' output files; None: the job's working directory"
    )
    slurm_job_map_dir: Path = Field(
        Path("/run/gpufleet/slurm-jobs"),
        description="(agent) where gpufleet's Slurm prolog records which job holds which GPU",
    )
    # Ansible runs (provisioning.ansible): playbooks run by the head through ansible-runner
    ansible_timeout_s: float = Field(
        3600.0, ge=1, le=7 * 86400, description="how long one Ansible run may take before it is stopped"
    )
    ansible_task_timeout_s: int = Field(
        900, ge=0, le=86400, description="how long one task may take on one host (Ansible's TASK_TIMEOUT); 0: none"
    )
    ansible_forks: int = Field(20, ge=1, le=1000, description="hosts an Ansible run works on at once")
    ansible_local_connection: bool = Field(
        False,
        description="let a node's label ansible/connection=local run its tasks on the head itself (trials, tests)",
    )
    # Power through nodes' BMCs (power): Redfish and IPMI
    power_fanout: int = Field(16, ge=1, le=1024, description="BMCs a bulk power action works on at once")
    power_stagger_s: float = Field(
        0.5, ge=0, le=60, description="seconds between power-ons in a bulk action (power-on inrush)"
    )
    power_confirm_timeout_s: float = Field(
        60.0, gt=0, le=3600, description="how long a node's power may take to reach the wanted state"
    )
    bmc_timeout_s: float = Field(10.0, gt=0, le=300, description="how long one request to a BMC may take")
    bmc_key_file: Path | None = Field(
        None, description="key that encrypts BMC passwords (made 0600 on first use); None: data_dir/bmc.key"
    )
    ipmi_cipher_suite: int = Field(3, ge=0, le=17, description="ipmitool -C: the RMCP+ cipher suite of IPMI BMCs")
    web_session_ttl_s: int = Field(12 * 3600, ge=60, le=30 * 24 * 3600, description="how long a web login lasts")
    tls_cert: Path | None = Field(
        None, description="server certificate (PEM); default: data_dir/tls/server.pem once `server init` made it"
    )
    tls_key: Path | None = Field(None, description="server key (PEM); default: data_dir/tls/server.key")
    tls_ca: Path | None = Field(
        None, description="CA whose fingerprint join tokens carry; default: data_dir/tls/ca.pem"
    )
    insecure_http: bool = Field(
        False, description="allow plain HTTP off loopback (only behind a TLS-terminating proxy)"
    )
    # Client (CLI) side
    server: str = Field("http://127.0.0.1:8080", description="head node URL the CLI and agent talk to")
    token: SecretStr | None = Field(None, description="API token the CLI presents")
    ca_file: Path | None = Field(None, description="CA certificate the CLI (and an unpinned agent) trusts for https")
    # Agent side
    agent_state_dir: Path = Field(Path("/var/lib/gpufleet-agent"), description="where the agent keeps its credential")
    accounts_sync: bool = Field(False, description="create and update the cluster users' accounts on the node")
    accounts_root: Path = Field(Path("/"), description="root directory whose etc/passwd the account sync edits")
    accounts_interval_s: float = Field(60.0, ge=1, le=86400, description="how often the agent asks for the accounts")
    agent_metrics_listen: str | None = Field(
        None, description="HOST:PORT where the agent serves its latest sample in Prometheus' format; None: off"
    )
    checks_dir: Path = Field(
        Path("/etc/gpufleet/checks.d"), description="custom checks: every executable file here (NHC style)"
    )
    checks_interval_s: float = Field(60.0, ge=1, le=86400, description="how often the agent runs the node's checks")
    checks_timeout_s: float = Field(10.0, gt=0, le=3600, description="how long one check may run before it warns")
    required_services: list[str] = Field(
        default_factory=list, description="systemd units that must be active (check service:UNIT)"
    )
    required_mounts: list[str] = Field(default_factory=list, description="paths that must be mount points")
    log_files: list[Path] = Field(
        default_factory=lambda: [Path("/dev/kmsg"), Path("/var/log/nvidia-fabricmanager.log")],
        description="kernel and driver logs the agent follows and classifies (missing ones are skipped)",
    )
    software_report: bool = Field(True, description="the agent reports installed packages, drivers and firmware")
    software_check_s: float = Field(
        3600.0, ge=10, le=7 * 86400, description="how often the agent reads its software again (sent when changed)"
    )
    software_pip_envs: list[Path] = Field(
        default_factory=lambda: [Path("/usr/local"), Path("/opt/conda")],
        description="Python environments whose pip packages the agent reports",
    )
    log_level: str = Field("INFO", description="logging level")
    access_log: str = Field(
        "-",
        min_length=1,
        description="the head's access log, a line per HTTP request and per agent channel: - (stderr), a file, or off",
    )

    @field_validator("scheduler_placement")
    @classmethod
    def _check_placement(cls, value: str) -> str:
        if value not in ("pack", "spread"):
            raise ValueError("must be pack or spread")
        return value

    @field_validator("scheduler_placement_by_category")
    @classmethod
    def _check_placement_by_category(cls, value: dict[str, str]) -> dict[str, str]:
        wrong = sorted(k for k, v in value.items() if v not in ("pack", "spread"))
        if wrong:
            raise ValueError(f"must map categories to pack or spread (not: {', '.join(wrong)})")
        return value

    @field_validator("package_links")
    @classmethod
    def _check_package_links(cls, value: list[str]) -> list[str]:
        # The shape only: which ecosystems exist is the assets domain's to say (assets.links).
        wrong = [v for v in value if not re.fullmatch(r"\s*[A-Za-z0-9][A-Za-z0-9+._-]*\s*=\s*[^:=]+:\S+\s*", v)]
        if wrong:
            raise ValueError(f"must be 'PACKAGE = ECOSYSTEM:NAME' lines (not: {', '.join(map(repr, wrong))})")
        return value

    @field_validator("listen")
    @classmethod
    def _check_listen(cls, value: str) -> str:
        host, sep, port = value.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError("must be HOST:PORT, e.g. 127.0.0.1:8080")
        return value

    @field_validator("agent_metrics_listen", "agent_listen")
    @classmethod
    def _check_optional_listen(cls, value: str | None) -> str | None:
        return None if value is None else cls._check_listen(value)

    @field_validator("log_level")
    @classmethod
    def _check_log_level(cls, value: str) -> str:
        if value.upper() not in {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}:
            raise ValueError("must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL")
        return value.upper()

    @field_validator("accounts_root")
    @classmethod
    def _check_accounts_root(cls, value: Path) -> Path:
        if not value.is_absolute():
            raise ValueError("must be an absolute path")  # useradd --root takes only absolute paths
        return value

    @field_validator("checks_dir")
    @classmethod
    def _check_checks_dir(cls, value: Path) -> Path:
        if not value.is_absolute():
            raise ValueError("must be an absolute path")
        return value

    @field_validator("log_files")
    @classmethod
    def _check_log_files(cls, value: list[Path]) -> list[Path]:
        for path in value:
            if not path.is_absolute():
                raise ValueError(f"{str(path)[:80]!r} is not an absolute path")
        return list(dict.fromkeys(value))

    @field_validator("required_services")
    @classmethod
    def _check_required_services(cls, value: list[str]) -> list[str]:
        # The unit becomes part of a check name (`service:UNIT`), whose characters the protocol limits.
        for unit in value:
            if not _UNIT_PATTERN.fullmatch(unit):
                raise ValueError(f"{unit[:80]!r} is not a unit name of letters, digits and '.', '_', ':', '@', '-'")
        return list(dict.fromkeys(value))

    @field_validator("required_mounts")
    @classmethod
    def _check_required_mounts(cls, value: list[str]) -> list[str]:
        paths = []
        for path in value:
            if not _MOUNT_PATTERN.fullmatch(path):
                raise ValueError(f"{path[:80]!r} is not an absolute path of letters, digits and '.', '_', '@', '-'")
            paths.append("/" + posixpath.normpath(path).lstrip("/"))  # POSIX keeps a leading "//"
        return list(dict.fromkeys(paths))

    @field_validator("server")
    @classmethod
    def _check_server(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL")
        return value.rstrip("/")

    @property
    def effective_database_url(self) -> str:
        if self.database_url is not None:
            return self.database_url.get_secret_value()
        return f"sqlite:///{self.data_dir / 'gpufleet.db'}"

    def effective_tls(self) -> tuple[Path, Path, Path | None] | None:
        """The head's certificate, key and CA when it serves HTTPS, else None.

        Raises ConfigError when only one of tls_cert and tls_key is set.
        """
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError("set both tls_cert and tls_key, or neither")
        if self.tls_cert is not None and self.tls_key is not None:
            return self.tls_cert, self.tls_key, self.tls_ca
        made = self.data_dir / "tls"
        if (made / "server.pem").exists():
            ca = self.tls_ca or made / "ca.pem"
            return made / "server.pem", made / "server.key", ca if ca.exists() else None
        return None

    def listen_host_port(self, address: str | None = None) -> tuple[str, int]:
        """`listen` (or another HOST:PORT setting's value) split for binding."""
        host, _, port = (address or self.listen).rpartition(":")
        return host.strip("[]"), int(port)

    def shown(self) -> dict[str, Any]:
        """The effective settings as plain values, secrets masked, for `gpufleet config show`."""
        out: dict[str, Any] = {}
        for name in type(self).model_fields:
            value = getattr(self, name)
            if isinstance(value, SecretStr):
                out[name] = "********"
            elif isinstance(value, Path):
                out[name] = str(value)
            else:
                out[name] = value
        if self.database_url is None:
            out["database_url"] = f"(default) {self.effective_database_url}"
        else:
            out["database_url"] = _mask_url_password(self.database_url.get_secret_value())
        return out


def _mask_url_password(url: str) -> str:
    """Show a database URL with its password replaced, so admins see which server is meant."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    creds, _, host = rest.rpartition("@")
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user}:********@{host}" if ":" in creds else url


class _FileSource(PydanticBaseSettingsSource):
    """Values from TOML files; later files win. Unknown keys are rejected by the model (extra=forbid)."""

    def __init__(self, settings_cls: type[BaseSettings], data: dict[str, Any]) -> None:
        super().__init__(settings_cls)
        self._data = data

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return self._data.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self._data)


def _read_toml(path: Path) -> dict[str, Any]:
    """The file's settings. A table is a prefix: `[accounts] sync = true` is `accounts_sync = true`."""
    try:
        with path.open("rb") as fh:
            data = tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict) and key not in Settings.model_fields:  # a dict-valued setting stays whole
            flat.update({f"{key}_{inner}": v for inner, v in value.items()})
        else:
            flat[key] = value
    return flat


def load_settings(config_file: Path | None = None, client_file: Path | None = None, **overrides: Any) -> Settings:
    """Build the settings once. `config_file` must exist when given; the defaults are read only if present.

    Raises ConfigError with one line naming the bad key when a value is invalid.
    """
    if config_file is None:
        env_file = os.environ.get("GPUFLEET_CONFIG")
        config_file = Path(env_file) if env_file else None
        if config_file is None and DEFAULT_CONFIG_FILE.exists():
            config_file = DEFAULT_CONFIG_FILE
    if config_file is not None and not config_file.exists():
        raise ConfigError(f"config file {config_file} does not exist")
    client_file = client_file or default_client_file()
    data: dict[str, Any] = {}
    for path in (client_file, config_file):
        if path is not None and path.exists():
            data.update(_read_toml(path))
    overrides = {k: v for k, v in overrides.items() if v is not None}

    class _Loaded(Settings):
        @classmethod
        def settings_customise_sources(
            cls,
            settings_cls: type[BaseSettings],
            init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource,
            dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
        ) -> tuple[PydanticBaseSettingsSource, ...]:
            return (init_settings, env_settings, _FileSource(settings_cls, data))

    try:
        return _Loaded(**overrides)
    except ValidationError as exc:
        raise ConfigError(f"invalid setting {describe(exc, 'settings')}") from None


def write_client_file(path: Path, server: str, token: str) -> None:
    """Store the CLI's server and token (mode 0600, written atomically)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(f"server = {_toml_str(server)}\ntoken = {_toml_str(token)}\n")
    tmp.replace(path)


def _toml_str(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
