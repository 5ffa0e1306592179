"""gpufleet-burnin's command line: what the built-in profiles ask for parses, bad usage is one line on
stderr with exit status 2 (never a traceback), and where the node lacks what a step needs the step is
skipped with the reason, exit status 0."""

from __future__ import annotations

import re
import subprocess
import sys
from typing import Any

import pytest

from gpufleet.agent.burnin import main as cli
from gpufleet.agent.burnin.common import Usage
from gpufleet.lifecycle.profiles import load_profiles
from gpufleet.protocol.burnin import GPU_KINDS, KINDS, parse_result


def test_every_builtin_profile_step_parses() -> None:
    profiles, problems = load_profiles()
    assert not problems
    assert profiles
    for profile in profiles.values():
        for step in profile.steps:
            argv = step.argv()
            assert argv[0] == "gpufleet-burnin"
            run = cli.parse_args(argv[1:])
            assert (run.kind, run.seconds) == (step.kind, step.seconds)


def test_every_kind_has_options_a_handler_and_a_unit() -> None:
    assert set(cli.OPTIONS) == set(KINDS) == set(cli.HANDLERS) == set(cli.UNITS)


def test_options_are_parsed_with_defaults() -> None:
    run = cli.parse_args(["gemm", "--seconds", "2.5", "--dtype=fp16"])
    assert (run.kind, run.seconds, run.options) == ("gemm", 2.5, {"dtype": "fp16", "size": 8192})
    assert cli.parse_args(["disk", "--size", "1G"]).options["size"] == 1 << 30
    assert cli.parse_args(["cpu-stress"]).seconds == 30.0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "a kind is needed"),
        (["burn"], "unknown kind 'burn'"),
        (["gemm", "--seconds", "x"], "--seconds: 'x' is not a number"),
        (["gemm", "--seconds", "0"], "--seconds must be above 0"),
        (["gemm", "--seconds", "nan"], "--seconds must be above 0"),
        (["gemm", "--seconds"], "--seconds needs a value"),
        (["gemm", "--dtype", "int8"], "--dtype: 'int8' is not one of bf16, fp16, fp32"),
        (["gemm", "--level", "1"], "gemm has no option --level; it takes --seconds, --dtype, --size"),
        (["dcgm", "--level", "5"], "--level: 5 is not from 1 to 4"),
        (["disk", "--size", "lots"], "--size: 'lots' is not a size"),
        (["gemm", "extra"], "unexpected argument 'extra'"),
    ],
)
def test_bad_usage(argv: list[str], message: str) -> None:
    with pytest.raises(Usage, match="^" + re.escape(message)):
        cli.parse_args(argv)


@pytest.mark.parametrize("argv", [["nope"], ["gemm", "--seconds", "-1"], ["network", "--streams", "99"]])
def test_bad_usage_exits_2_with_one_line(argv: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gpufleet.agent.burnin", *argv], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1
    assert done.stderr.startswith("gpufleet-burnin: ")
    assert "Traceback" not in done.stderr


def test_help_lists_every_kind(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(kind in out for kind in KINDS)


@pytest.mark.parametrize("kind", sorted(GPU_KINDS))
def test_gpu_kinds_skip_without_gpus(kind: str, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # what the agent sets for a job given no GPUs
    assert cli.main([kind, "--seconds", "1"]) == 0
    step = parse_result(capsys.readouterr().out)
    assert (step.kind, step.skipped, step.ok, step.unit) == (kind, True, True, cli.UNITS[kind])
    assert "no GPU visible" in step.detail


def test_gpu_kinds_skip_where_torch_sees_no_gpu(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: bench/device_burnin.py runs the GPU kinds")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert cli.main(["gemm", "--seconds", "1"]) == 0
    step = parse_result(capsys.readouterr().out)
    assert step.skipped
    assert step.detail.startswith("no GPU visible to torch")


def test_gpu_kinds_skip_without_torch(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch now raises ImportError
    assert cli.main(["gpu-memory", "--seconds", "1"]) == 0
    step = parse_result(capsys.readouterr().out)
    assert step.skipped
    assert "torch is not installed" in step.detail


def test_cpu_allreduce_without_torch_fails_naming_it(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)
    assert cli.main(["allreduce", "--seconds", "1"]) == 1
    step = parse_result(capsys.readouterr().out)
    assert not step.ok
    assert "torch is not installed" in step.detail


def test_dcgm_skips_without_dcgmi(monkeypatch: pytest.MonkeyPatch, tmp_path: Any, capsys: Any) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr("gpufleet.agent.burnin.common.shutil.which", lambda *a, **k: None)
    assert cli.main(["dcgm", "--seconds", "1"]) == 0
    step = parse_result(capsys.readouterr().out)
    assert step.skipped
    assert "DCGM is not installed" in step.detail


def test_network_alone_is_skipped(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert cli.main(["network", "--seconds", "1"]) == 0
    assert parse_result(capsys.readouterr().out).skipped


def test_an_unforeseen_error_still_prints_a_failed_result(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    def broken(run: object) -> None:
        raise RuntimeError("CUDA error: an illegal memory access was encountered\nmore")

    monkeypatch.setattr("gpufleet.agent.burnin.cpu.cpu_stress", broken)
    assert cli.main(["cpu-stress", "--seconds", "1"]) == 1
    captured = capsys.readouterr()
    step = parse_result(captured.out)
    assert not step.ok
    assert step.detail == "RuntimeError: CUDA error: an illegal memory access was encountered"
    assert "Traceback" in captured.err  # for whoever reads the job's error output
