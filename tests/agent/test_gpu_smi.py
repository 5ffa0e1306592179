"""Parsing `nvidia-smi -q -x` from real machines, and running it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from gpufleet.agent.gpu.nvml import NvmlReader
from gpufleet.agent.gpu.ports import GpuReadError
from gpufleet.agent.gpu.smi import (
    COMMAND,
    TIMEOUT_S,
    NvidiaSmiReader,
    UnsafeXmlError,
    parse_nvidia_smi_xml,
    run_program,
)


def read_fixture(fixtures_dir: Path, name: str) -> str:
    return (fixtures_dir / name).read_text()


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("h200/nvidia-smi-q.xml", (1, "NVIDIA H200", 143771, "580.159.04", "13.0")),
        ("h200/nvidia-smi-q-after.xml", (1, "NVIDIA H200", 143771, "580.159.04", "13.0")),
        ("nvidia-smi/a100-sxm4-v12.xml", (1, "NVIDIA A100-SXM4-80GB", 81920, "535.54.03", "12.2")),
        ("nvidia-smi/dual_a5000-v13.xml", (2, "NVIDIA RTX A5000", 24564, "590.44.01", "13.1")),
        ("nvidia-smi/gtx-1660-ti.xml", (1, "Graphics Device", 5912, "418.43", "10.1")),
        ("nvidia-smi/quadro-p400.xml", (1, "Quadro P400", 1998, "418.43", "10.1")),
        ("nvidia-smi/tesla-t4.xml", (1, "Tesla T4", 15360, "515.105.01", "11.7")),
    ],
)
def test_parses_every_fixture(fixtures_dir: Path, name: str, expected: tuple[int, str, int, str, str]) -> None:
    count, model, memory_mib, driver, cuda = expected

    gpus = parse_nvidia_smi_xml(read_fixture(fixtures_dir, name))

    assert len(gpus) == count
    assert [gpu.index for gpu in gpus] == list(range(count))
    for gpu in gpus:
        assert (gpu.model, gpu.memory_total_mib, gpu.driver_version, gpu.cuda_version) == (
            model,
            memory_mib,
            driver,
            cuda,
        )
        assert gpu.uuid.startswith("GPU-")


def test_h200_fields(fixtures_dir: Path) -> None:
    [gpu] = parse_nvidia_smi_xml(read_fixture(fixtures_dir, "h200/nvidia-smi-q.xml"))

    assert gpu.uuid == "GPU-aabfc81a-ba71-cf6e-8540-cec21d30d711"
    assert gpu.serial == "1653724049708"
    assert gpu.pci_bus_id == "00000000:00:06.0"
    assert gpu.vbios_version == "96.00.A5.00.1A"
    assert gpu.mig_mode == "disabled"
    assert gpu.ecc_mode == "enabled"
    # Newer drivers put the limit in <gpu_power_readings><current_power_limit>.
    assert gpu.power_limit_w == 700.0
    # This XML does not carry the compute capability.
    assert gpu.compute_capability is None


def test_h200_xml_agrees_with_the_nvml_recording(fixtures_dir: Path, recorded_nvml: Callable[..., Any]) -> None:
    [smi] = parse_nvidia_smi_xml(read_fixture(fixtures_dir, "h200/nvidia-smi-q.xml"))
    [nvml] = NvmlReader(recorded_nvml()).read()

    assert smi.uuid == nvml.uuid
    assert smi.serial == nvml.serial
    assert smi.pci_bus_id == nvml.pci_bus_id
    assert abs(smi.memory_total_mib - nvml.memory_total_mib) <= 0.01 * nvml.memory_total_mib
    assert smi.driver_version == nvml.driver_version
    assert smi.cuda_version == nvml.cuda_version
    assert (smi.model, smi.vbios_version, smi.mig_mode, smi.ecc_mode, smi.power_limit_w) == (
        nvml.model,
        nvml.vbios_version,
        nvml.mig_mode,
        nvml.ecc_mode,
        nvml.power_limit_w,
    )


def test_a100_with_mig_reads_the_whole_gpu_not_its_slices(fixtures_dir: Path) -> None:
    [gpu] = parse_nvidia_smi_xml(read_fixture(fixtures_dir, "nvidia-smi/a100-sxm4-v12.xml"))

    assert gpu.mig_mode == "enabled"
    assert gpu.memory_total_mib == 81920  # each MIG device's own fb_memory_usage says 19968
    assert gpu.pci_bus_id == "00000000:01:00.0"
    assert gpu.power_limit_w == 500.0


def test_dual_gpus_are_numbered_in_document_order(fixtures_dir: Path) -> None:
    # Their minor numbers are 1 and 0: the index follows NVML's order, not /dev/nvidiaN.
    first, second = parse_nvidia_smi_xml(read_fixture(fixtures_dir, "nvidia-smi/dual_a5000-v13.xml"))

    assert (first.index, first.uuid, first.pci_bus_id) == (
        0,
        "GPU-12345678-aaaa-bbbb-cccc-0123456789ab",
        "00000000:81:00.0",
    )
    assert (second.index, second.uuid, second.pci_bus_id) == (
        1,
        "GPU-12345678-aaaa-bbbb-cccc-0123456789cd",
        "00000000:c1:00.0",
    )
    assert first.mig_mode is None
    assert first.ecc_mode == "disabled"


def test_not_applicable_fields_are_none(fixtures_dir: Path) -> None:
    [gtx] = parse_nvidia_smi_xml(read_fixture(fixtures_dir, "nvidia-smi/gtx-1660-ti.xml"))
    [quadro] = parse_nvidia_smi_xml(read_fixture(fixtures_dir, "nvidia-smi/quadro-p400.xml"))

    assert gtx.serial is None  # <serial>N/A</serial>
    assert gtx.ecc_mode is None
    assert gtx.mig_mode is None  # no <mig_mode> at all in driver 418
    assert gtx.power_limit_w == 130.0  # old <power_readings><enforced_power_limit>
    assert quadro.power_limit_w is None  # N/A there


def test_missing_cuda_version_is_none(fixtures_dir: Path) -> None:
    text = read_fixture(fixtures_dir, "nvidia-smi/quadro-p400.xml")
    without = "\n".join(line for line in text.splitlines() if "<cuda_version>" not in line)

    [gpu] = parse_nvidia_smi_xml(without)

    assert gpu.cuda_version is None
    assert gpu.driver_version == "418.43"


def test_accepts_the_external_dtd_reference() -> None:
    text = (
        '<?xml version="1.0" ?>\n<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">\n'
        "<nvidia_smi_log><driver_version>1.2</driver_version>"
        '<gpu id="00000000:2A:00.0"><product_name>X</product_name><uuid>GPU-1</uuid>'
        "<fb_memory_usage><total>10 MiB</total></fb_memory_usage></gpu></nvidia_smi_log>"
    )

    [gpu] = parse_nvidia_smi_xml(text)

    # No <pci> block: the bus id comes from the gpu element's id attribute.
    assert (gpu.model, gpu.uuid, gpu.pci_bus_id, gpu.memory_total_mib) == (
        "X",
        "GPU-1",
        "00000000:2a:00.0",
        10,
    )


def test_no_gpus_is_an_empty_list() -> None:
    assert parse_nvidia_smi_xml("<nvidia_smi_log><attached_gpus>0</attached_gpus></nvidia_smi_log>") == []


@pytest.mark.parametrize(
    "text",
    [
        "",
        "not xml at all",
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
        "<nvidia_smi_log><gpu>",
        "<something_else/>",
    ],
)
def test_garbage_raises(text: str) -> None:
    with pytest.raises(GpuReadError):
        parse_nvidia_smi_xml(text)


def test_truncated_output_raises(fixtures_dir: Path) -> None:
    text = read_fixture(fixtures_dir, "h200/nvidia-smi-q.xml")

    with pytest.raises(GpuReadError, match="not well-formed"):
        parse_nvidia_smi_xml(text[: len(text) // 2])


@pytest.mark.parametrize(
    "text",
    [
        # The "billion laughs" shape, kept small.
        '<?xml version="1.0"?><!DOCTYPE nvidia_smi_log [<!ENTITY a "aaaa"><!ENTITY b "&a;&a;&a;">]>'
        "<nvidia_smi_log><driver_version>&b;</driver_version></nvidia_smi_log>",
        # An external entity reading a local file.
        '<!DOCTYPE nvidia_smi_log [<!ENTITY x SYSTEM "file:///etc/passwd">]>'
        "<nvidia_smi_log><driver_version>&x;</driver_version></nvidia_smi_log>",
        # An internal subset without ENTITY still has no business in nvidia-smi output.
        "<!DOCTYPE nvidia_smi_log [<!ELEMENT nvidia_smi_log ANY>]><nvidia_smi_log/>",
    ],
)
def test_entity_declarations_are_refused(text: str) -> None:
    with pytest.raises(UnsafeXmlError) as caught:
        parse_nvidia_smi_xml(text)

    assert isinstance(caught.value, GpuReadError)
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize(
    ("drop", "message"),
    [("<uuid>", "no <uuid>"), ("<product_name>", "no <product_name>"), ("<total>", "fb_memory_usage/total")],
)
def test_a_gpu_without_a_required_field_raises(fixtures_dir: Path, drop: str, message: str) -> None:
    text = read_fixture(fixtures_dir, "nvidia-smi/tesla-t4.xml")
    without = "\n".join(line for line in text.splitlines() if drop not in line)

    with pytest.raises(GpuReadError, match=message):
        parse_nvidia_smi_xml(without)


def test_memory_in_an_unexpected_unit_raises(fixtures_dir: Path) -> None:
    text = read_fixture(fixtures_dir, "nvidia-smi/tesla-t4.xml").replace("15360 MiB", "15 GiB")

    with pytest.raises(GpuReadError, match="not in MiB"):
        parse_nvidia_smi_xml(text)


class FakeRun:
    """Stands in for run_program: records the call and answers as told."""

    def __init__(self, returncode: int = 0, stdout: bytes = b"", stderr: bytes = b"", error: Exception | None = None):
        self.answer = subprocess.CompletedProcess(list(COMMAND), returncode, stdout, stderr)
        self.error = error
        self.calls: list[tuple[tuple[str, ...], float]] = []

    def __call__(self, args: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess[bytes]:
        self.calls.append((tuple(args), timeout_s))
        if self.error is not None:
            raise self.error
        return self.answer


def test_reader_runs_nvidia_smi_and_parses_it(fixtures_dir: Path) -> None:
    run = FakeRun(stdout=(fixtures_dir / "nvidia-smi" / "dual_a5000-v13.xml").read_bytes())
    reader = NvidiaSmiReader(run)

    gpus = reader.read()

    assert reader.source == "nvidia-smi"
    assert [gpu.uuid[-2:] for gpu in gpus] == ["ab", "cd"]
    assert run.calls == [(("nvidia-smi", "-q", "-x"), TIMEOUT_S)]
    assert TIMEOUT_S == 15.0


def test_missing_binary_raises() -> None:
    reader = NvidiaSmiReader(FakeRun(error=FileNotFoundError(2, "not found on PATH", "nvidia-smi")))

    with pytest.raises(GpuReadError, match="nvidia-smi not found on PATH"):
        reader.read()


def test_non_zero_exit_raises_with_what_nvidia_smi_said() -> None:
    said = b"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n"
    reader = NvidiaSmiReader(FakeRun(returncode=9, stdout=said))

    with pytest.raises(GpuReadError, match="status 9: NVIDIA-SMI has failed because"):
        reader.read()


def test_timeout_raises() -> None:
    reader = NvidiaSmiReader(FakeRun(error=subprocess.TimeoutExpired(list(COMMAND), 15.0)), timeout_s=15.0)

    with pytest.raises(GpuReadError, match="did not answer within 15 s"):
        reader.read()


def test_unstartable_binary_raises() -> None:
    reader = NvidiaSmiReader(FakeRun(error=PermissionError(13, "Permission denied")))

    with pytest.raises(GpuReadError, match=r"could not be started: .*Permission denied"):
        reader.read()


def test_garbage_output_raises() -> None:
    with pytest.raises(GpuReadError, match="not well-formed"):
        NvidiaSmiReader(FakeRun(stdout=b"\x00\xff garbage")).read()


def test_run_program_runs_an_argument_list() -> None:
    done = run_program([sys.executable, "-c", "import sys; print(sys.argv[1])", "a b; echo c"], 30)

    # The argument reached the program whole: no shell split or ran it.
    assert done.returncode == 0
    assert done.stdout.decode().strip() == "a b; echo c"


def test_run_program_reports_a_program_missing_from_path() -> None:
    with pytest.raises(FileNotFoundError):
        run_program(["gpufleet-no-such-program-xyz", "-q"], 5)
