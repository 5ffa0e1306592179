"""The agent's software inventory (gpufleet.agent.software) and its wire model (gpufleet.protocol.software).

The fake node is built from the real H200 captures (tests/fixtures/software and h200/nvml-probe.json,
provenance in tests/fixtures/SOURCES.md): its os-release, kernel release, /proc/driver/nvidia/version,
its 439 Debian packages (as a dpkg status file) and its 196 pip packages (as dist-info directories),
and NVML answering what the real H200 answered. What no capture holds is written by hand and says so:
the binNMU stanza, cuDNN/NCCL/CUDA toolkit files, HCA and BIOS versions, container images.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
from collections.abc import Callable
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from gpufleet.agent import software
from gpufleet.agent.software import collect_software, main, summary
from gpufleet.assets.installed import detect_and_parse, parse_os_release
from gpufleet.protocol.software import MAX_PACKAGES, SoftwareInventory, SoftwarePackage, package_digest

SOFTWARE = Path(__file__).resolve().parent.parent / "fixtures" / "software"
SITE = "/usr/local/lib/python3.12/dist-packages"
H200_UUID = "GPU-aabfc81a-ba71-cf6e-8540-cec21d30d711"

# Hand-written: a binNMU (binary 1.2-3+b1 built from source foo 1.2-3) and a removed package ("rc").
EXTRA_STANZAS = """\
Package: libfoo1
Status: install ok installed
Architecture: amd64
Source: foo (1.2-3)
Version: 1.2-3+b1

Package: oldtool
Status: deinstall ok config-files
Architecture: amd64
Version: 0.9-1
"""

# Hand-written in the shapes podman 4 and docker 24 print (no capture of either is in the catalogue).
PODMAN_IMAGES = json.dumps(
    [
        {"Id": "3f57d9401f8d" + "0" * 52, "Names": ["nvcr.io/nvidia/pytorch:24.05-py3"]},
        {"Id": "b1d1b3a5c9e0" + "0" * 52, "Names": ["localhost:5000/train@sha256:" + "a" * 64]},  # digest only
        {"Id": "c2c2c2c2c2c2" + "0" * 52, "Names": None},  # dangling
    ]
)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def dpkg_status_from_real_list() -> str:
    """The H200's real package list as a status file; without Source fields each is its own source."""
    stanzas = []
    for line in (SOFTWARE / "dpkg-query.tsv").read_text().splitlines():
        name, version, arch = line.split("\t")
        stanzas.append(f"Package: {name}\nStatus: install ok installed\nArchitecture: {arch}\nVersion: {version}\n")
    return "\n".join([*stanzas, EXTRA_STANZAS])


def real_pip_packages() -> list[tuple[str, str]]:
    return [tuple(line.split("==")) for line in (SOFTWARE / "pip-freeze.txt").read_text().split()]  # type: ignore[misc]


def build_h200_tree(root: Path) -> Path:
    shutil.copy(SOFTWARE / "os-release.txt", write(root / "etc/os-release", ""))
    kernel = (SOFTWARE / "uname.txt").read_text().split()[2]  # "Linux vm 6.18.44-fc-v657-gpu #1 SMP ..."
    write(root / "proc/sys/kernel/osrelease", kernel + "\n")
    shutil.copy(SOFTWARE / "proc-driver-nvidia-version.txt", write(root / "proc/driver/nvidia/version", ""))
    write(root / "var/lib/dpkg/status", dpkg_status_from_real_list())
    site = root / SITE.lstrip("/")
    for name, version in real_pip_packages():
        write(
            site / f"{name}-{version}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        )
    # Hand-written: cuDNN headers where Debian's NVIDIA packages put them, NCCL as a library file, a toolkit.
    include = root / "usr/include/x86_64-linux-gnu"
    defines = "#define CUDNN_MAJOR 9\n#define CUDNN_MINOR 19\n#define CUDNN_PATCHLEVEL 0\n"
    write(include / "cudnn_version_v9.h", f"/* cudnn */\n{defines}#define CUDNN_VERSION 91900\n")
    write(root / "usr/lib/x86_64-linux-gnu/libnccl.so.2.28.9", "")
    write(root / "usr/lib/x86_64-linux-gnu/libnccl.so.2", "")
    write(root / "usr/local/cuda-13.0/version.json", json.dumps({"cuda": {"name": "CUDA SDK", "version": "13.0.88"}}))
    (root / "usr/local/cuda").symlink_to("cuda-13.0")
    # Device names as in the real H100 InfiniBand snapshot; versions hand-written.
    for device in ("mlx5_0", "mlx5_1"):
        write(root / f"sys/class/infiniband/{device}/fw_ver", "28.39.1002\n")
        write(root / f"sys/class/infiniband/{device}/board_id", "MT_0000000838\n")
        write(root / f"sys/class/infiniband/{device}/hca_type", "MT4129\n")
    # System vendor and product from the real dmidecode capture (Dell PowerEdge XE9680); BIOS hand-written.
    dmi = root / "sys/class/dmi/id"
    for name, value in {"sys_vendor": "Dell Inc.", "product_name": "PowerEdge XE9680", "bios_version": "2.3.5"}.items():
        write(dmi / name, value + "\n")
    return root


class FakeRun:
    """subprocess.run for the tests: `answers` maps a tool to its stdout, an exit status with stderr, or an
    exception to raise; a tool not named is not installed."""

    def __init__(self, answers: dict[str, str | tuple[int, str] | BaseException]) -> None:
        self.answers = answers
        self.calls: list[list[str]] = []

    def __call__(self, argv: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        self.calls.append(argv)
        answer = self.answers.get(argv[0], FileNotFoundError(argv[0]))
        if isinstance(answer, BaseException):
            raise answer
        if isinstance(answer, tuple):
            return subprocess.CompletedProcess(argv, answer[0], "", answer[1])
        return subprocess.CompletedProcess(argv, 0, answer, "")


def h200_run() -> FakeRun:
    return FakeRun({"podman": PODMAN_IMAGES})  # docker is not installed


def find(inventory: SoftwareInventory, ecosystem: str, name: str) -> list[SoftwarePackage]:
    return [p for p in inventory.packages if p.ecosystem == ecosystem and p.name == name]


@pytest.fixture
def h200_root(tmp_path: Path) -> Path:
    return build_h200_tree(tmp_path / "root")


def test_h200_node(h200_root: Path, recorded_nvml: Callable[..., Any]) -> None:
    nvml = recorded_nvml()
    inventory = collect_software(root=h200_root, run=h200_run(), nvml=nvml)
    assert (inventory.distro_ecosystem, inventory.distro_release) == ("Ubuntu", "24.04")
    assert inventory.kernel == "6.18.44-fc-v657-gpu"
    assert [p.version for p in find(inventory, "Linux", "kernel")] == ["6.18.44-fc-v657-gpu"]
    [driver] = find(inventory, "NVIDIA", "driver")
    assert driver.version == "580.159.04"
    assert [p.version for p in find(inventory, "NVIDIA", "cuda-driver")] == ["13.0"]
    [vbios] = find(inventory, "firmware", "gpu-vbios")
    assert (vbios.version, vbios.location) == ("96.00.A5.00.1A", f"0/{H200_UUID}")
    assert [p.version for p in find(inventory, "firmware", "gpu-inforom")] == ["G520.0282.02.02"]
    assert nvml._sessions == 0  # NVML shut down again after reading


def test_h200_distribution_and_python_packages(h200_root: Path, recorded_nvml: Callable[..., Any]) -> None:
    inventory = collect_software(root=h200_root, run=h200_run(), nvml=recorded_nvml())
    ubuntu = {p.name: p for p in inventory.packages if p.ecosystem == "Ubuntu"}
    assert len(ubuntu) == 439 + 1  # the real list and the binNMU; the "rc" package is not installed
    assert ubuntu["automake"].version == "1:1.16.5-1.3ubuntu1"
    assert ubuntu["libc6"].version == "2.39-0ubuntu8.9"
    assert (ubuntu["libfoo1"].source_name, ubuntu["libfoo1"].source_version) == ("foo", "1.2-3")
    pypi = {p.name: p for p in inventory.packages if p.ecosystem == "PyPI"}
    assert len(pypi) == 196
    assert pypi["torch"] == SoftwarePackage(ecosystem="PyPI", name="torch", version="2.11.0", location=SITE)
    assert pypi["nvidia-cudnn-cu13"].version == "9.19.0.56"


def test_h200_libraries_firmware_and_images(h200_root: Path, recorded_nvml: Callable[..., Any]) -> None:
    inventory = collect_software(root=h200_root, run=h200_run(), nvml=recorded_nvml())
    [cudnn] = find(inventory, "NVIDIA", "cudnn")
    assert (cudnn.version, cudnn.location) == ("9.19.0", "/usr/include/x86_64-linux-gnu")
    [nccl] = find(inventory, "NVIDIA", "nccl")
    assert (nccl.version, nccl.location) == ("2.28.9", "/usr/lib/x86_64-linux-gnu")
    [toolkit] = find(inventory, "NVIDIA", "cuda-toolkit")  # cuda -> cuda-13.0 is one toolkit
    assert (toolkit.version, toolkit.location) == ("13.0.88", "/usr/local/cuda")
    hcas = find(inventory, "firmware", "hca")
    assert [(h.version, h.location) for h in hcas] == [
        ("28.39.1002", "mlx5_0; board_id=MT_0000000838; hca_type=MT4129"),
        ("28.39.1002", "mlx5_1; board_id=MT_0000000838; hca_type=MT4129"),
    ]
    [bios] = find(inventory, "firmware", "bios")
    assert (bios.version, bios.location) == ("2.3.5", "system=Dell Inc. PowerEdge XE9680")
    [image] = [p for p in inventory.packages if p.ecosystem == "container-image"]
    assert (image.name, image.version, image.location) == ("nvcr.io/nvidia/pytorch", "24.05-py3", "3f57d9401f8d")
    assert "container images: docker is not installed" in inventory.notes


def test_the_package_databases_come_from_the_tree(h200_root: Path, recorded_nvml: Callable[..., Any]) -> None:
    run = h200_run()
    collect_software(root=h200_root, run=run, nvml=recorded_nvml())
    # Not this machine's dpkg-query (the status file under root is read), and no rpm on an Ubuntu node.
    assert [argv[0] for argv in run.calls] == ["podman", "docker"]


def test_driver_from_nvml_without_the_proc_file(h200_root: Path, recorded_nvml: Callable[..., Any]) -> None:
    (h200_root / "proc/driver/nvidia/version").unlink()
    inventory = collect_software(root=h200_root, run=h200_run(), nvml=recorded_nvml())
    assert [p.version for p in find(inventory, "NVIDIA", "driver")] == ["580.159.04"]


def test_driver_from_proc_when_nvml_cannot_start(h200_root: Path, recorded_nvml: Callable[..., Any]) -> None:
    nvml = recorded_nvml(fail={"nvmlInit": "Driver Not Loaded"})
    inventory = collect_software(root=h200_root, run=h200_run(), nvml=nvml)
    assert [p.version for p in find(inventory, "NVIDIA", "driver")] == ["580.159.04"]
    assert find(inventory, "firmware", "gpu-vbios") == []
    assert any(note.startswith("gpu firmware: NVML unavailable") for note in inventory.notes)


def test_digest_ignores_order_and_follows_versions(h200_root: Path, recorded_nvml: Callable[..., Any]) -> None:
    first = collect_software(root=h200_root, run=h200_run(), nvml=recorded_nvml())
    assert package_digest(reversed(first.packages)) == first.digest
    again = collect_software(root=h200_root, run=h200_run(), nvml=recorded_nvml())
    assert again.digest == first.digest
    metadata = h200_root / SITE.lstrip("/") / "torch-2.11.0.dist-info/METADATA"
    metadata.write_text(metadata.read_text().replace("2.11.0", "2.11.1"))
    changed = collect_software(root=h200_root, run=h200_run(), nvml=recorded_nvml())
    assert changed.digest != first.digest


def test_an_empty_machine_gives_notes_not_errors(tmp_path: Path, recorded_nvml: Callable[..., Any]) -> None:
    run = FakeRun({"docker": subprocess.TimeoutExpired(["docker"], 60)})
    nvml = recorded_nvml(fail={"nvmlInit": "NVML Shared Library Not Found"})
    inventory = collect_software(root=tmp_path, run=run, nvml=nvml, pip_envs=[Path("/nowhere")])
    assert inventory.packages == []
    assert (inventory.distro_ecosystem, inventory.kernel) == (None, None)
    assert inventory.notes == [
        "os-release: not found",
        "nvidia driver: NVML unavailable: nvmlInit failed: NVML Shared Library Not Found",
        "distribution packages: the distribution is not one gpufleet knows, so its packages cannot be matched",
        "container images: podman is not installed",
        "container images: docker did not answer within 60 s",
    ]


def test_a_failing_tool_is_noted(h200_root: Path, recorded_nvml: Callable[..., Any]) -> None:
    daemon_down = "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?"
    run = FakeRun({"podman": "not json", "docker": (1, daemon_down + "\n")})
    inventory = collect_software(root=h200_root, run=run, nvml=recorded_nvml())
    assert any(n.startswith("container images: podman printed what gpufleet cannot read") for n in inventory.notes)
    assert f"container images: docker exited with 1: {daemon_down}" in inventory.notes
    assert len([p for p in inventory.packages if p.ecosystem == "Ubuntu"]) == 440  # the rest is still there


def test_docker_images() -> None:
    text = "\n".join(
        json.dumps(image)
        for image in (
            {"ID": "3f57d9401f8d", "Repository": "ubuntu", "Tag": "22.04", "Digest": "<none>"},
            {"ID": "0aa0aa0aa0aa", "Repository": "<none>", "Tag": "<none>"},
        )
    )
    inventory = collect_software(root=Path("/nonexistent"), run=FakeRun({"docker": text}), nvml=_NoNvml())
    images = [(p.name, p.version, p.location) for p in inventory.packages if p.ecosystem == "container-image"]
    assert images == [("ubuntu", "22.04", "3f57d9401f8d")]


def test_rpm_node(tmp_path: Path) -> None:
    write(
        tmp_path / "etc/os-release", 'NAME="Rocky Linux"\nID="rocky"\nID_LIKE="rhel centos fedora"\nVERSION_ID="9.3"\n'
    )
    # Hand-written `rpm -qa --qf RPM_QUERY_FORMAT` output: name, E:V-R, arch and the source RPM.
    run = FakeRun(
        {
            "rpm": "bash\t0:5.1.8-9.el9\tx86_64\tbash-5.1.8-9.el9.src.rpm\n"
            "openssl-libs\t1:3.0.7-27.el9\tx86_64\topenssl-3.0.7-27.el9.src.rpm\n"
        }
    )
    inventory = collect_software(root=tmp_path, run=run, nvml=_NoNvml(), pip_envs=[])
    assert (inventory.distro_ecosystem, inventory.distro_release) == ("Rocky Linux", "9")
    rocky = [(p.name, p.version, p.source_name) for p in inventory.packages if p.ecosystem == "Rocky Linux"]
    assert rocky == [("bash", "5.1.8-9.el9", "bash"), ("openssl-libs", "1:3.0.7-27.el9", "openssl")]
    assert run.calls[0][:3] == ["rpm", "--root", str(tmp_path)]
    assert run.calls[0][-1].endswith("\\t%{SOURCERPM}\\n")  # the source RPM is asked for


def test_too_many_packages_are_cut_from_the_end(
    h200_root: Path, recorded_nvml: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(software, "MAX_PACKAGES", 5)
    inventory = collect_software(root=h200_root, run=h200_run(), nvml=recorded_nvml())
    assert inventory.truncated
    assert [p.name for p in inventory.packages] == ["kernel", "driver", "cuda-driver", "gpu-vbios", "gpu-inforom"]
    assert inventory.digest == package_digest(inventory.packages)
    assert any("left out (limit 5)" in note for note in inventory.notes)


def test_this_machine() -> None:
    if not Path("/usr/bin/dpkg-query").exists():
        pytest.skip("this machine has no dpkg-query (not Debian or Ubuntu)")
    inventory = collect_software(pip_envs=[])
    expected = parse_os_release(Path("/etc/os-release").read_text())
    assert expected is not None
    assert (inventory.distro_ecosystem, inventory.distro_release) == (expected.ecosystem, expected.release)
    dpkg_version = subprocess.run(
        ["/usr/bin/dpkg-query", "-W", "-f=${Version}", "dpkg"], capture_output=True, text=True, check=True
    ).stdout
    [dpkg] = [p for p in inventory.packages if p.ecosystem == expected.ecosystem and p.name == "dpkg"]
    assert (dpkg.version, dpkg.source_name) == (dpkg_version, "dpkg")
    assert inventory.kernel


# -- the wire model -----------------------------------------------------------------------------------------


def test_wire_limits() -> None:
    package = SoftwarePackage(ecosystem="PyPI", name="torch", version="2.11.0")
    digest = package_digest([package])
    SoftwareInventory(packages=[package], digest=digest)
    with pytest.raises(ValidationError):
        SoftwareInventory(packages=[package], digest=digest, extra=1)  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        SoftwareInventory(packages=[package], digest="not a digest")
    with pytest.raises(ValidationError):
        SoftwarePackage(ecosystem="PyPI", name="x" * 257, version="1")
    with pytest.raises(ValidationError):
        SoftwareInventory(packages=[package] * (MAX_PACKAGES + 1), digest=digest)


def test_an_oversized_field_drops_one_package(tmp_path: Path) -> None:
    site = tmp_path / "env"
    write(site / "ok-1.0.dist-info/METADATA", "Name: ok\nVersion: 1.0\n")
    write(site / "huge-1.0.dist-info/METADATA", f"Name: huge\nVersion: {'1' * 300}\n")
    inventory = collect_software(root=tmp_path, run=FakeRun({}), nvml=_NoNvml(), pip_envs=[Path("/env")])
    assert [(p.name, p.location) for p in inventory.packages if p.ecosystem == "PyPI"] == [("ok", "/env")]
    assert "1 package(s) left out: a field is longer than the protocol allows" in inventory.notes


# -- python -m gpufleet.agent.software --------------------------------------------------------------------------


def test_main_prints_a_summary_and_an_export(
    h200_root: Path, recorded_nvml: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    inventory = collect_software(root=h200_root, run=h200_run(), nvml=recorded_nvml())
    monkeypatch.setattr(software, "collect_software", lambda **_: inventory)
    out = io.StringIO()
    with redirect_stdout(out):
        assert main([]) == 0
    printed = json.loads(out.getvalue())
    assert printed == json.loads(json.dumps(summary(inventory)))
    assert printed["counts"]["Ubuntu"] == 440
    assert printed["counts"]["PyPI"] == 196
    assert {"ecosystem": "NVIDIA", "name": "driver", "version": "580.159.04"} in printed["nvidia_and_firmware"]
    out = io.StringIO()
    with redirect_stdout(out):
        main(["--export"])
    exported = detect_and_parse(out.getvalue(), None)
    assert exported.kind == "gpufleet-json"
    assert len(exported.packages) == len(inventory.packages)
    assert (exported.distro.ecosystem, exported.distro.release) == ("Ubuntu", "24.04")  # type: ignore[union-attr]


class _NoNvml:
    """A pynvml without a driver: nvmlInit fails."""

    class NVMLError(Exception):
        pass

    def nvmlInit(self) -> None:
        raise self.NVMLError("NVML Shared Library Not Found")


def test_a_simulated_node_reports_sources_and_its_older_image_is_found_vulnerable(tmp_path: Path) -> None:
    """The simulator runs the real collector: its packages carry their source names, and the older
    image's glibc and container toolkit are what real advisories (Ubuntu's glibc record, Go's toolkit
    record) find, through the source name and the Go-module link."""
    from gpufleet.assets.advisories.load import load_paths
    from gpufleet.assets.matching import AdvisoryIndex, Matcher
    from gpufleet.assets.records import Distro, Installed
    from gpufleet.sim.nvml import SimulatedNvml
    from gpufleet.sim.software import SimulatedSoftware

    records = [SOFTWARE.parent / "advisories" / name for name in ("UBUNTU-CVE-2023-4911.json", "GO-2024-3239.json")]
    index = AdvisoryIndex(advisory for _, advisory in load_paths(records))
    found = {}
    for variant in ("current", "older"):
        inventory = SimulatedSoftware(tmp_path / variant, SimulatedNvml("n1", gpu_count=1), variant)()
        packages = [Installed(**p.model_dump()) for p in inventory.packages]
        assert {p.source_name for p in packages if p.name in ("libc6", "libc-bin")} == {"glibc"}
        result = Matcher(index).scan(packages, Distro("Ubuntu", "22.04"))
        found[variant] = sorted((f.key(), f.installed.name) for f in result.findings)
    assert found == {
        "current": [],
        "older": [
            ("CVE-2023-4911", "libc-bin"),
            ("CVE-2023-4911", "libc6"),
            ("CVE-2024-0132", "nvidia-container-toolkit"),
            ("CVE-2024-0132", "nvidia-container-toolkit-base"),
        ],
    }
