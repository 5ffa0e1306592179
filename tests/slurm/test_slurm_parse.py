"""Slurm's node output parsed (outputs captured from a real Slurm 22.05.8, tests/fixtures/slurm), and the
command runner: argument lists only, a timeout, SLURM_CONF passed, failures as clear errors."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

import pytest

from gpufleet.core.errors import InvalidInput, Unavailable
from gpufleet.jobs.slurm.commands import Completed, SlurmCommands
from gpufleet.jobs.slurm.nodes import SlurmNode, parse_sinfo_json, parse_sinfo_text
from tests.conftest import FIXTURES

SLURM = FIXTURES / "slurm"


def json_node(state: str) -> SlurmNode:
    (node,) = parse_sinfo_json((SLURM / f"sinfo-json-{state}.json").read_text())
    return node


def text_node(state: str) -> SlurmNode:
    (node,) = parse_sinfo_text((SLURM / f"sinfo-O-{state}.txt").read_text())
    return node


def test_idle_node_from_json() -> None:
    node = json_node("idle")
    assert (node.name, node.state, node.flags, node.reason) == ("vm", "idle", frozenset(), None)
    assert (node.gres, node.gres_used) == ("gpu:fake:4", "gpu:fake:0(IDX:N/A)")
    assert not node.drain
    assert node.display_state == "idle"


def test_gpufleet_drain_from_json() -> None:
    node = json_node("drained-gpufleet")
    assert node.state == "idle"
    assert node.flags == {"DRAIN"}
    assert node.reason == "gpufleet: xid 79 on GPU 2"
    assert node.reason_user == "root"
    assert node.reason_at is not None
    assert node.reason_at.tzinfo is UTC
    assert node.drained
    assert not node.draining
    assert node.own_drain
    assert node.display_state == "drained"


def test_human_drain_with_a_job_running_is_draining() -> None:
    node = json_node("draining-human")
    assert node.state == "mixed"
    assert node.flags == {"DRAIN"}
    assert node.draining
    assert not node.own_drain
    assert node.reason == "disk replacement, ticket 4711"
    assert node.gres_used == "gpu:fake:2(IDX:0-1)"
    assert node.display_state == "draining"


@pytest.mark.parametrize(
    ("fixture", "state", "flags", "display"),
    [
        ("mixed", "mixed", set(), "mixed"),
        ("alloc", "allocated", set(), "allocated"),
        ("drained-human", "idle", {"DRAIN"}, "drained"),
        ("down", "down", set(), "down"),
        ("not-responding", "idle", {"NOT_RESPONDING"}, "idle*"),
    ],
)
def test_states_from_json(fixture: str, state: str, flags: set[str], display: str) -> None:
    node = json_node(fixture)
    assert (node.state, node.flags, node.display_state) == (state, flags, display)


def test_down_with_gpufleet_reason_is_own() -> None:
    node = json_node("down")
    assert node.own_drain
    assert not node.drain


def test_unreachable_controller_is_unavailable() -> None:
    # Captured: sinfo --json exits 0 with no nodes and an error when slurmctld is not listening.
    with pytest.raises(Unavailable, match="Unspecified error"):
        parse_sinfo_json((SLURM / "sinfo-json-unreachable.json").read_text())


def test_newer_json_shapes() -> None:
    """23.02+: `state` is a list of upper-case words; 23.11+: timestamps are objects."""
    output = """{"errors": [], "nodes": [{"name": "gpu1", "state": ["IDLE", "DRAIN"],
        "reason": "gpufleet: ecc", "reason_set_by_user": "slurm",
        "reason_changed_at": {"set": true, "infinite": false, "number": 1796024294},
        "gres": "gpu:h100:8", "gres_used": "gpu:h100:0(IDX:N/A)"}]}"""
    (node,) = parse_sinfo_json(output)
    assert (node.state, node.flags, node.reason_user) == ("idle", {"DRAIN"}, "slurm")
    assert node.reason_at == datetime.fromtimestamp(1796024294, UTC)


def test_not_json() -> None:
    with pytest.raises(InvalidInput, match="did not print JSON"):
        parse_sinfo_json("sinfo: unrecognized option '--json'")


@pytest.mark.parametrize(
    ("fixture", "state", "flags", "reason", "user"),
    [
        ("idle", "idle", set(), None, None),
        ("mixed", "mixed", set(), None, None),
        ("drained-gpufleet", "idle", {"DRAIN"}, "gpufleet: xid 79 on GPU 2", "root"),
        ("draining-human", "allocated", {"DRAIN"}, "disk replacement | ticket 4711", "root"),
        ("down", "down", set(), "gpufleet: down test", "root"),
        ("not-responding", "idle", {"NOT_RESPONDING"}, None, None),
    ],
)
def test_states_from_text(fixture: str, state: str, flags: set[str], reason: str | None, user: str | None) -> None:
    node = text_node(fixture)
    assert (node.name, node.state, node.flags, node.reason, node.reason_user) == ("vm", state, flags, reason, user)
    assert node.gres == "gpu:fake:4"


def test_text_and_json_agree_on_a_drain() -> None:
    text, js = text_node("drained-gpufleet"), json_node("drained-gpufleet")
    assert (text.state, text.flags, text.reason, text.reason_user) == (js.state, js.flags, js.reason, js.reason_user)


def test_text_lists_a_node_once_and_rejects_short_lines() -> None:
    line = (SLURM / "sinfo-O-idle.txt").read_text()
    assert len(parse_sinfo_text(line + line)) == 1
    with pytest.raises(InvalidInput, match="expected 7"):
        parse_sinfo_text("vm|idle\n")


class FakeRunner:
    """Records each call; answers with a scripted Completed or raises a scripted exception."""

    def __init__(self, answer: Completed | BaseException) -> None:
        self.answer = answer
        self.calls: list[tuple[list[str], dict[str, str], float]] = []

    def __call__(self, argv: Sequence[str], *, env: Mapping[str, str], timeout_s: float) -> Completed:
        self.calls.append((list(argv), dict(env), timeout_s))
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer


def done(rc: int, stdout: str = "", stderr: str = "") -> Completed:
    return Completed(("x",), rc, stdout, stderr)


def test_runner_passes_argv_env_and_timeout() -> None:
    fake = FakeRunner(done(0, "out"))
    commands = SlurmCommands(
        "/etc/x/slurm.conf", timeout_s=3, runner=fake, base_env={"PATH": "/usr/bin", "SQUEUE_FORMAT": "%i"}
    )
    reason = 'reason=gpufleet: "quoted"; rm -rf / $(x)'
    assert commands.run(["scontrol", "update", "nodename=n1", "state=drain", reason]) == "out"
    ((argv, env, timeout),) = fake.calls
    assert argv == ["scontrol", "update", "nodename=n1", "state=drain", reason]  # one argument, as given
    assert env["SLURM_CONF"] == "/etc/x/slurm.conf"
    assert "SQUEUE_FORMAT" not in env  # a stray default would change the output we parse
    assert env["PATH"] == "/usr/bin"
    assert timeout == 3


def test_runner_refuses_a_shell_string() -> None:
    commands = SlurmCommands(runner=FakeRunner(done(0)))
    with pytest.raises(TypeError, match="never a shell string"):
        commands.run("scontrol update nodename=n1 state=resume")  # type: ignore[arg-type]


def test_refused_request_is_invalid_input_with_command_and_stderr() -> None:
    # Real message of Slurm 22.05.8 for an unknown node name.
    commands = SlurmCommands(runner=FakeRunner(done(1, stderr="slurm_update error: Invalid node name specified\n")))
    with pytest.raises(InvalidInput) as caught:
        commands.run(["scontrol", "update", "nodename=nosuch", "state=drain", "reason=gpufleet: x"])
    message = str(caught.value)
    assert "scontrol update nodename=nosuch state=drain 'reason=gpufleet: x'" in message
    assert "exited 1" in message
    assert "Invalid node name specified" in message


def test_unreachable_controller_is_unavailable_with_stderr() -> None:
    # Real message of Slurm 22.05.8 with slurmctld not listening.
    stderr = "slurm_update error: Unable to contact slurm controller (connect failure)\n"
    commands = SlurmCommands(runner=FakeRunner(done(1, stderr=stderr)))
    with pytest.raises(Unavailable, match=r"unreachable: scontrol update .*connect failure"):
        commands.run(["scontrol", "update", "nodename=vm", "state=resume"])


def test_missing_program_and_timeout_are_unavailable() -> None:
    with pytest.raises(Unavailable, match="sinfo not found"):
        SlurmCommands(runner=FakeRunner(FileNotFoundError())).run(["sinfo", "--json"])
    hang = FakeRunner(subprocess.TimeoutExpired(["sinfo"], 2))
    with pytest.raises(Unavailable, match="did not answer within 2 s"):
        SlurmCommands(runner=hang, timeout_s=2).run(["sinfo", "--json"])


def test_real_subprocess_runner(tmp_path: object) -> None:
    """The default runner runs a real program with an argument list (no shell: `;` stays literal)."""
    commands = SlurmCommands(base_env={"PATH": "/usr/bin:/bin"})
    assert commands.run(["echo", "a;", "b"]).strip() == "a; b"
    with pytest.raises(InvalidInput, match="exited 1"):
        commands.run(["false"])
    with pytest.raises(Unavailable, match="not found"):
        commands.run(["gpufleet-no-such-program"])
