"""Loading advisories from files, directories and OSV-style zip archives, built from the real fixtures
(tests/fixtures/advisories, provenance in tests/fixtures/SOURCES.md)."""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufleet.assets.advisories.load import AdvisoryError, detect_format, load_path, load_paths

ADVISORIES = Path(__file__).resolve().parents[1] / "fixtures" / "advisories"
OSV_FILES = ("DSA-3029-1.json", "PYSEC-2023-175.yaml", "UBUNTU-CVE-2025-38094.json")


def _zip(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


def test_single_files_of_each_format() -> None:
    loaded = {
        name: [(origin, a.id, a.source) for origin, a in load_path(ADVISORIES / name)]
        for name in ("DSA-3029-1.json", "PYSEC-2023-74.yaml", "nvd-CVE-2023-0184.json", "rhsa-2021_5186.json")
    }
    assert loaded == {
        "DSA-3029-1.json": [(str(ADVISORIES / "DSA-3029-1.json"), "DSA-3029-1", "osv")],
        "PYSEC-2023-74.yaml": [(str(ADVISORIES / "PYSEC-2023-74.yaml"), "PYSEC-2023-74", "osv")],
        "nvd-CVE-2023-0184.json": [(str(ADVISORIES / "nvd-CVE-2023-0184.json"), "CVE-2023-0184", "nvd")],
        "rhsa-2021_5186.json": [
            (str(ADVISORIES / "rhsa-2021_5186.json"), "CVE-2021-4104", "csaf"),
            (str(ADVISORIES / "rhsa-2021_5186.json"), "CVE-2021-4125", "csaf"),
        ],
    }


def test_zip_archive_members_in_name_order(tmp_path: Path) -> None:
    """Like OSV's all.zip: one OSV JSON per member (YAML members are read too)."""
    archive = _zip(tmp_path / "all.zip", {name: (ADVISORIES / name).read_bytes() for name in reversed(OSV_FILES)})
    loaded = [(origin, advisory.id) for origin, advisory in load_path(archive)]
    assert loaded == [
        (f"{archive}:DSA-3029-1.json", "DSA-3029-1"),
        (f"{archive}:PYSEC-2023-175.yaml", "PYSEC-2023-175"),
        (f"{archive}:UBUNTU-CVE-2025-38094.json", "UBUNTU-CVE-2025-38094"),
    ]


def test_zip_yaml_member_keeps_versions_as_text(tmp_path: Path) -> None:
    text = (ADVISORIES / "PYSEC-2021-66.yaml").read_text().replace("- '2.10'", "- 2.10")
    archive = _zip(tmp_path / "pypi.zip", {"PYSEC-2021-66.yaml": text.encode()})
    [(_, advisory)] = list(load_path(archive))
    assert "2.10" in advisory.affected[0].versions


def test_directory_is_read_recursively_in_name_order_skipping_other_files(tmp_path: Path) -> None:
    (tmp_path / "b" / "deeper").mkdir(parents=True)
    shutil.copy(ADVISORIES / "DSA-3029-1.json", tmp_path / "b" / "deeper" / "DSA-3029-1.json")
    shutil.copy(ADVISORIES / "PYSEC-2021-66.yaml", tmp_path / "a.yaml")
    shutil.copy(ADVISORIES / "bsi-2022-0001.json", tmp_path / "b" / "bsi.json")
    _zip(tmp_path / "c.zip", {"x/UBUNTU-CVE-2025-38094.json": (ADVISORIES / "UBUNTU-CVE-2025-38094.json").read_bytes()})
    (tmp_path / "README.md").write_text("not an advisory, and not read")
    loaded = [(origin, advisory.id) for origin, advisory in load_path(tmp_path)]
    assert loaded == [
        (str(tmp_path / "a.yaml"), "PYSEC-2021-66"),
        (str(tmp_path / "b" / "bsi.json"), "CVE-2022-27193"),
        (str(tmp_path / "b" / "deeper" / "DSA-3029-1.json"), "DSA-3029-1"),
        (f"{tmp_path / 'c.zip'}:x/UBUNTU-CVE-2025-38094.json", "UBUNTU-CVE-2025-38094"),
    ]


def test_load_paths_in_the_order_given() -> None:
    ids = [a.id for _, a in load_paths([ADVISORIES / "rhsa-2022_0011.json", ADVISORIES / "DSA-3029-1.json"])]
    assert ids == ["CVE-2020-10188", "DSA-3029-1"]


def test_the_whole_fixture_directory_loads() -> None:
    sources = {a.source for _, a in load_path(ADVISORIES)}
    assert sources == {"osv", "nvd", "csaf"}


def test_not_json_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "broken.json"
    bad.write_text('{"id": "DSA-1", ')
    with pytest.raises(AdvisoryError, match=r"broken\.json: not valid JSON"):
        list(load_path(bad))


def test_not_yaml_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "broken.yaml"
    bad.write_text("id: [unclosed\n")
    with pytest.raises(AdvisoryError, match=r"broken\.yaml: not valid YAML"):
        list(load_path(bad))


def test_json_that_is_no_advisory_names_the_file(tmp_path: Path) -> None:
    other = tmp_path / "nvml-probe.json"
    other.write_text(json.dumps({"devices": [], "driver": "580.159.04"}))
    with pytest.raises(
        AdvisoryError, match=r"nvml-probe\.json: not an OSV, NVD or CSAF advisory \(found: devices, driver\)"
    ):
        list(load_path(other))
    listing = tmp_path / "list.json"
    listing.write_text("[]")
    with pytest.raises(AdvisoryError, match=r"list\.json: not an OSV, NVD or CSAF advisory \(found: list\)"):
        list(load_path(listing))


def test_malformed_osv_record_names_the_file_and_record(tmp_path: Path) -> None:
    bad = tmp_path / "DSA-3029-1.json"
    bad.write_text((ADVISORIES / "DSA-3029-1.json").read_text().replace('"ecosystem": "Debian:7",', ""))
    with pytest.raises(AdvisoryError, match=r"DSA-3029-1\.json: OSV record 'DSA-3029-1': .*needs an ecosystem"):
        list(load_path(bad))


def test_bad_zip_member_names_archive_and_member(tmp_path: Path) -> None:
    archive = _zip(
        tmp_path / "all.zip",
        {"DSA-3029-1.json": (ADVISORIES / "DSA-3029-1.json").read_bytes(), "ZZ-broken.json": b"\x00not json"},
    )
    loaded = load_path(archive)
    origin, advisory = next(loaded)  # members before the bad one are read
    assert (origin, advisory.id) == (f"{archive}:DSA-3029-1.json", "DSA-3029-1")
    with pytest.raises(AdvisoryError, match=r"all\.zip:ZZ-broken\.json: not valid JSON"):
        next(loaded)


def test_not_a_zip_unknown_suffix_and_missing_path(tmp_path: Path) -> None:
    fake = tmp_path / "all.zip"
    fake.write_text("not a zip")
    with pytest.raises(AdvisoryError, match=r"all\.zip: not a readable zip archive"):
        list(load_path(fake))
    text = tmp_path / "notes.txt"
    text.write_text("x")
    with pytest.raises(AdvisoryError, match=r"notes\.txt: not an advisory file"):
        list(load_path(text))
    with pytest.raises(AdvisoryError, match=r"missing\.json: no such file"):
        list(load_path(tmp_path / "missing.json"))


def test_detect_format() -> None:
    def read(name: str) -> object:
        return json.loads((ADVISORIES / name).read_text())

    assert detect_format(read("rhsa-2022_0011.json")) == "csaf"
    assert detect_format(read("nvd-CVE-2024-0132.json")) == "nvd"
    assert detect_format({"vulnerabilities": [{"cve": read("nvd-CVE-2024-0132.json")}]}) == "nvd"
    assert detect_format(read("DSA-3029-1.json")) == "osv"
    # An OSV record whose id is a CVE (as OSV publishes NVD-derived records) is still OSV.
    assert detect_format({"id": "CVE-2024-1", "affected": [], "details": "x"}) == "osv"
    assert detect_format({"vulnerabilities": []}) is None  # neither CSAF nor an NVD response
    assert detect_format([]) is None


# -- a file cut short (issue 23, item 4) -------------------------------------------------------------

OSV_RECORDS = sorted(
    p.name for p in ADVISORIES.iterdir() if p.name.startswith(("DSA-", "PYSEC-", "UBUNTU-", "USN-", "GO-"))
)


def _as_yaml(name: str) -> str:
    """The record as YAML: a PYSEC file as published, a JSON record dumped with its keys in order."""
    text = (ADVISORIES / name).read_text()
    if name.endswith(".yaml"):
        return text
    return yaml.safe_dump(json.loads(text), sort_keys=False, allow_unicode=True, width=100)


def _what_matters(advisory: Any) -> tuple[Any, ...]:
    return (advisory.id, advisory.aliases, advisory.severity, advisory.cvss_score, advisory.summary, advisory.modified)


def _cuts(text: str) -> list[tuple[str, bool]]:
    """(prefix, cut inside a line?) for every line end and the middle of every line."""
    cuts, start = [], 0
    for line in text.splitlines(keepends=True):
        body = line.rstrip("\r\n")
        if len(body) > 1:
            cuts.append((text[: start + len(body) // 2], True))
        start += len(line)
        cuts.append((text[:start], False))
    return cuts[:-1]  # the whole file is not a cut


@pytest.mark.parametrize("name", OSV_RECORDS)
def test_a_cut_yaml_record_is_refused_or_loses_nothing_that_matters(name: str, tmp_path: Path) -> None:
    """Every way of cutting the record short: inside a line it is always refused, naming the file;
    at a line end it is refused, or (when only what follows the required fields went) it still has
    its id, aliases, severity, score, summary and time. Never a record that lost its severity."""
    text = _as_yaml(name)
    [(_, whole)] = list(load_path(_write(tmp_path / "whole.yaml", text)))
    assert whole.modified is not None
    refused = 0
    for number, (prefix, inside_a_line) in enumerate(_cuts(text)):
        path = _write(tmp_path / f"cut{number}.yaml", prefix)
        advisory = _load_or_error(path)
        if isinstance(advisory, AdvisoryError):
            assert str(path) in str(advisory)
            refused += 1
            continue
        assert not inside_a_line, f"cut inside a line was read: {prefix[-80:]!r}"
        assert _what_matters(advisory) == _what_matters(whole), prefix[-200:]
    assert refused > 0


@pytest.mark.parametrize("name", [n for n in OSV_RECORDS if n.endswith(".json")])
def test_a_cut_json_record_is_always_refused(name: str, tmp_path: Path) -> None:
    text = (ADVISORIES / name).read_text().rstrip()
    for number, (prefix, _) in enumerate(_cuts(text)):
        path = _write(tmp_path / f"cut{number}.json", prefix)
        with pytest.raises(AdvisoryError, match=f"{path}.*not valid JSON"):
            list(load_path(path))


def test_a_yaml_cut_at_its_severity_is_refused(tmp_path: Path) -> None:
    """The severity-last layout (yaml.safe_dump's sorted keys) cut where the severity starts."""
    record = json.loads((ADVISORIES / "UBUNTU-CVE-2023-4911.json").read_text())
    text = yaml.safe_dump(record, sort_keys=True, width=100)
    at = text.index("severity:")
    for prefix, why in (
        (text[: at + len("severity:\n")], "ends with 'severity:' and no value"),
        (text[: text.rindex("\n", 0, text.index("type: CVSS_V3", at)) + 1], "needs a type and a score"),
        (text[: text.index("A:H", at) + 2] + "\n", "ends with .*A:' and no value after it"),
        (text.replace("I:H/A:H", "I:H"), "not a valid CVSS vector"),  # a vector missing a metric
        (text[: text.index("A:H", at) + 2], "does not end with a line break"),
    ):
        path = _write(tmp_path / "cut.yaml", prefix)
        with pytest.raises(AdvisoryError, match=why):
            list(load_path(path))
    [(_, whole)] = list(load_path(_write(tmp_path / "whole.yaml", text)))
    assert (whole.severity, whole.cvss_score) == ("high", 7.8)


def _load_or_error(path: Path) -> Any:
    """The one advisory of a file, or the AdvisoryError that refused it."""
    try:
        [(_, advisory)] = list(load_path(path))
    except AdvisoryError as error:
        return error
    return advisory


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path
