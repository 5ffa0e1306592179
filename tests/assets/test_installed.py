"""Reading installed software from the text package tools print (gpufleet.assets.installed).

Real data where it exists (tests/fixtures/software, provenance in tests/fixtures/SOURCES.md): the H200
machine's dpkg-query, pip freeze, pip list and os-release; Google Colab's apt list and pip freeze; a GPU
node's os-release. The dpkg status file, the 5/6-column dpkg-query and the rpm lists are written by hand
below (no real capture of them is in the catalogue); each says so.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpufleet.assets.installed import (
    EXPORT_FORMAT,
    InventoryFile,
    detect_and_parse,
    export_json,
    parse_apt_list,
    parse_distro_arg,
    parse_dpkg_l,
    parse_dpkg_query,
    parse_dpkg_query_source,
    parse_dpkg_status,
    parse_os_release,
    parse_pip_freeze,
    parse_pip_list_json,
    parse_rpm_nevra,
    parse_rpm_qa,
    rpm_version,
    source_rpm_name,
)
from gpufleet.assets.records import Distro, Installed

SOFTWARE = Path(__file__).resolve().parent.parent / "fixtures" / "software"
UBUNTU_24 = Distro("Ubuntu", "24.04")
UBUNTU_20 = Distro("Ubuntu", "20.04")
ROCKY_9 = Distro("Rocky Linux", "9")


def fixture(name: str) -> str:
    return (SOFTWARE / name).read_text()


def by_name(packages: list[Installed]) -> dict[str, Installed]:
    return {p.name: p for p in packages}


# Hand-written (no real capture available): a dpkg status file with a binNMU (libfoo1: binary version
# 1.2-3+b1 built from source foo 1.2-3), an epoch (automake), a source without a version (libc6 from
# glibc), a held package, a removed package whose configuration remains (rc) and one half-installed.
DPKG_STATUS = """\
Package: libc6
Status: install ok installed
Priority: optional
Architecture: amd64
Multi-Arch: same
Source: glibc
Version: 2.36-9+deb12u4
Description: GNU C Library: Shared libraries
 Contains the standard libraries that are used by nearly all programs on
 the system.

Package: libfoo1
Status: install ok installed
Architecture: amd64
Source: foo (1.2-3)
Version: 1.2-3+b1
Description: a binNMU: rebuilt without a source change

Package: automake
Status: hold ok installed
Architecture: all
Version: 1:1.16.5-1.3
Description: held, still installed; no Source field: the source is automake itself

Package: oldtool
Status: deinstall ok config-files
Architecture: amd64
Version: 0.9-1
Description: removed, configuration kept

Package: broken
Status: install reinstreq half-installed
Architecture: amd64
Version: 2.0-1
"""

# Hand-written: the agent's 6-column dpkg-query (DPKG_QUERY_FORMAT) with the same cases; the first three
# lines are also the documented 5-column form once the status column is cut off.
DPKG_QUERY_6 = (
    "libfoo1\t1.2-3+b1\tamd64\tfoo\t1.2-3\tii \n"
    "automake\t1:1.16.5-1.3\tall\tautomake\t1:1.16.5-1.3\thi \n"
    "libc6\t2.36-9+deb12u4\tamd64\tglibc\t2.36-9+deb12u4\tii \n"
    "oldtool\t0.9-1\tamd64\toldtool\t0.9-1\trc \n"
)
DPKG_QUERY_5 = "".join(line.rsplit("\t", 1)[0] + "\n" for line in DPKG_QUERY_6.splitlines()[:3])

# Hand-written: `rpm -qa --qf RPM_QUERY_FORMAT` on a Rocky Linux 9 machine, and the plain `rpm -qa` form.
RPM_QA = (
    "bash\t0:5.1.8-9.el9\tx86_64\n"
    "openssl-libs\t1:3.0.7-27.el9\tx86_64\n"
    "tzdata\t0:2024a-1.el9\tnoarch\n"
    "gpg-pubkey\t0:350d275d-6279464e\t(none)\n"
)
RPM_NEVRA = "bash-5.1.8-9.el9.x86_64\npython3-libs-3.9.18-3.el9.x86_64\ngpg-pubkey-350d275d-6279464e\n"
# Hand-written: the same with RPM_QUERY_FORMAT's 4th column, the source RPM (gpg-pubkey has none).
RPM_QA_SOURCES = (
    "bash\t0:5.1.8-9.el9\tx86_64\tbash-5.1.8-9.el9.src.rpm\n"
    "openssl-libs\t1:3.0.7-27.el9\tx86_64\topenssl-3.0.7-27.el9.src.rpm\n"
    "glibc-langpack-en\t0:2.34-100.el9\tx86_64\tglibc-2.34-100.el9.src.rpm\n"
    "gpg-pubkey\t0:350d275d-6279464e\t(none)\t(none)\n"
)


# -- os-release and --distro -------------------------------------------------------------------------


def test_os_release_of_the_h200_and_a_gpu_node() -> None:
    assert parse_os_release(fixture("os-release.txt")) == Distro("Ubuntu", "24.04")
    assert parse_os_release(fixture("etc-os-release")) == Distro("Ubuntu", "22.04")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('ID=debian\nVERSION_ID="12"\n', Distro("Debian", "12")),
        ('ID="rocky"\nID_LIKE="rhel centos fedora"\nVERSION_ID="9.3"\n', Distro("Rocky Linux", "9")),
        ('ID="almalinux"\nVERSION_ID="8.10"\n', Distro("AlmaLinux", "8")),
        ('ID="rhel"\nVERSION_ID="9.4"\n', Distro("Red Hat", "9")),
        # A RHEL rebuild gpufleet has no ecosystem for is read as RHEL of the same major release.
        ('ID="centos"\nID_LIKE="rhel fedora"\nVERSION_ID="7"\n', Distro("Red Hat", "7")),
        # Linux Mint 21.2 is built on Ubuntu 22.04: its own VERSION_ID is not Ubuntu's.
        ("ID=linuxmint\nID_LIKE='ubuntu debian'\nVERSION_ID=21.2\nUBUNTU_CODENAME=jammy\n", Distro("Ubuntu", "22.04")),
        ("ID=debian\nVERSION_CODENAME=trixie\n", None),  # testing: no VERSION_ID, no release to match
        ("ID=arch\n", None),
        ("", None),
    ],
)
def test_os_release_mapping(text: str, expected: Distro | None) -> None:
    assert parse_os_release(text) == expected


@pytest.mark.parametrize(
    ("arg", "expected"),
    [
        ("ubuntu:22.04", Distro("Ubuntu", "22.04")),
        ("Ubuntu:24.04", Distro("Ubuntu", "24.04")),
        ("debian:12", Distro("Debian", "12")),
        ("DEBIAN:12.5", Distro("Debian", "12")),
        ("rocky:9", Distro("Rocky Linux", "9")),
        ("rocky:9.3", Distro("Rocky Linux", "9")),
        ("almalinux:8", Distro("AlmaLinux", "8")),
        ("rhel:9", Distro("Red Hat", "9")),
    ],
)
def test_distro_arg(arg: str, expected: Distro) -> None:
    assert parse_distro_arg(arg) == expected


@pytest.mark.parametrize(
    ("arg", "message"),
    [
        ("ubuntu", "ubuntu:22.04"),
        ("gentoo:1", "unknown distribution 'gentoo:1'"),
        ("ubuntu:", "ubuntu:22.04"),
        ("ubuntu:jammy", "write it like ubuntu:22.04"),
        ("debian:bookworm", "write it like debian:9"),
    ],
)
def test_distro_arg_errors(arg: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_distro_arg(arg)


# -- Debian and Ubuntu ----------------------------------------------------------------------------------


def test_h200_dpkg_query_three_columns() -> None:
    packages = parse_dpkg_query(fixture("dpkg-query.tsv"), "Ubuntu")
    assert len(packages) == 439
    names = by_name(packages)
    assert names["automake"] == Installed("Ubuntu", "automake", "1:1.16.5-1.3ubuntu1", None, None, "all")
    assert names["bsdutils"].version == "1:2.39.3-9ubuntu6.3"
    assert names["libc6"].version == "2.39-0ubuntu8.9"
    assert names["openssl"].version == "3.0.13-0ubuntu3.15"
    # No source columns: the source package is unknown, not guessed.
    assert all(p.source_name is None and p.source_version is None for p in packages)
    assert {p.arch for p in packages} == {"all", "amd64"}


def test_h200_dpkg_query_detected_as_binary_names_only() -> None:
    result = detect_and_parse(fixture("dpkg-query.tsv"), UBUNTU_24)
    assert result.kind == "dpkg-query-3col"
    assert result.binary_names_only
    assert result.distro == UBUNTU_24
    assert len(result.packages) == 439
    assert any("binary name" in note for note in result.notes)


def test_dpkg_query_with_source_columns() -> None:
    for text in (DPKG_QUERY_5, DPKG_QUERY_6):
        names = by_name(parse_dpkg_query(text, "Debian"))
        assert names["libfoo1"] == Installed("Debian", "libfoo1", "1.2-3+b1", "foo", "1.2-3", "amd64")
        assert names["automake"].version == names["automake"].source_version == "1:1.16.5-1.3"
        assert names["libc6"].source_name == "glibc"
        assert "oldtool" not in names  # "rc": only configuration files left
    result = detect_and_parse(DPKG_QUERY_6, Distro("Debian", "12"))
    assert (result.kind, result.binary_names_only, len(result.packages)) == ("dpkg-query", False, 3)


def test_dpkg_query_wrong_column_count() -> None:
    with pytest.raises(ValueError, match="line 2: expected 3, 5 or 6 tab-separated columns, got 4"):
        parse_dpkg_query("a\t1\tall\nb\t1\tall\tb\n", "Debian")


def test_dpkg_status() -> None:
    packages = parse_dpkg_status(DPKG_STATUS, "Debian")
    names = by_name(packages)
    assert set(names) == {"libc6", "libfoo1", "automake"}  # rc and half-installed left out
    assert names["libc6"] == Installed("Debian", "libc6", "2.36-9+deb12u4", "glibc", "2.36-9+deb12u4", "amd64")
    # binNMU: the source version advisories compare is the source's, not the binary's.
    assert names["libfoo1"] == Installed("Debian", "libfoo1", "1.2-3+b1", "foo", "1.2-3", "amd64")
    assert names["automake"] == Installed("Debian", "automake", "1:1.16.5-1.3", "automake", "1:1.16.5-1.3", "all")
    result = detect_and_parse(DPKG_STATUS, Distro("Debian", "12"))
    assert (result.kind, result.binary_names_only, result.packages) == ("dpkg-status", False, packages)


# -- dpkg -l and dpkg-query with source names (issue 23, item 2) ------------------------------------


def test_dpkg_l_table_is_an_inventory() -> None:
    """A real `dpkg -l` and a `dpkg-query` of binary and source names taken at the same moment on one
    Debian 12 machine name the same 724 packages at the same versions."""
    table = fixture("debian12-dpkg-l.txt")
    result = detect_and_parse(table, Distro("Debian", "12"))
    assert (result.kind, result.binary_names_only) == ("dpkg-l", True)
    assert any("binary name" in note for note in result.notes)
    sources = detect_and_parse(fixture("debian12-dpkg-query-source.txt"), Distro("Debian", "12"))
    assert (sources.kind, sources.binary_names_only) == ("dpkg-query-source", False)
    assert len(result.packages) == len(sources.packages) == 724
    assert {(p.name, p.version) for p in result.packages} == {(p.name, p.version) for p in sources.packages}
    libc6 = by_name(result.packages)["libc6"]  # "libc6:amd64" in the table
    assert (libc6.ecosystem, libc6.version, libc6.arch, libc6.source_name) == (
        "Debian",
        "2.36-9+deb12u14",
        "amd64",
        None,
    )
    libc6 = by_name(sources.packages)["libc6"]
    assert (libc6.source_name, libc6.source_version, libc6.arch) == ("glibc", "2.36-9+deb12u14", "amd64")
    assert by_name(sources.packages)["libssl3"].source_name == "openssl"


def test_dpkg_l_rows_as_pasted_without_the_header_and_with_other_states() -> None:
    """Rows of the real table, pasted from a `dpkg -l | grep` (no header); the rc, iU and the
    reinstreq row are the same rows with their state letters changed by hand."""
    rows = [line for line in fixture("debian12-dpkg-l.txt").splitlines() if line.startswith("ii  libc")][:3]
    assert len(rows) == 3
    pasted = "\n".join([rows[0], "rc" + rows[1][2:], "iU" + rows[2][2:], "iFR" + rows[0][3:]]) + "\n"
    packages = parse_dpkg_l(pasted, "Debian")
    first, third = rows[0].split()[1].split(":")[0], rows[2].split()[1].split(":")[0]
    assert [p.name for p in packages] == [first, third, first]  # rc: only configuration files left
    assert detect_and_parse(pasted, Distro("Debian", "12")).kind == "dpkg-l"
    with pytest.raises(ValueError, match="dpkg -l line 2"):
        parse_dpkg_l(rows[0] + "\nthis is not a row\n", "Debian")
    with pytest.raises(ValueError, match="names no distribution"):
        detect_and_parse(pasted, None)


def test_dpkg_query_source_format_errors() -> None:
    assert parse_dpkg_query_source("libc6:amd64 glibc 1:2.36-9\n", "Debian") == [
        Installed("Debian", "libc6", "1:2.36-9", "glibc", "1:2.36-9", "amd64")
    ]
    with pytest.raises(ValueError, match="line 2 is not 'binary source version'"):
        parse_dpkg_query_source("libc6 glibc 2.36-9\nlibc6 glibc\n", "Debian")


def test_colab_apt_list() -> None:
    packages = parse_apt_list(fixture("2023-02-22_e0be326_apt-list.txt"), "Ubuntu")
    assert len(packages) == 1385
    names = by_name(packages)
    assert names["libc6"] == Installed("Ubuntu", "libc6", "2.31-0ubuntu9.9", arch="amd64")
    assert names["sudo"].version == "1.8.31-1ubuntu1.4"
    assert names["adduser"] == Installed("Ubuntu", "adduser", "3.118ubuntu2", arch="all")
    assert names["automake"].version == "1:1.16.1-4ubuntu6"
    result = detect_and_parse(fixture("2023-02-22_e0be326_apt-list.txt"), UBUNTU_20)
    assert (result.kind, result.binary_names_only, len(result.packages)) == ("apt-list", True, 1385)


def test_apt_list_leaves_out_what_is_not_installed() -> None:
    text = (
        "WARNING: apt does not have a stable CLI interface. Use with caution in scripts.\n\n"
        "Listing... Done\n"
        "curl/jammy-updates,now 7.81.0-1ubuntu1.16 amd64 [installed,upgradable to: 7.81.0-1ubuntu1.17]\n"
        "oldtool/now 0.9-1 amd64 [residual-config]\n"
        "libc6:i386/jammy,now 2.35-0ubuntu3 i386 [installed,automatic]\n"
        "zsh/jammy 5.8.1-1 amd64\n"
    )
    packages = parse_apt_list(text, "Ubuntu")
    assert [(p.name, p.version, p.arch) for p in packages] == [
        ("curl", "7.81.0-1ubuntu1.16", "amd64"),
        ("libc6", "2.35-0ubuntu3", "i386"),
    ]
    with pytest.raises(ValueError, match="apt list line 2"):
        parse_apt_list("Listing...\nnot an apt line\n", "Ubuntu")


# -- Python ------------------------------------------------------------------------------------------


def test_h200_pip_freeze() -> None:
    packages = parse_pip_freeze(fixture("pip-freeze.txt"), location="/usr/local")
    assert len(packages) == 196
    names = by_name(packages)
    assert names["torch"] == Installed("PyPI", "torch", "2.11.0", location="/usr/local")
    assert names["nvidia-cudnn-cu13"].version == "9.19.0.56"
    assert names["nvidia-nccl-cu13"].version == "2.28.9"


def test_colab_pip_freeze_normalizes_names_and_reads_wheel_versions() -> None:
    result = detect_and_parse(fixture("2023-02-22_e0be326_pip-freeze.txt"), None)
    assert (result.kind, result.binary_names_only, result.distro) == ("pip-freeze", False, None)
    assert len(result.packages) == 413  # 418 lines less the 5-line comment header
    names = by_name(result.packages)
    # `torch @ https://download.pytorch.org/whl/cu116/torch-1.13.1%2Bcu116-cp38-...whl`
    assert names["torch"].version == "1.13.1+cu116"
    assert names["pillow"].version == "7.1.2"  # Pillow==7.1.2, PEP 503 name
    assert names["pyyaml"].version == "6.0"
    assert names["jinja2"].version == "2.11.3"
    assert names["urllib3"].version == "1.24.3"
    assert names["google-colab"].version == "1.0.0"  # file:///colabtools/dist/google-colab-1.0.0.tar.gz
    assert any("torch 1.13.1+cu116" in note for note in result.notes)


def test_pip_freeze_edge_cases() -> None:
    text = (
        "# Editable install with no version control (mypkg==0.1)\n"
        "-e /home/me/mypkg\n"
        "-i https://pypi.org/simple\n"
        "Foo.Bar_baz===1.0.post1\n"
        "requests == 2.31.0\n"
        "tool @ git+https://github.com/example/tool@1a2b3c\n"
        "local @ file:///tmp/local\n"
    )
    result = detect_and_parse(text, None)
    assert [(p.name, p.version) for p in result.packages] == [("foo-bar-baz", "1.0.post1"), ("requests", "2.31.0")]
    assert result.notes == [
        "3 left out, no released version (editable, VCS or directory installs): /home/me/mypkg, tool, local"
    ]
    with pytest.raises(ValueError, match="pip freeze line 2"):
        parse_pip_freeze("requests==2.31.0\njust some words\n")


def test_h200_pip_list_json() -> None:
    result = detect_and_parse(fixture("pip-list.json"), None)
    assert (result.kind, len(result.packages)) == ("pip-list-json", 197)  # freeze's 196 and pip itself
    assert by_name(result.packages)["torch"].version == "2.11.0"
    assert parse_pip_list_json(fixture("pip-list.json"), "/venv")[0].location == "/venv"
    with pytest.raises(ValueError, match="list of"):
        parse_pip_list_json('[{"name": "x"}]')


# -- RPM -----------------------------------------------------------------------------------------------


def test_rpm_versions_drop_a_zero_epoch() -> None:
    assert rpm_version("0:5.1.8-9.el9") == "5.1.8-9.el9"
    assert rpm_version("(none):5.1.8-9.el9") == "5.1.8-9.el9"
    assert rpm_version("1:3.0.7-27.el9") == "1:3.0.7-27.el9"
    assert rpm_version("5.1.8-9.el9") == "5.1.8-9.el9"


def test_rpm_qa() -> None:
    packages = parse_rpm_qa(RPM_QA, "Rocky Linux")
    assert packages == [
        Installed("Rocky Linux", "bash", "5.1.8-9.el9", arch="x86_64"),
        Installed("Rocky Linux", "openssl-libs", "1:3.0.7-27.el9", arch="x86_64"),
        Installed("Rocky Linux", "tzdata", "2024a-1.el9", arch="noarch"),
    ]  # gpg-pubkey is a signing key, not software
    result = detect_and_parse(RPM_QA, ROCKY_9)
    assert (result.kind, result.packages) == ("rpm-qa", packages)
    with pytest.raises(ValueError, match="rpm line 1: expected 3"):
        parse_rpm_qa("bash\t5.1\n")


def test_rpm_nevra() -> None:
    packages = parse_rpm_nevra(RPM_NEVRA, "Red Hat")
    assert [(p.name, p.version, p.arch) for p in packages] == [
        ("bash", "5.1.8-9.el9", "x86_64"),
        ("python3-libs", "3.9.18-3.el9", "x86_64"),
    ]
    result = detect_and_parse(RPM_NEVRA, Distro("Red Hat", "9"))
    assert result.kind == "rpm-nevra"
    assert result.packages[0].ecosystem == "Red Hat"
    assert any("epoch" in note for note in result.notes)


def test_rpm_qa_with_source_rpms_keeps_the_source_name() -> None:
    packages = parse_rpm_qa(RPM_QA_SOURCES, "Rocky Linux")
    assert [(p.name, p.version, p.source_name, p.source_version) for p in packages] == [
        ("bash", "5.1.8-9.el9", "bash", "5.1.8-9.el9"),
        ("openssl-libs", "1:3.0.7-27.el9", "openssl", "1:3.0.7-27.el9"),
        ("glibc-langpack-en", "2.34-100.el9", "glibc", "2.34-100.el9"),
    ]
    result = detect_and_parse(RPM_QA_SOURCES, ROCKY_9)
    assert (result.kind, result.packages, result.binary_names_only) == ("rpm-qa", packages, False)
    assert source_rpm_name("python3.11-3.11.7-1.el9.src.rpm") == "python3.11"
    assert source_rpm_name("kernel-5.14.0-427.el9.nosrc.rpm") == "kernel"
    assert source_rpm_name("(none)") is None


def test_three_columns_need_the_distro_when_arches_do_not_tell() -> None:
    text = "libc6\t2.36-9\ti386\n"  # i386 is both families' spelling
    assert detect_and_parse(text, Distro("Debian", "12")).kind == "dpkg-query-3col"
    assert detect_and_parse(text, ROCKY_9).kind == "rpm-qa"
    with pytest.raises(ValueError, match=r"--distro ubuntu:22\.04"):
        detect_and_parse(text, None)


# -- gpufleet's export ----------------------------------------------------------------------------------


def test_export_round_trip() -> None:
    packages = [
        *parse_dpkg_status(DPKG_STATUS, "Debian"),
        Installed("PyPI", "torch", "2.11.0", location="/usr/local/lib/python3.12/dist-packages"),
        Installed("NVIDIA", "driver", "580.159.04"),
    ]
    text = export_json(packages, Distro("Debian", "12"))
    assert json.loads(text)["format"] == EXPORT_FORMAT
    result = detect_and_parse(text, None)
    assert result == InventoryFile("gpufleet-json", packages, Distro("Debian", "12"), False)
    # An export of a binary-only list keeps saying so.
    apt = parse_apt_list("sudo/focal,now 1.8.31-1ubuntu1.4 amd64 [installed]\n", "Ubuntu")
    assert detect_and_parse(export_json(apt, UBUNTU_20), None).binary_names_only


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"format": EXPORT_FORMAT, "distro": None, "packages": {}}, "packages must be a list"),
        ({"format": EXPORT_FORMAT, "packages": [{"ecosystem": "PyPI", "name": "x"}]}, "package 0: version"),
        ({"format": EXPORT_FORMAT, "packages": [{"ecosystem": "PyPI", "name": "x", "version": "1", "y": 1}]}, "fields"),
        ({"format": EXPORT_FORMAT, "distro": "ubuntu", "packages": []}, "distro must be"),
        ({"format": "something-else/2"}, "not a pip list"),
    ],
)
def test_export_errors(document: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        detect_and_parse(json.dumps(document), None)


# -- what is not accepted ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "distro", "message"),
    [
        ("", None, "no packages in the file"),
        ("# only a comment\n", None, "no packages in the file"),
        ("Hello, world! This is not a package list.\n", None, "not a software list gpufleet reads.*pip freeze"),
        ("{not json", None, "does not parse"),
        ("a\tb\n", None, "2 columns is not dpkg-query or rpm"),
        (DPKG_QUERY_6, None, "names no distribution: give --distro ubuntu:22.04"),
        (DPKG_STATUS, ROCKY_9, "Debian/Ubuntu package list, but the distribution given is Rocky Linux"),
        (RPM_QA, UBUNTU_24, "an RPM package list, but the distribution given is Ubuntu"),
    ],
)
def test_unreadable_input_is_one_clear_error(text: str, distro: Distro | None, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        detect_and_parse(text, distro)
