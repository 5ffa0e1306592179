"""gpufleet slurm config, in process, with the head's answer rendered from inventory data: printing, the
--dry-run diff, --write with its backups, and refusals that leave both files as they were.
(tests/e2e/test_slurm_config_cli.py runs the same command against a real head.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gpufleet.api.routers.slurm import config_out
from gpufleet.cli import slurm as slurm_cli
from gpufleet.cli.app import app
from gpufleet.core.errors import InvalidInput
from gpufleet.jobs.slurm.config import InventoryGpu, InventoryNode, render

BEGIN, END = "# BEGIN gpufleet managed nodes", "# END gpufleet managed nodes"
NODES = [
    InventoryNode(
        f"gpu{i:03}",
        reported=True,
        category="h200",
        hostname=f"gpu{i:03}",
        cpus=224,
        memory_mib=2063937,
        gpus=tuple(InventoryGpu(j, "NVIDIA H200") for j in range(8)),
        expected_gpus=8,
    )
    for i in range(1, 5)
]
SLURM_CONF = f"""ClusterName=prod
GresTypes=gpu
{BEGIN}
NodeName=gpu[001-002] CPUs=224 RealMemory=2063360 Gres=gpu:h200:8
{END}
# the admin's own
PartitionName=debug Nodes=gpu001 MaxTime=30
"""


@pytest.fixture
def head(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[dict[str, Any]]:
    """The head's answer (as the API renders it), and the calls made for it."""
    monkeypatch.setenv("GPUFLEET_CLIENT_CONFIG", str(tmp_path / "client.toml"))
    calls: list[dict[str, Any]] = []

    def fetch(client: object, default_partition: str) -> dict[str, Any]:
        calls.append({"default_partition": default_partition})
        rendered = render([*NODES, InventoryNode("new01", reported=False)], default_partition=default_partition)
        return config_out(rendered).model_dump()

    monkeypatch.setattr(slurm_cli, "fetch", fetch)
    return calls


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "slurm.conf").write_text(SLURM_CONF)
    (etc / "gres.conf").write_text("AutoDetect=nvml\n")
    return etc / "slurm.conf", etc / "gres.conf"


def run(*args: str) -> Any:
    return CliRunner().invoke(app, ["slurm", "config", *args])


def test_prints_the_rendered_text_by_default(head: list[dict[str, Any]]) -> None:
    result = run()
    assert result.exit_code == 0, result.output
    assert f"{BEGIN}\n# Rendered by gpufleet" in result.stdout
    assert "NodeName=gpu[001-004] CPUs=224 RealMemory=2063360 Gres=gpu:h200:8\n" in result.stdout
    assert f"PartitionName=h200 Nodes=gpu[001-004] State=UP\n{END}\n" in result.stdout
    assert "NodeName=gpu[001-004] Name=gpu Type=h200 File=/dev/nvidia[0-7]\n" in result.stdout
    assert "skipped new01: no inventory reported yet" in result.stderr
    assert head == [{"default_partition": "all"}]


def test_json_for_scripts(head: list[dict[str, Any]]) -> None:
    result = run("-o", "json", "--default-partition", "batch")
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    assert body["partitions"] == ["batch", "h200"]
    assert head == [{"default_partition": "batch"}]


def test_dry_run_shows_the_diff_and_changes_nothing(head: list[dict[str, Any]], files: tuple[Path, Path]) -> None:
    slurm_conf, gres_conf = files
    result = run("--slurm-conf", str(slurm_conf), "--dry-run")
    assert result.exit_code == 0, result.output
    assert f"--- {slurm_conf}\n+++ {slurm_conf} (gpufleet)\n" in result.stdout
    assert "\n-NodeName=gpu[001-002] CPUs=224 RealMemory=2063360 Gres=gpu:h200:8\n" in result.stdout
    assert "\n+NodeName=gpu[001-004] CPUs=224 RealMemory=2063360 Gres=gpu:h200:8\n" in result.stdout
    assert f"--- {gres_conf}\n" in result.stdout  # gres.conf is found beside slurm.conf
    assert "\n-AutoDetect=nvml\n" in result.stdout
    assert slurm_conf.read_text() == SLURM_CONF
    assert gres_conf.read_text() == "AutoDetect=nvml\n"


def test_write_updates_the_block_keeps_the_rest_and_backs_up(
    head: list[dict[str, Any]], files: tuple[Path, Path]
) -> None:
    slurm_conf, gres_conf = files
    result = run("--slurm-conf", str(slurm_conf), "--write")
    assert result.exit_code == 0, result.output
    assert f"{slurm_conf}: updated (previous version in {slurm_conf}.bak)" in result.stdout
    assert f"{gres_conf}: updated (previous version in {gres_conf}.bak)" in result.stdout
    assert "restart slurmctld" in result.stdout
    text = slurm_conf.read_text()
    assert text.startswith(f"ClusterName=prod\nGresTypes=gpu\n{BEGIN}\n# Rendered by gpufleet")
    assert text.endswith(f"{END}\n# the admin's own\nPartitionName=debug Nodes=gpu001 MaxTime=30\n")
    assert "NodeName=gpu[001-004]" in text
    assert gres_conf.read_text().endswith("NodeName=gpu[001-004] Name=gpu Type=h200 File=/dev/nvidia[0-7]\n")
    assert Path(f"{slurm_conf}.bak").read_text() == SLURM_CONF
    assert Path(f"{gres_conf}.bak").read_text() == "AutoDetect=nvml\n"
    again = run("--slurm-conf", str(slurm_conf), "--write")  # nothing left to change: no new backup
    assert again.exit_code == 0, again.output
    assert f"{slurm_conf}: no change" in again.stdout
    assert "restart" not in again.stdout
    assert Path(f"{slurm_conf}.bak").read_text() == SLURM_CONF
    dry = run("--slurm-conf", str(slurm_conf), "--dry-run")
    assert dry.stdout == f"{slurm_conf}: no change\n{gres_conf}: no change\n"


def test_write_json_and_a_new_gres_conf(head: list[dict[str, Any]], tmp_path: Path) -> None:
    gres_conf = tmp_path / "gres.conf"
    result = run("--gres-conf", str(gres_conf), "--write", "-o", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["files"] == [{"path": str(gres_conf), "changed": True, "backup": None}]
    assert gres_conf.read_text().startswith("# gres.conf generated by gpufleet")


def test_a_slurm_conf_without_markers_gets_the_block_at_its_end(head: list[dict[str, Any]], tmp_path: Path) -> None:
    slurm_conf = tmp_path / "slurm.conf"
    slurm_conf.write_text("ClusterName=prod\nGresTypes=gpu\n")
    result = run("--slurm-conf", str(slurm_conf), "--write")
    assert result.exit_code == 0, result.output
    assert slurm_conf.read_text().startswith(f"ClusterName=prod\nGresTypes=gpu\n\n{BEGIN}\n")


@pytest.mark.parametrize(
    ("conf", "message"),
    [
        (
            "NodeName=gpu[003-010] CPUs=8\n",
            "slurm.conf already defines node(s) gpu[003-004] (line 1) outside the gpufleet block",
        ),
        ("nodename=gpu004\n", "node(s) gpu004 (line 1)"),  # Slurm's keys are case-insensitive
        ("PartitionName=h200 Nodes=ALL\n", "partition h200 (line 1)"),
        (f"{BEGIN}\nx\n", "expected one '# BEGIN gpufleet managed nodes' and one"),
    ],
)
def test_a_conflicting_slurm_conf_is_refused_and_nothing_written(
    head: list[dict[str, Any]], tmp_path: Path, conf: str, message: str
) -> None:
    slurm_conf = tmp_path / "slurm.conf"
    slurm_conf.write_text(conf)
    result = run("--slurm-conf", str(slurm_conf), "--write")
    assert isinstance(result.exception, InvalidInput)
    assert message in str(result.exception)
    assert slurm_conf.read_text() == conf
    assert not (tmp_path / "gres.conf").exists()
    assert not (tmp_path / "slurm.conf.bak").exists()


def test_definitions_outside_the_block_that_do_not_collide_are_fine_and_noted(
    head: list[dict[str, Any]], tmp_path: Path
) -> None:
    slurm_conf = tmp_path / "slurm.conf"
    conf = (
        "NodeName=DEFAULT State=UNKNOWN\nPartitionName=DEFAULT MaxTime=1-0\n"
        "NodeName=cpu[01-02] CPUs=8  # not gpufleet's\nPartitionName=cpu Nodes=cpu[01-02] Default=YES\n"
        "#NodeName=gpu001 commented out\n"
    )
    slurm_conf.write_text(conf)
    result = run("--slurm-conf", str(slurm_conf), "--dry-run")
    assert result.exit_code == 0, result.output
    assert "warning: slurm.conf also makes partition cpu the default (line 4)" in result.stderr
    assert "warning: slurm.conf has no GresTypes=gpu line" in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--dry-run", "--write", "--gres-conf", "x"], "exclude each other"),
        (["--dry-run"], "need --slurm-conf"),
        (["--slurm-conf", "x"], "add one of them"),
        (["--slurm-conf", "/nonexistent/slurm.conf", "--dry-run"], "/nonexistent/slurm.conf: no such file"),
        (["--gres-conf", "/nonexistent/dir/gres.conf", "--dry-run"], "no such file"),
        (["--slurm-conf", "/", "--dry-run"], "is a directory"),
        (["--slurm-conf", "/etc/x.conf", "--gres-conf", "/etc/../etc/x.conf", "--write"], "name the same file"),
    ],
)
def test_bad_options_and_paths_are_clear_errors_before_the_head_is_asked(
    head: list[dict[str, Any]], args: list[str], message: str
) -> None:
    result = run(*args)
    assert isinstance(result.exception, InvalidInput)
    assert message in str(result.exception)
    assert head == []


def test_an_unreadable_slurm_conf_is_a_clear_error(head: list[dict[str, Any]], tmp_path: Path) -> None:
    slurm_conf = tmp_path / "slurm.conf"
    slurm_conf.mkdir()
    result = run("--slurm-conf", str(slurm_conf), "--write")
    assert isinstance(result.exception, InvalidInput)
    assert "is a directory" in str(result.exception)


def test_definitions_parser() -> None:
    text = f"NodeName=a[1-2] X=1\n{BEGIN}\nNodeName=b\n{END}\nPartitionName=p Nodes=a1 default=yes\nNodeName=[bad\n"
    block = (1, 3)
    found = slurm_cli.definitions(text, block)
    assert [(d.key, d.names, d.line, d.default) for d in found] == [
        ("nodename", ("a1", "a2"), 1, False),
        ("partitionname", ("p",), 5, True),
    ]
