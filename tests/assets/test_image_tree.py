"""Reading what an image holds from its tree: os-release and dpkg's status file, nothing run."""

from __future__ import annotations

from pathlib import Path

from gpufleet.assets.image_tree import read_image
from gpufleet.assets.records import Distro

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
STATUS = """Package: libc6
Status: install ok installed
Architecture: amd64
Source: glibc
Version: 2.35-0ubuntu3.1

Package: removed-one
Status: deinstall ok config-files
Architecture: amd64
Version: 1.0-1

Package: openssl
Status: install ok installed
Architecture: amd64
Version: 3.0.2-0ubuntu1.10
"""


def test_an_images_distribution_and_packages_come_from_its_files(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "os-release").write_text((FIXTURES / "software" / "etc-os-release").read_text())
    (tmp_path / "var" / "lib" / "dpkg").mkdir(parents=True)
    (tmp_path / "var" / "lib" / "dpkg" / "status").write_text(STATUS)
    distro, packages = read_image(tmp_path)
    assert distro == Distro("Ubuntu", "22.04")
    assert [(p.name, p.version, p.source_name, p.source_version) for p in packages] == [
        ("libc6", "2.35-0ubuntu3.1", "glibc", "2.35-0ubuntu3.1"),
        ("openssl", "3.0.2-0ubuntu1.10", "openssl", "3.0.2-0ubuntu1.10"),
    ]


def test_a_tree_without_a_package_database_holds_nothing_to_match(tmp_path: Path) -> None:
    assert read_image(tmp_path) == (None, [])
    (tmp_path / "usr" / "lib").mkdir(parents=True)
    (tmp_path / "usr" / "lib" / "os-release").write_text('ID=debian\nVERSION_ID="12"\n')
    assert read_image(tmp_path) == (Distro("Debian", "12"), [])
