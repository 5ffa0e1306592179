"""Parsing `nvidia-smi -q -x` from real machines, and running it."""

from __future__ import annotations

import logging
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
    LIST_COMMAND,
    TIMEOUT_S,
    ListedGpu,
    ListedMig,
    NvidiaSmiReader,
    UnsafeXmlError,
    derive_mig_profile,
    parse_nvidia_smi_list,
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


# -- MIG ---------------------------------------------------------------------------------------------

A100 = "nvidia-smi/a100-sxm4-v12.xml"  # MIG on: GPU instances 3-6, each 14 SMs and 19968 MiB
A100_UUID = "GPU-513536b6-7d19-9063-b049-1e69664bb298"
H100_LIST = "nvidia-smi/h100-mig-590.48.01-L.txt"


def a100_list(devices: Sequence[int] = (0, 1, 2, 3), gpu_uuid: str = A100_UUID, profile: str = "1g.20gb") -> str:
    """CONSTRUCTED, not captured: `nvidia-smi -L` as the A100 of a100-sxm4-v12.xml would print it (its
    GPU UUID, made-up MIG UUIDs ending in the device number), in the line shape of the real H100 capture."""
    lines = [f"GPU 0: NVIDIA A100-SXM4-80GB (UUID: {gpu_uuid})"]
    lines += [f"  MIG {profile:<11} Device {n:>2}: (UUID: MIG-a100a100-0000-5000-8000-00000000000{n})" for n in devices]
    return "\n".join(lines) + "\n"


def with_mig_uuids(xml: str) -> str:
    """The A100 XML as if nvidia-smi wrote each MIG device's UUID (v12 does not): MIG-…-0000000000GI."""
    for gi in (3, 4, 5, 6):
        tag = f"<gpu_instance_id>{gi}</gpu_instance_id>"
        xml = xml.replace(tag, f"<uuid>MIG-0000000{gi}-1111-5000-8000-00000000000{gi}</uuid>{tag}")
    return xml


class FakeCommands:
    """Stands in for run_program where the reader runs more than one command: each answers as its FakeRun."""

    def __init__(self, answers: dict[tuple[str, ...], FakeRun]) -> None:
        self.answers = answers
        self.calls: list[tuple[tuple[str, ...], float]] = []

    def __call__(self, args: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess[bytes]:
        self.calls.append((tuple(args), timeout_s))
        return self.answers[tuple(args)](args, timeout_s)


def a100_reader(fixtures_dir: Path, listing: FakeRun, xml: str | None = None) -> tuple[NvidiaSmiReader, FakeCommands]:
    text = read_fixture(fixtures_dir, A100) if xml is None else xml
    run = FakeCommands({COMMAND: FakeRun(stdout=text.encode()), LIST_COMMAND: listing})
    return NvidiaSmiReader(run), run


def test_parses_a_real_mig_listing(fixtures_dir: Path) -> None:
    listing = parse_nvidia_smi_list(read_fixture(fixtures_dir, H100_LIST))

    assert listing == {
        0: ListedGpu(
            "GPU-00000000-0000-0000-0000-000000000000",
            {
                0: ListedMig("MIG-00000000-0000-0000-0000-000000000000", "3g.40gb"),
                1: ListedMig("MIG-00000001-0000-0000-0000-000000000001", "2g.20gb"),
                2: ListedMig("MIG-00000002-0000-0000-0000-000000000002", "1g.10gb"),
                3: ListedMig("MIG-00000003-0000-0000-0000-000000000003", "1g.10gb"),
            },
        )
    }


def test_listing_reads_the_r450_uuid_form() -> None:
    # CONSTRUCTED in the form R450 drivers printed: the MIG UUID names the GPU and the instance ids.
    text = (
        "GPU 0: A100-PCIE-40GB (UUID: GPU-c66f2b7d-c5d2-c0d1-e453-6f7f47a3b1d4)\n"
        "  MIG 3g.20gb Device 0: (UUID: MIG-GPU-c66f2b7d-c5d2-c0d1-e453-6f7f47a3b1d4/1/0)\n"
    )

    [gpu] = parse_nvidia_smi_list(text).values()

    assert gpu.mig == {0: ListedMig("MIG-GPU-c66f2b7d-c5d2-c0d1-e453-6f7f47a3b1d4/1/0", "3g.20gb")}


def test_listing_skips_what_it_does_not_know(fixtures_dir: Path) -> None:
    gpu_line = read_fixture(fixtures_dir, H100_LIST).splitlines()[0]
    mig_first = f"  MIG 1g.10gb     Device  0: (UUID: MIG-1)\n{gpu_line}\n"

    assert parse_nvidia_smi_list("No devices were found\n") == {}
    # A MIG line before any GPU line belongs to no GPU.
    assert parse_nvidia_smi_list(mig_first) == {0: ListedGpu("GPU-00000000-0000-0000-0000-000000000000", {})}


def test_a100_mig_devices_take_uuids_and_profiles_from_the_listing(fixtures_dir: Path) -> None:
    listing = parse_nvidia_smi_list(a100_list())

    [gpu] = parse_nvidia_smi_xml(read_fixture(fixtures_dir, A100), listing)

    assert [(m.gpu_instance, m.compute_instance) for m in gpu.mig] == [(3, 0), (4, 0), (5, 0), (6, 0)]
    assert [m.uuid[-1] for m in gpu.mig] == ["0", "1", "2", "3"]  # by MIG device index
    assert {(m.profile, m.slices, m.memory_mib, m.start) for m in gpu.mig} == {("1g.20gb", 1, 19968, None)}
    assert gpu.memory_total_mib == 81920  # still the whole GPU's


def test_a100_profiles_are_derived_where_the_xml_names_its_devices(fixtures_dir: Path) -> None:
    xml = with_mig_uuids(read_fixture(fixtures_dir, A100))
    reader, run = a100_reader(fixtures_dir, FakeRun(returncode=1), xml)

    [gpu] = reader.read()

    # 14 SMs: one A100 slice; of the 1-slice profiles, 1g.20gb (19968 MiB) is the device's memory.
    assert [(m.uuid, m.gpu_instance, m.profile, m.slices) for m in gpu.mig] == [
        (f"MIG-0000000{gi}-1111-5000-8000-00000000000{gi}", gi, "1g.20gb", 1) for gi in (3, 4, 5, 6)
    ]
    assert run.calls == [(COMMAND, TIMEOUT_S)]  # nothing left to ask -L


def test_the_listing_profile_wins_over_the_derived_one(fixtures_dir: Path) -> None:
    # A 2g.20gb GPU instance split into two 1-slice compute instances looks, in the XML, just like a
    # 1g.20gb: 14 SMs, 19968 MiB. Only -L tells them apart.
    listing = parse_nvidia_smi_list(a100_list(profile="1c.2g.20gb"))

    [gpu] = parse_nvidia_smi_xml(read_fixture(fixtures_dir, A100), listing)

    assert {(m.profile, m.slices) for m in gpu.mig} == {("1c.2g.20gb", 2)}


@pytest.mark.parametrize(
    ("model", "memory_total_mib", "sm_count", "memory_mib", "profile"),
    [
        # Real devices: the A100 XML fixture, and the H100 capture h100-mig-590.48.01-L.txt comes from.
        ("NVIDIA A100-SXM4-80GB", 81920, 14, 19968, "1g.20gb"),
        ("NVIDIA H100 80GB HBM3", 81559, 60, 40448, "3g.40gb"),
        ("NVIDIA H100 80GB HBM3", 81559, 32, 20096, "2g.20gb"),
        ("NVIDIA H100 80GB HBM3", 81559, 16, 9984, "1g.10gb"),
        # NVIDIA's figures for whole-GPU instances: more SMs than 7 slices' share.
        ("NVIDIA H100 80GB HBM3", 81559, 132, 80896, "7g.80gb"),
        ("NVIDIA A100-SXM4-40GB", 40960, 98, 40192, "7g.40gb"),
        # Unknown: a 1-slice compute instance of a 3g.40gb (the memory fits no 1-slice profile), a GPU
        # without MIG, fewer SMs than a slice, and missing fields.
        ("NVIDIA A100-SXM4-80GB", 81920, 14, 40192, ""),
        ("Tesla T4", 15360, 40, 15360, ""),
        ("NVIDIA A100-SXM4-80GB", 81920, 7, 19968, ""),
        ("NVIDIA A100-SXM4-80GB", 81920, None, 19968, ""),
        ("NVIDIA A100-SXM4-80GB", 81920, 14, None, ""),
    ],
)
def test_derive_mig_profile(
    model: str, memory_total_mib: int, sm_count: int | None, memory_mib: int | None, profile: str
) -> None:
    assert derive_mig_profile(model, memory_total_mib, sm_count, memory_mib) == profile


def test_the_h100_listing_agrees_with_the_profiles_derived_from_its_xml_fields(fixtures_dir: Path) -> None:
    # The same capture's `nvidia-smi -q`: MIG devices 0-3 have 60, 32, 16 and 16 SMs.
    [gpu] = parse_nvidia_smi_list(read_fixture(fixtures_dir, H100_LIST)).values()
    fields = [(60, 40448), (32, 20096), (16, 9984), (16, 9984)]

    derived = [derive_mig_profile("NVIDIA H100 80GB HBM3", 81559, sms, mib) for sms, mib in fields]

    assert derived == [gpu.mig[n].profile for n in range(4)]


def test_reader_runs_the_listing_once_for_mig_uuids(fixtures_dir: Path) -> None:
    reader, run = a100_reader(fixtures_dir, FakeRun(stdout=a100_list().encode()))

    [gpu] = reader.read()

    assert len(gpu.mig) == 4
    assert run.calls == [(COMMAND, TIMEOUT_S), (LIST_COMMAND, TIMEOUT_S)]
    assert LIST_COMMAND == ("nvidia-smi", "-L")


def test_mig_devices_are_read_only_while_mig_is_on(fixtures_dir: Path) -> None:
    xml = read_fixture(fixtures_dir, A100).replace("<current_mig>Enabled<", "<current_mig>Disabled<")
    reader, run = a100_reader(fixtures_dir, FakeRun(stdout=a100_list().encode()), xml)

    [gpu] = reader.read()

    assert (gpu.mig_mode, gpu.mig) == ("disabled", [])
    assert run.calls == [(COMMAND, TIMEOUT_S)]


def test_a_mig_device_the_listing_does_not_name_is_left_out(
    fixtures_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    reader, _ = a100_reader(fixtures_dir, FakeRun(stdout=a100_list(devices=(0, 1, 3)).encode()))

    with caplog.at_level(logging.WARNING, logger="gpufleet.agent.gpu.smi"):
        [gpu] = reader.read()

    assert [m.gpu_instance for m in gpu.mig] == [3, 4, 6]
    assert [r.getMessage() for r in caplog.records] == [
        "GPU 0: MIG device 2 (GPU instance 5) left out: neither the XML nor nvidia-smi -L gives its UUID"
    ]


def test_without_a_listing_no_mig_device_can_be_named(fixtures_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="gpufleet.agent.gpu.smi"):
        [gpu] = parse_nvidia_smi_xml(read_fixture(fixtures_dir, A100))

    assert (gpu.mig_mode, gpu.mig) == ("enabled", [])
    assert len(caplog.records) == 4


@pytest.mark.parametrize(
    ("listing", "said"),
    [
        (FakeRun(returncode=6, stdout=b"No devices were found\n"), "exited with status 6: No devices were found"),
        (FakeRun(error=subprocess.TimeoutExpired(list(LIST_COMMAND), 15.0)), "did not answer within 15 s"),
        (FakeRun(error=FileNotFoundError(2, "not found on PATH", "nvidia-smi")), "not found on PATH"),
        (FakeRun(error=PermissionError(13, "Permission denied")), "could not be started"),
    ],
    ids=["exit-status", "timeout", "missing", "unstartable"],
)
def test_a_failing_listing_leaves_the_gpus_without_mig(
    fixtures_dir: Path, caplog: pytest.LogCaptureFixture, listing: FakeRun, said: str
) -> None:
    reader, _ = a100_reader(fixtures_dir, listing)

    with caplog.at_level(logging.WARNING, logger="gpufleet.agent.gpu.smi"):
        [gpu] = reader.read()

    assert (gpu.uuid, gpu.mig_mode, gpu.mig) == (A100_UUID, "enabled", [])
    assert f"nvidia-smi -L failed: nvidia-smi {said}" in caplog.messages[0]


def test_a_listing_of_another_gpu_is_not_used(fixtures_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    other = "GPU-00000000-0000-0000-0000-000000000000"
    reader, _ = a100_reader(fixtures_dir, FakeRun(stdout=a100_list(gpu_uuid=other).encode()))

    with caplog.at_level(logging.WARNING, logger="gpufleet.agent.gpu.smi"):
        [gpu] = reader.read()

    assert gpu.mig == []
    assert f"nvidia-smi -L lists {other} there, not {A100_UUID}" in caplog.messages[0]


def test_a_mig_device_of_unknown_profile_costs_no_other_device(
    fixtures_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The first device's 7 SMs make no A100 slice: its profile is unknown ("").
    xml = with_mig_uuids(read_fixture(fixtures_dir, A100)).replace(
        "<multiprocessor_count>14<", "<multiprocessor_count>7<", 1
    )

    with caplog.at_level(logging.WARNING, logger="gpufleet.agent.gpu.smi"):
        [gpu] = parse_nvidia_smi_xml(xml)

    # Kept, with its profile unknown: CUDA can still name it, and the others are unaffected.
    assert [(m.gpu_instance, m.profile) for m in gpu.mig] == [(3, ""), (4, "1g.20gb"), (5, "1g.20gb"), (6, "1g.20gb")]
    assert caplog.messages == []


def test_a_mig_device_without_instance_ids_is_left_out(fixtures_dir: Path) -> None:
    xml = read_fixture(fixtures_dir, A100).replace("<gpu_instance_id>5</gpu_instance_id>", "")

    [gpu] = parse_nvidia_smi_xml(xml, parse_nvidia_smi_list(a100_list()))

    assert [m.gpu_instance for m in gpu.mig] == [3, 4, 6]
