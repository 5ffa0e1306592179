"""The systemd units of the head (`gpufleet-server.service`) and the agent (`gpufleet-agent.service`),
rendered in Python, and their atomic installation.

One renderer: `gpufleet server install-unit`, `gpufleet agent install-unit` and the head's agent rollout
(`gpufleet node deploy-agent`, provisioning.agent_deploy) all write what `ServerUnit.render` and
`AgentUnit.render` return. Every path and word that reaches a unit is checked against one plain alphabet
(`check_path`, `check_word`), so nothing needs systemd's quoting, specifiers (`%`) or variables (`$`).

Hardening, and why each option is or is not there (the units carry the short reason as a comment; the
long one is in docs/deploy-agents.md):

- the head serves HTTP, runs ansible-playbook, ssh, rsync and ipmitool, and writes only under its data
  directory: it gets `ProtectSystem=strict` with its data directory writable, `PrivateTmp`,
  `NoNewPrivileges`, `ProtectHome` (unless its user's home is under /home or /root: Ansible and ssh read
  the user's ~/.ssh), and, running as a user of its own, the kernel, device and privilege protections.
  Run as root (software images are built with debootstrap and chroot), it keeps what image builds bear:
  no `PrivateDevices`, `RestrictSUIDSGID` or `ProtectClock` (device nodes and setuid files in the tree);
- the agent runs as root and everything it starts inherits its sandbox: jobs as their users (which may
  use setuid programs, their homes and the node's /tmp), podman, useradd on /etc/passwd and /home, rank
  cgroups under /sys/fs/cgroup, NVML and nvidia-smi on /dev/nvidia*, /dev/kmsg, modules for MIG. So of
  the sandboxing options it gets only `ProtectSystem=true` (/usr and /boot read-only: jobs never run as
  root); it gets what a job runner needs instead (as slurmd's unit does): no task limit,
  unlimited locked memory (RDMA), `OOMPolicy=continue` (a job killed by the OOM killer never stops the
  agent), and `RestartPreventExitStatus` for the refusals a restart cannot cure.
"""

from __future__ import annotations

import os
import posixpath
import re
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet import __version__
from gpufleet.core.errors import Conflict, InvalidInput
from gpufleet.protocol import messages

SERVER_UNIT = "gpufleet-server.service"
AGENT_UNIT = "gpufleet-agent.service"
UNIT_DIR = "/etc/systemd/system"
SERVER_ENV_FILE = "/etc/gpufleet/server.env"
AGENT_ENV_FILE = "/etc/gpufleet/agent.env"
SERVER_DATA_DIR = "/var/lib/gpufleet"
AGENT_STATE_DIR = "/var/lib/gpufleet-agent"
AGENT_LIB_DIR = "/usr/local/lib/gpufleet"  # where a rollout puts the agent's zipapp
DEFAULT_PYTHON = "/usr/bin/python3"
SERVER_USER = "gpufleet"
# Homes that ProtectHome=yes hides: a user living there keeps their ~/.ssh (Ansible, ssh, rsync).
PROTECTED_HOMES = ("/home", "/root", "/run/user")
# The agent's exit codes that a restart cannot cure: 2 an invalid setting or option, 5 the head refused
# the node for good (docs/agent.md), 8 the head's CA is not the one the join token pins.
AGENT_NO_RESTART = (2, 5, 8)
SERVER_NO_RESTART = (2,)  # an invalid setting

# Paths and words in a unit: no spaces, quotes, `%` (specifiers), `$` (variables), `\` or `;`.
_WORD = re.compile(r"[A-Za-z0-9_./:@+,=-]+")
_USER = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
_ENV_KEY = re.compile(r"[A-Z_][A-Z0-9_]*")
_ENV_VALUE = re.compile(r"[A-Za-z0-9_./:@+,=\[\]-]*")


def check_word(value: str, what: str) -> str:
    """`value` if it is one plain word (letters, digits and `_./:@+,=-`). Raises InvalidInput."""
    if not _WORD.fullmatch(value) or len(value) > 4096:
        raise InvalidInput(f"{what} {value[:200]!r} must be letters, digits and '_./:@+,=-' only")
    return value


def check_path(value: str | os.PathLike[str], what: str) -> str:
    """`value` as a normalised absolute path of plain words, without `..`. Raises InvalidInput."""
    text = os.fspath(value)
    if not text.startswith("/"):
        raise InvalidInput(f"{what} must be an absolute path, not {text[:200]!r}")
    check_word(text, what)
    if ".." in text.split("/"):
        raise InvalidInput(f"{what} {text[:200]!r} may not hold '..'")
    return "/" + posixpath.normpath(text).lstrip("/")


def check_user(value: str) -> str:
    """A POSIX user name (`gpufleet`, `root`). Raises InvalidInput."""
    if not _USER.fullmatch(value):
        raise InvalidInput(f"user {value[:40]!r} is not a user name (lower-case letters, digits, '_' and '-')")
    return value


def check_node_name(value: str) -> str:
    """A node name as the agent takes it (protocol.messages). Raises InvalidInput."""
    try:
        return messages.check_node_name(value)
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None


def zipapp_name(version: str = __version__) -> str:
    """The agent zipapp's file name, as `make dist` (scripts/dist.sh) writes it."""
    return f"gpufleet-agent-{version}.pyz"


def zipapp_program(zipapp: str, python: str = DEFAULT_PYTHON) -> tuple[str, ...]:
    """What runs gpufleet from a zipapp: the interpreter and the zipapp (its command comes after)."""
    return (check_path(python, "the Python interpreter"), check_path(zipapp, "the zipapp"))


def state_directory(path: str) -> str | None:
    """The `StateDirectory=` name for a directory under /var/lib (systemd creates it, owned by the
    unit's user, before starting it), else None: the directory must then exist."""
    parent, _, name = path.rpartition("/")
    return name if parent == "/var/lib" and name else None


def home_is_protected(home: str | None) -> bool:
    """Whether ProtectHome=yes would hide this home (None: a user not made yet, whom docs/deploy-agents.md
    makes a system user living in the data directory)."""
    if not home:
        return False
    return any(home == top or home.startswith(top + "/") for top in PROTECTED_HOMES)


def _exec(argv: Sequence[str]) -> str:
    return " ".join(check_word(word, "ExecStart's argument") for word in argv)


def _header(name: str, made_by: str) -> list[tuple[str, str] | str]:
    return [
        f"{name}: written by {made_by} (gpufleet {__version__}).",
        "Why each option is here, or is not: docs/deploy-agents.md. Settings go in the EnvironmentFile.",
        "",
    ]


def _unit_section(description: str) -> list[tuple[str, str] | str]:
    return [
        "[Unit]",
        ("Description", description),
        ("After", "network-online.target"),
        ("Wants", "network-online.target"),
        "five failed starts in five minutes and systemd stops trying until someone looks",
        ("StartLimitIntervalSec", "300"),
        ("StartLimitBurst", "5"),
        "",
    ]


def _install_section() -> list[tuple[str, str] | str]:
    return ["", "[Install]", ("WantedBy", "multi-user.target")]


def _raw(lines: list[tuple[str, str] | str]) -> str:
    """The lines of a unit: `(key, value)` pairs, `[Section]` headers, `# comments` and (empty) blank lines."""
    out = []
    for item in lines:
        if isinstance(item, str) and item.startswith("["):
            out.append(item)
        elif isinstance(item, str):
            out.append(f"# {item}" if item else "")
        else:
            out.append(f"{item[0]}={item[1]}")
    return "\n".join(out) + "\n"


@dataclass(frozen=True)
class ServerUnit:
    """`gpufleet-server.service`: the head node, as `user`, with `data_dir` its only writable place
    (and `read_write`: an images_dir or job_templates_dir outside it)."""

    program: tuple[str, ...]  # what runs gpufleet, e.g. ("/usr/local/bin/gpufleet",)
    user: str = SERVER_USER
    data_dir: str = SERVER_DATA_DIR
    env_file: str = SERVER_ENV_FILE
    read_write: tuple[str, ...] = ()
    protect_home: bool = True  # False where the user's home is under /home or /root (see home_is_protected)

    def argv(self) -> list[str]:
        return [*self.program, "server"]

    def render(self, made_by: str = "gpufleet server install-unit") -> str:
        """The unit's text. Raises InvalidInput for a path, user or word systemd would need quoting for."""
        check_user(self.user)
        data_dir = check_path(self.data_dir, "the data directory")
        writable = [data_dir, *(check_path(p, "a writable path") for p in self.read_write)]
        root = self.user == "root"
        lines = _header(SERVER_UNIT, made_by) + _unit_section("gpufleet head node")
        lines += [
            "[Service]",
            ("Type", "simple"),
            ("User", self.user),
            ("EnvironmentFile", "-" + check_path(self.env_file, "the environment file")),
            ("Environment", f"GPUFLEET_DATA_DIR={data_dir}"),
            ("ExecStart", _exec(self.argv())),
            ("Restart", "on-failure"),
            ("RestartSec", "5"),
            "an invalid setting: a restart would fail the same way",
            ("RestartPreventExitStatus", " ".join(map(str, SERVER_NO_RESTART))),
            ("TimeoutStopSec", "60"),
            "",
            "the file system is read-only but for the data directory (and --read-write paths)",
        ]
        name = state_directory(data_dir)
        if name is not None:
            lines += [("StateDirectory", name), ("StateDirectoryMode", "0700")]
        lines += [("ReadWritePaths", " ".join(dict.fromkeys(writable))), ("ProtectSystem", "strict")]
        lines += ["a /tmp of its own", ("PrivateTmp", "yes")]
        if self.protect_home:
            lines += ["no home directories: its user lives in the data directory", ("ProtectHome", "yes")]
        else:
            lines += ["no ProtectHome: this user's home holds the ~/.ssh that Ansible, ssh and rsync use"]
        lines += [
            "nothing it starts gains privileges through setuid programs",
            ("NoNewPrivileges", "yes"),
            ("ProtectKernelTunables", "yes"),
            ("ProtectKernelModules", "yes"),
            ("ProtectKernelLogs", "yes"),
            ("ProtectControlGroups", "yes"),
            ("ProtectHostname", "yes"),
            ("LockPersonality", "yes"),
            ("RestrictRealtime", "yes"),
        ]
        if root:
            lines += [
                "as root it builds software images (debootstrap, chroot): device nodes and setuid files in the",
                "image tree, so no PrivateDevices, RestrictSUIDSGID or ProtectClock",
            ]
        else:
            lines += [("PrivateDevices", "yes"), ("RestrictSUIDSGID", "yes"), ("ProtectClock", "yes")]
        return _raw(lines + _install_section())


@dataclass(frozen=True)
class AgentUnit:
    """`gpufleet-agent.service`: the node agent, as root, its credential in `state_dir`."""

    program: tuple[str, ...]  # ("/usr/local/bin/gpufleet",) or zipapp_program(...)
    state_dir: str = AGENT_STATE_DIR
    env_file: str = AGENT_ENV_FILE
    name: str | None = None  # the node's name; None: the agent's own default, the short hostname
    shiv_root: str | None = None  # where a zipapp unpacks itself (SHIV_ROOT); None: not a zipapp
    environment: Mapping[str, str] = field(default_factory=dict)  # more Environment= settings

    def argv(self) -> list[str]:
        argv = [*self.program, "agent", "--state-dir", check_path(self.state_dir, "the state directory")]
        if self.name is not None:
            argv += ["--name", check_node_name(self.name)]
        return argv

    def render(self, made_by: str = "gpufleet agent install-unit") -> str:
        """The unit's text. Raises InvalidInput for a path, name or word systemd would need quoting for."""
        state_dir = check_path(self.state_dir, "the state directory")
        environment = dict(self.environment)
        if self.shiv_root is not None:
            environment["SHIV_ROOT"] = check_path(self.shiv_root, "the zipapp's unpack directory")
        lines = _header(AGENT_UNIT, made_by) + _unit_section("gpufleet node agent")
        lines += [
            "[Service]",
            ("Type", "simple"),
            "root: it creates accounts, runs jobs as their users, runs podman and reads the GPUs",
            ("User", "root"),
            "GPUFLEET_SERVER, and GPUFLEET_JOIN_TOKEN until the node has joined (mode 0600)",
            ("EnvironmentFile", "-" + check_path(self.env_file, "the environment file")),
        ]
        lines += [("Environment", env_line(k, v)) for k, v in sorted(environment.items())]
        lines += [
            ("ExecStart", _exec(self.argv())),
            ("Restart", "on-failure"),
            ("RestartSec", "5"),
            "2: an invalid setting; 5: the head refused the node for good; 8: the head's CA is not the one",
            "the join token pins. A restart would be refused the same way (docs/agent.md)",
            ("RestartPreventExitStatus", " ".join(map(str, AGENT_NO_RESTART))),
            ("TimeoutStopSec", "60"),
        ]
        name = state_directory(state_dir)
        if name is not None:
            lines += [("StateDirectory", name), ("StateDirectoryMode", "0700")]
        lines += [
            "",
            "Jobs are its children and inherit all of this, as under slurmd: no task limit, RDMA's locked",
            "memory, many open files, and a job killed by the OOM killer leaves the agent running.",
            ("TasksMax", "infinity"),
            ("LimitMEMLOCK", "infinity"),
            ("LimitNOFILE", "131072"),
            ("LimitSTACK", "infinity"),
            ("OOMPolicy", "continue"),
            "/usr and /boot read-only: nothing it or its jobs do writes there (jobs never run as root)",
            ("ProtectSystem", "true"),
            "No more sandboxing (ProtectSystem=strict, ProtectHome, PrivateTmp, NoNewPrivileges, ...): jobs",
            "inherit it, and the agent writes /etc/passwd, /home, /sys/fs/cgroup and podman's storage,",
            "reads /dev/kmsg, loads modules for MIG and opens /dev/nvidia*. Why each: docs/deploy-agents.md.",
        ]
        return _raw(lines + _install_section())


def env_line(key: str, value: str) -> str:
    """`KEY=value` for an environment file or `Environment=`. Raises InvalidInput for a key that is not
    an upper-case name or a value needing quotes (spaces, quotes, `$`, `%`, `\\`)."""
    if not _ENV_KEY.fullmatch(key):
        raise InvalidInput(f"environment variable {key[:80]!r} is not an upper-case name")
    if not _ENV_VALUE.fullmatch(value) or len(value) > 4096:
        raise InvalidInput(f"the value of {key} may not hold spaces, quotes, '$', '%' or '\\'")
    return f"{key}={value}"


def agent_env(server: str, join_token: str | None, extra: Mapping[str, str] | None = None) -> str:
    """The agent's environment file (`/etc/gpufleet/agent.env`, mode 0600): the head's URL, and the join
    token, whose `:sha256:<hex>` suffix pins the head's CA. Raises InvalidInput."""
    if not server.startswith(("http://", "https://")):
        raise InvalidInput(f"the server URL {server[:200]!r} must start with http:// or https://")
    lines = [
        f"# {AGENT_ENV_FILE}: the agent's settings (gpufleet {__version__}), read by {AGENT_UNIT}.",
        "# The join token is needed only until the node has joined (STATE_DIR/credential.json); its",
        "# ':sha256:<hex>' suffix, on an https head, pins the head's CA.",
        env_line("GPUFLEET_SERVER", server.rstrip("/")),
    ]
    if join_token:
        lines.append(env_line("GPUFLEET_JOIN_TOKEN", join_token))
    lines += [env_line(k, v) for k, v in sorted((extra or {}).items())]
    return "\n".join(lines) + "\n"


def install(path: Path, text: str, *, force: bool = False, mode: int = 0o644) -> bool:
    """Write `text` to `path` atomically (a temporary file beside it, fsync, rename). Returns False when
    the file already holds exactly `text` (nothing written). Raises Conflict, changing nothing, when it
    holds something else and not `force`; InvalidInput when its directory does not exist."""
    if not path.parent.is_dir():
        raise InvalidInput(f"no such directory: {path.parent}")
    try:
        old: str | None = path.read_text(encoding="utf-8", errors="surrogateescape")
    except FileNotFoundError:
        old = None
    except OSError as exc:
        raise InvalidInput(f"cannot read {path}: {exc.strerror or exc}") from None
    if old == text:
        return False
    if old is not None and not force:
        raise Conflict(
            f"{path} exists and differs from the unit to install; nothing was changed. "
            f"Compare with --print | diff {path} -, then --force to replace it"
        )
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fchmod(fh.fileno(), mode)
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return True
