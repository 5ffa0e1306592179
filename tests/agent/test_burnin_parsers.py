"""The burn-in runner's readers of tool output (stress-ng YAML, fio JSON, dcgmi diag JSON, ib_write_bw),
its sizes, its bounded result line, and the GPU step's checks, run on the CPU with torch.

The stress-ng and fio texts are cut from real runs (stress-ng 0.15.06, fio 3.33 on Debian 12); the
dcgmi documents follow the shapes DCGM 3 (NVVS's JSON writer) and DCGM 4 print; the real stress-ng
and fio runs are in test_burnin_real.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpufleet.agent.burnin import common, cpu, dcgm, disk, gpu, network
from gpufleet.agent.burnin.common import Usage
from gpufleet.protocol.burnin import MAX_RESULT_CHARS, RESULT_MARK, parse_result

STRESS_YAML = """---
system-info:
      stress-ng-version: 0.15.06
      run-by: root
      date-yyyy-mm-dd: 2026:12:06
      time-hh-mm-ss: 01:23:59
      cpus: 2

metrics:
    - stressor: cpu
      bogo-ops: 8366
      bogo-ops-per-second-usr-sys-time: 2099.093471
      bogo-ops-per-second-real-time: 4181.294805
      wall-clock-time: 2.000816
      user-time: 3.977552
      system-time: 0.007978
      cpu-usage-per-instance: 99.597633
      max-rss: 6468
    - stressor: vm
      bogo-ops: 347122
      bogo-ops-per-second-usr-sys-time: 88653.278342
      bogo-ops-per-second-real-time: 173318.231567
      wall-clock-time: 2.00
      user-time: 3.09
      system-time: 0.82

...
"""

FIO_JSON = {
    "fio version": "fio-3.33",
    "jobs": [
        {
            "jobname": "write",
            "error": 0,
            "read": {"io_bytes": 0, "bw_bytes": 0, "runtime": 0},
            "write": {"io_bytes": 8388608, "bw_bytes": 2097152000, "runtime": 4},
        },
        {
            "jobname": "read",
            "error": 0,
            "read": {"io_bytes": 8388608, "bw_bytes": 1398101333, "runtime": 6},
            "write": {"io_bytes": 0, "bw_bytes": 0, "runtime": 0},
        },
    ],
}


def _dcgm3(statuses: dict[str, list[str]]) -> dict[str, Any]:
    tests: list[Any] = []
    for name, results in statuses.items():
        entries: list[dict[str, Any]] = [{"gpu_ids": str(i), "status": s} for i, s in enumerate(results)]
        for entry in entries:
            if entry["status"] == "Fail":
                entry["warnings"] = [{"warning": "Detected 3 ECC errors", "error_id": 32}]
        tests += [{"name": name, "results": entries}, None]  # DCGM 3 really leaves nulls between tests
    return {"DCGM GPU Diagnostic": {"test_categories": [{"category": "Hardware", "tests": tests}], "version": "3.3.9"}}


# ---- stress-ng ----


def test_stress_yaml_sums_real_time_rates() -> None:
    figures = cpu.parse_stress_yaml(STRESS_YAML)
    assert figures.ops_per_s == pytest.approx(4181.294805 + 173318.231567)
    assert figures.bogo_ops == 8366 + 347122
    assert figures.stressors["cpu"]["wall-clock-time"] == pytest.approx(2.000816)


@pytest.mark.parametrize("text", ["", "---\nsystem-info:\n  cpus: 2\n", "metrics: [1, 2]", "{{{"])
def test_stress_yaml_without_metrics_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="stress-ng"):
        cpu.parse_stress_yaml(text)


def test_stress_failure_lines() -> None:
    output = (
        "stress-ng: info:  [1659] dispatching hogs: 2 vm\n"
        "stress-ng: fail:  [1660] vm: detected 1 bit errors while stressing memory\n"
        "stress-ng: info:  [1659] failed: 1: vm (1)\n"
    )
    assert cpu.failure_lines(output) == ["stress-ng: fail:  [1660] vm: detected 1 bit errors while stressing memory"]


def test_vm_bytes_percent_of_available_or_size() -> None:
    assert cpu.vm_bytes("50%", 8 << 30) == 4 << 30
    assert cpu.vm_bytes("256M", 8 << 30) == 256 << 20
    for bad in ("0%", "99%", "x%", "lots"):
        with pytest.raises(Usage, match="--vm-bytes"):
            cpu.vm_bytes(bad, 8 << 30)


def test_available_memory_keeps_the_cgroup_limit(tmp_path: Path) -> None:
    proc, cgroup = tmp_path / "proc", tmp_path / "cgroup"
    (proc / "self").mkdir(parents=True)
    (proc / "meminfo").write_text("MemTotal: 16384000 kB\nMemAvailable: 8192000 kB\n")
    (proc / "self" / "cgroup").write_text("0::/gpufleet/job-7\n")
    job = cgroup / "gpufleet" / "job-7"
    job.mkdir(parents=True)
    (job / "memory.max").write_text("max\n")
    (cgroup / "gpufleet" / "memory.max").write_text(str(3 << 30))
    (cgroup / "gpufleet" / "memory.current").write_text(str(1 << 30))
    assert cpu.available_memory(proc, cgroup) == 2 << 30  # the parent's room, under MemAvailable
    (cgroup / "gpufleet" / "memory.max").write_text("max\n")
    assert cpu.available_memory(proc, cgroup) == 8192000 * 1024


def test_stress_ng_failure_fails_the_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stress-ng that reports a verification failure (exit status 2): ok=False, the line quoted."""
    fake = tmp_path / "stress-ng"
    fake.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = --version ]; then echo "stress-ng, version 0.15.06"; exit 0; fi\n'
        'while [ $# -gt 0 ]; do if [ "$1" = --yaml ]; then shift; out=$1; fi; shift; done\n'
        f"cat > \"$out\" <<'EOF'\n{STRESS_YAML}EOF\n"
        'echo "stress-ng: fail:  [9] vm: detected 12 bit errors while stressing memory" >&2\n'
        "exit 2\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")  # the fake first; sh's cat after it
    step = cpu.memory_stress(common.Run("memory-stress", 1, {"workers": 1, "vm-bytes": "8M"}))
    assert not step.ok
    assert "one or more stressors failed" in step.detail
    assert "detected 12 bit errors" in step.detail
    assert step.value > 0  # what it measured is still reported


def test_missing_stress_ng_names_the_tool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr("gpufleet.agent.burnin.common.shutil.which", lambda *a, **k: None)
    step = cpu.cpu_stress(common.Run("cpu-stress", 1, {"workers": 0}))
    assert (step.ok, step.skipped) == (False, False)
    assert "stress-ng is not installed" in step.detail


# ---- fio ----


def test_fio_json_by_job() -> None:
    text = "fio: some warning before the report\n" + json.dumps(FIO_JSON)
    phases = disk.parse_fio_json(text)
    assert phases["write"].bytes_per_s == 2097152000
    assert phases["read"].bytes_per_s == 1398101333
    assert phases["read"].io_bytes == 8388608


@pytest.mark.parametrize("text", ["", "no json", '{"jobs": []}', "{broken"])
def test_fio_json_refused(text: str) -> None:
    with pytest.raises(ValueError, match="fio"):
        disk.parse_fio_json(text)


def test_fio_argv_direct_and_buffered() -> None:
    options = {"bs": "1M", "ioengine": "psync", "iodepth": 1}
    direct = disk.fio_argv("fio", "/d/f", 1 << 20, 10, options, direct=True)
    assert "--direct=1" in direct
    assert "--time_based=1" in direct
    assert "--runtime=5000ms" in direct
    assert direct.index("--name=write") < direct.index("--name=read") < direct.index("--stonewall")
    buffered = disk.fio_argv("fio", "/d/f", 1 << 20, 10, options, direct=False)
    assert "--direct=0" in buffered
    assert "--time_based=1" not in buffered
    assert "--invalidate=1" in buffered


def test_fio_refusing_direct_io_is_retried_buffered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file system without O_DIRECT: fio fails with EINVAL, the step measures buffered and says so."""
    report = tmp_path / "report.json"
    report.write_text(json.dumps(FIO_JSON))
    fake = tmp_path / "bin" / "fio"
    fake.parent.mkdir()
    fake.write_text(
        "#!/bin/sh\n"
        'case "$*" in *--version*) echo fio-3.33; exit 0;; esac\n'
        'case "$*" in *--direct=1*) echo "fio: looks like your file system does not support direct=1" >&2;'
        ' echo \'{"jobs": [{"jobname": "write", "error": 22, "write": {}}]}\'; exit 1;; esac\n'
        f'cat "{report}"\n'
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:/usr/bin:/bin")
    work = tmp_path / "work"
    work.mkdir()
    options = {"dir": str(work), "size": 1 << 20, "bs": "1M", "ioengine": "psync", "iodepth": 1}
    step = disk.disk(common.Run("disk", 1, options))
    assert step.ok, step.detail
    assert step.value == pytest.approx(1398.101333)
    assert step.evidence["direct"] is False
    assert "refused direct I/O" in step.detail
    assert step.evidence["attempts"][0].startswith("direct=1: fio job error(s) {'write': 22}")
    assert list(work.iterdir()) == []


def test_fio_error_fails_the_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "fio"
    fake.write_text('#!/bin/sh\necho "fio: io_u error on file: Input/output error: write offset=0" >&2\nexit 1\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    options = {"dir": str(tmp_path), "size": 1 << 20, "bs": "1M", "ioengine": "psync", "iodepth": 1}
    step = disk.disk(common.Run("disk", 1, options))
    assert not step.ok
    assert "Input/output error" in step.detail


# ---- dcgmi diag ----


def test_dcgm3_all_passed() -> None:
    diag = dcgm.parse_diag_json(json.dumps(_dcgm3({"Denylist": ["PASS"], "Memory": ["Pass", "Pass", "Skip"]})))
    step = dcgm._verdict("dcgm", diag, "", {})
    assert (step.ok, step.value) == (True, 1.0)
    assert step.evidence["passed"] == 3
    assert step.evidence["skipped"] == 1


def test_dcgm3_failure_names_test_and_gpu() -> None:
    text = "WARNING: something before the JSON\n" + json.dumps(
        _dcgm3({"Denylist": ["Pass"], "Memory": ["Pass", "Fail"], "PCIe": ["Warn", "Pass"]})
    )
    step = dcgm._verdict("dcgm", dcgm.parse_diag_json(text), text, {})
    assert not step.ok
    assert step.value == pytest.approx(4 / 5)
    assert "Memory (GPU 1): Detected 3 ECC errors" in step.detail


def test_dcgm4_entity_results() -> None:
    document = {
        "DCGM Diagnostic": {
            "version": "4.2.3",
            "tests": [
                {"name": "software", "results": [{"entity_group": "GPU", "entity_id": 0, "status": "Pass"}]},
                {"name": "memory", "results": [{"entity_group": "GPU", "entity_id": 0, "status": "Skip"}]},
            ],
        }
    }
    diag = dcgm.parse_diag_json(json.dumps(document))
    assert diag.version == "4.2.3"
    assert diag.tests == {"software": ["pass"], "memory": ["skip"]}


def test_dcgm_host_engine_unreachable_fails() -> None:
    said = "Error: unable to establish a connection to the specified host: localhost\n"
    with pytest.raises(ValueError, match="no JSON"):
        dcgm.parse_diag_json(said)
    step = dcgm._verdict("dcgm", dcgm.Diag(errors=["dcgmi printed no JSON report"]), said, {})
    assert not step.ok
    assert "ran no test" in step.detail


def test_dcgm_unsupported_gpu_is_skipped() -> None:
    said = 'Error: Unable to run diagnostic on unsupported GPU 0.\n{"DCGM GPU Diagnostic": {"version": "4.2.3"}}'
    step = dcgm._verdict("dcgm", dcgm.parse_diag_json(said), said, {})
    assert step.skipped
    assert "unsupported GPU" in step.detail


def test_dcgm_gpu_ids_from_indexes() -> None:
    assert dcgm.gpu_ids({"CUDA_VISIBLE_DEVICES": "0,3"}) == (["0", "3"], "CUDA_VISIBLE_DEVICES")
    assert dcgm.gpu_ids({})[0] is None


def test_dcgm_runs_dcgmi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The step end to end with a dcgmi that prints a failing report (exit status 226, as dcgmi does)."""
    fake = tmp_path / "dcgmi"
    report = json.dumps(_dcgm3({"Denylist": ["Pass"], "Memory": ["Fail"]}))
    fake.write_text(f"#!/bin/sh\necho \"$*\" > {tmp_path / 'argv'}\ncat <<'EOF'\n{report}\nEOF\nexit 226\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    step = dcgm.dcgm(common.Run("dcgm", 1, {"level": 2}))
    assert not step.ok
    assert step.value == 0.5
    assert (tmp_path / "argv").read_text().split() == ["diag", "-r", "2", "-j", "-i", "1"]


# ---- ib_write_bw ----

IB_WRITE_BW = """
************************************
* Waiting for client to connect... *
************************************
---------------------------------------------------------------------------------------
                    RDMA_Write BW Test
 Dual-port       : OFF          Device         : mlx5_0
 Number of qps   : 1            Transport type : IB
---------------------------------------------------------------------------------------
 #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]
 65536      3561000          0.00               373.41              0.712226
---------------------------------------------------------------------------------------
"""


def test_ib_write_bw_result_row() -> None:
    figures = network.parse_ib_write_bw(IB_WRITE_BW)
    assert figures["average_gbit_s"] == pytest.approx(373.41)
    assert figures["bytes"] == 65536


def test_ib_write_bw_without_result_is_refused() -> None:
    with pytest.raises(ValueError, match="no result row"):
        network.parse_ib_write_bw("Couldn't connect to 10.0.0.1:18515\n")


def test_ib_device_needs_an_active_port_and_the_tool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for device, state in (("mlx5_0", "1: DOWN"), ("mlx5_1", "4: ACTIVE")):
        (tmp_path / device / "ports" / "1").mkdir(parents=True)
        (tmp_path / device / "ports" / "1" / "state").write_text(state + "\n")
    monkeypatch.setattr(network, "find_tool", lambda name: "/usr/bin/ib_write_bw")
    assert network.ib_device(None, tmp_path) == "mlx5_1"
    assert network.ib_device("mlx5_0", tmp_path) is None
    monkeypatch.setattr(network, "find_tool", lambda name: None)
    assert network.ib_device(None, tmp_path) is None


# ---- sizes, rendezvous, the result line ----


def test_sizes() -> None:
    assert common.parse_size("4096") == 4096
    assert common.parse_size("256M") == 256 << 20
    assert common.parse_size("1GiB") == 1 << 30
    for bad in ("", "0", "-1M", "12Q", "M"):
        with pytest.raises(ValueError, match=r"size|zero"):
            common.parse_size(bad)


def test_rendezvous_from_the_agents_variables() -> None:
    env = {"WORLD_SIZE": "2", "NODE_RANK": "1", "MASTER_ADDR": "10.1.0.5", "MASTER_PORT": "29400"}
    assert common.rendezvous(env) == common.Rendezvous(2, 1, "10.1.0.5", 29400)
    assert common.rendezvous({}) == common.Rendezvous(1, 0, "127.0.0.1", 29500)
    for bad in ({"WORLD_SIZE": "two"}, {"WORLD_SIZE": "2", "NODE_RANK": "2"}, {"MASTER_PORT": "70000"}):
        with pytest.raises(Usage):
            common.rendezvous(bad)


def test_evidence_is_bounded_and_the_line_fits(capsys: pytest.CaptureFixture[str]) -> None:
    huge = {"log": "x" * 100_000, "rows": list(range(1000)), "deep": {"a": {"b": {"c": {"d": {"e": 1}}}}}}
    step = common.result("disk", 1.5, "MB/s", evidence=huge, detail="d" * 5000)
    assert len(step.evidence["log"]) == common.MAX_TEXT
    assert len(step.evidence["rows"]) == common.MAX_ITEMS + 1
    assert len(step.detail) == common.MAX_DETAIL
    many = {f"k{i}": "y" * 390 for i in range(60)}
    nested = common.result("disk", 1.5, "MB/s", evidence={f"g{i}": many for i in range(60)})
    assert common.emit(nested) == 0
    line = capsys.readouterr().out
    assert len(line) - len(RESULT_MARK) - 1 <= MAX_RESULT_CHARS
    back = parse_result(line)
    assert back.value == 1.5
    assert back.ok


def test_exit_status_follows_the_verdict(capsys: pytest.CaptureFixture[str]) -> None:
    assert common.emit(common.result("gemm", 500, "TFLOPS")) == 0
    assert common.emit(common.skipped("gemm", "TFLOPS", "no GPU")) == 0
    assert common.emit(common.failed("gemm", "TFLOPS", "GPU 3: checksum mismatch")) == 1
    assert len(capsys.readouterr().out.splitlines()) == 3


# ---- the GPU step's checks, on the CPU ----


class _FaultyTorch:
    """torch, except that every product after the first `good` comes back with one element off."""

    def __init__(self, torch: Any, good: int) -> None:
        self._torch, self._good, self.calls = torch, good, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._torch, name)

    def matmul(self, a: Any, b: Any, out: Any = None) -> Any:
        self.calls += 1
        product = self._torch.matmul(a, b, out=out)
        if self.calls > self._good:
            product[3, 5] += 1000
        return product


@pytest.fixture(scope="module")
def torch() -> Any:
    return pytest.importorskip("torch", reason="torch is not installed (the burnin extra)")


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_reference_check_passes_on_a_sound_device(torch: Any, dtype: str) -> None:
    assert gpu.reference_error(torch, torch.device("cpu"), dtype) < gpu.TOLERANCE[dtype]


def test_burn_on_a_sound_device(torch: Any) -> None:
    figures = gpu.burn(torch, torch.device("cpu"), "fp32", 64, 0.05)
    assert figures.matmuls >= 1
    assert figures.tflops > 0
    assert figures.drifted == 0
    assert figures.fault("fp32") == ""


def test_burn_catches_a_product_that_changes(torch: Any) -> None:
    faulty = _FaultyTorch(torch, good=4)  # the first product and the two warm-ups are right
    figures = gpu.burn(faulty, torch.device("cpu"), "fp32", 64, 0.05)
    assert figures.drifted >= 1
    assert "GPU 0: checksum mismatch" in figures.fault("fp32")


def test_reference_check_catches_wrong_arithmetic(torch: Any) -> None:
    assert gpu.reference_error(_FaultyTorch(torch, good=0), torch.device("cpu"), "bf16") > gpu.TOLERANCE["bf16"]


def test_throttle_reasons_fail_thermal_only_for_faults() -> None:
    class Nvml:
        class NVMLError(Exception):
            pass

        def __init__(self, reasons: int) -> None:
            self.reasons = reasons

        def nvmlDeviceGetTemperature(self, handle: object, sensor: int) -> int:
            return 71

        def nvmlDeviceGetCurrentClocksEventReasons(self, handle: object) -> int:
            return self.reasons

        def nvmlDeviceGetClockInfo(self, handle: object, clock: int) -> int:
            return 1980

        def nvmlDeviceGetPowerUsage(self, handle: object) -> int:
            return 650_000

    capped = gpu.Heat()
    gpu.sample(Nvml(0x4), None, capped)  # a power cap: not a fault
    assert capped.failing_at == {}
    assert capped.max_c == 71
    assert capped.power_w == [650.0]
    hot = gpu.Heat()
    gpu.sample(Nvml(0x40 | 0x4), None, hot)
    assert hot.failing_at == {"HW thermal slowdown": 71.0}
    assert gpu.reason_names(0x44 | 0x1000) == ["HW thermal slowdown", "SW power cap", "0x1000"]
