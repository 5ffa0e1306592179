"""`gpufleet doctor`'s checks over plain values, and the probes over real files, databases and sysfs trees."""

from __future__ import annotations

import datetime as dt
import sqlite3
from pathlib import Path

import pytest

from gpufleet.api.pki import InitResult, init_pki
from gpufleet.core.config import load_settings
from gpufleet.core.errors import InvalidInput
from gpufleet.deploy.units import AGENT_UNIT
from gpufleet.doctor import checks, probes, tls_checks
from gpufleet.doctor.checks import (
    DatabaseState,
    DiskState,
    HeadAnswer,
    NvmlState,
    Role,
    Status,
    UnitState,
)
from gpufleet.doctor.command import detect_role, head_url
from tests.e2e.conftest import free_port

NOW = dt.datetime(2026, 6, 1, 12, 0, 0, tzinfo=dt.UTC)
URL = "https://head.example:8080"


def _answer(**kwargs: object) -> HeadAnswer:
    values: dict[str, object] = {"url": URL, "sent": NOW, "received": NOW + dt.timedelta(seconds=0.02)}
    return HeadAnswer(**(values | kwargs))  # type: ignore[arg-type]


def test_the_worst_status_wins() -> None:
    assert checks.worst([]) == Status.ok
    assert checks.worst([Status.ok, Status.warn]) == Status.warn
    assert checks.worst([Status.warn, Status.fail, Status.ok]) == Status.fail


# --- the head, versions, clock ----------------------------------------------------------------------


def test_an_unreachable_head_fails_with_a_fix_for_each_role() -> None:
    answer = _answer(error="[Errno 111] Connection refused")
    head = checks.check_head(answer, Role.head)
    node = checks.check_head(answer, Role.node)
    assert head.status == node.status == Status.fail
    assert "Connection refused" in head.finding
    assert URL in head.finding
    assert "systemctl start gpufleet-server.service" in head.fix
    assert "server setting" in node.fix


def test_a_head_without_its_database_fails() -> None:
    finding = checks.check_head(_answer(status_code=503, health="error"), Role.node)
    assert finding.status == Status.fail
    assert "cannot reach its database" in finding.finding
    assert "--role head" in finding.fix


def test_a_head_that_is_no_gpufleet_head_fails() -> None:
    finding = checks.check_head(_answer(status_code=404), Role.node)
    assert finding.status == Status.fail
    assert "HTTP 404" in finding.finding


def test_a_healthy_head_is_ok() -> None:
    assert checks.check_head(_answer(status_code=200, health="ok"), Role.node).status == Status.ok


def test_versions() -> None:
    assert checks.check_versions("1.2.0", "1.2.0", Role.node).status == Status.ok
    node = checks.check_versions("1.1.0", "1.2.0", Role.node)
    assert node.status == Status.warn
    assert "agent is gpufleet 1.1.0, the head 1.2.0" in node.finding
    assert "gpufleet[agent]==1.2.0" in node.fix
    assert "gpufleet-agent" in node.fix
    head = checks.check_versions("1.3.0", "1.2.0", Role.head)
    assert head.status == Status.warn
    assert "gpufleet server --check-upgrade" in head.fix
    assert checks.check_versions("1.3.0", None, Role.head).status == Status.warn


@pytest.mark.parametrize(
    ("ahead_s", "round_trip_s", "status"),
    [
        (0.0, 0.01, Status.ok),
        (1.0, 0.01, Status.ok),  # within the Date header's second
        (5.0, 0.01, Status.warn),
        (-5.0, 0.01, Status.warn),
        (300.0, 0.01, Status.fail),
        (-300.0, 0.01, Status.fail),
        (3.5, 4.0, Status.ok),  # a slow answer leaves that much uncertainty
    ],
)
def test_the_clock_against_the_heads_date(ahead_s: float, round_trip_s: float, status: Status) -> None:
    head_time = NOW  # the head's clock when it answered, in the middle of the round trip
    sent = head_time + dt.timedelta(seconds=ahead_s - round_trip_s / 2)
    received = sent + dt.timedelta(seconds=round_trip_s)
    date = head_time.replace(microsecond=0)  # the header's whole seconds
    finding = checks.check_clock(sent, received, date)
    assert finding.status == status, finding
    if status != Status.ok:
        assert "timedatectl set-ntp true" in finding.fix
        assert "chrony" in finding.fix
        assert ("ahead of" if ahead_s > 0 else "behind") in finding.finding


def test_no_date_header_is_a_warning() -> None:
    assert checks.check_clock(NOW, NOW, None).status == Status.warn


# --- TLS ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> tuple[InitResult, InitResult]:
    """Two heads' CAs and server certificates, as `gpufleet server init` makes them."""
    root = tmp_path_factory.mktemp("pki")
    return init_pki(root / "a", ["localhost"]), init_pki(root / "b", ["localhost"])


def test_plain_http_to_a_node_is_judged_by_the_plain_http_rule(tmp_path: Path) -> None:
    pinned = tmp_path / "head-ca.pem"
    loopback = tls_checks.check_node_trust("http://127.0.0.1:8080", False, None, pinned, None, None, "x")
    assert loopback.status == Status.ok
    remote = tls_checks.check_node_trust("http://10.0.0.1:8080", False, None, pinned, None, None, "x")
    assert remote.status == Status.fail
    assert "plain HTTP" in remote.finding
    allowed = tls_checks.check_node_trust("http://10.0.0.1:8080", True, None, pinned, None, None, "x")
    assert allowed.status == Status.ok


def test_the_pinned_ca_is_the_served_one(pki: tuple[InitResult, InitResult], tmp_path: Path) -> None:
    a, _ = pki
    pem = a.files.ca_cert.read_text()
    finding = tls_checks.check_node_trust(URL, False, pem, tmp_path / "head-ca.pem", pem, None, "x")
    assert finding.status == Status.ok
    assert a.ca_fingerprint in finding.finding


def test_a_ca_mismatch_fails_with_both_fingerprints(pki: tuple[InitResult, InitResult], tmp_path: Path) -> None:
    a, b = pki
    pinned = tmp_path / "head-ca.pem"
    finding = tls_checks.check_node_trust(
        URL, False, a.files.ca_cert.read_text(), pinned, b.files.ca_cert.read_text(), None, "x"
    )
    assert finding.status == Status.fail
    assert f"the head serves CA {b.ca_fingerprint}, but this node pinned {a.ca_fingerprint}" in finding.finding
    assert str(pinned) in finding.fix
    assert str(tmp_path / "credential.json") in finding.fix
    assert "gpufleet token create" in finding.fix


def test_a_pin_with_no_served_ca_or_garbage_fails(pki: tuple[InitResult, InitResult], tmp_path: Path) -> None:
    pem = pki[0].files.ca_cert.read_text()
    pinned = tmp_path / "head-ca.pem"
    assert "serves no CA" in tls_checks.check_node_trust(URL, False, pem, pinned, None, None, "x").finding
    assert "not a PEM" in tls_checks.check_node_trust(URL, False, pem, pinned, "junk", None, "x").finding
    assert "not a PEM" in tls_checks.check_node_trust(URL, False, "junk", pinned, pem, None, "x").finding


def test_without_a_pin_the_head_must_verify(tmp_path: Path) -> None:
    pinned = tmp_path / "head-ca.pem"
    good = tls_checks.check_node_trust(URL, False, None, pinned, None, None, "the system's CAs")
    assert good.status == Status.ok
    bad = tls_checks.check_node_trust(URL, False, None, pinned, None, "CERTIFICATE_VERIFY_FAILED", "the system's CAs")
    assert bad.status == Status.fail
    assert "CERTIFICATE_VERIFY_FAILED" in bad.finding
    assert "ca_file" in bad.fix


def _files(result: InitResult) -> tuple[Path, Path, Path]:
    return result.files.cert, result.files.key, result.files.ca_cert


def test_a_fresh_server_certificate_is_ok(pki: tuple[InitResult, InitResult]) -> None:
    a, _ = pki
    finding = tls_checks.check_head_tls(_files(a), True, dt.datetime.now(dt.UTC), a.files.ca_cert.read_text())
    assert finding.status == Status.ok, finding
    assert a.ca_fingerprint in finding.finding


def test_a_certificate_near_or_past_its_end(pki: tuple[InitResult, InitResult]) -> None:
    from cryptography import x509

    a, _ = pki
    until = x509.load_pem_x509_certificate(a.files.cert.read_bytes()).not_valid_after_utc
    soon = tls_checks.check_head_tls(_files(a), True, until - dt.timedelta(days=10), None)
    assert soon.status == Status.warn
    assert "in 10 days" in soon.finding
    assert "gpufleet server init --reissue" in soon.fix
    gone = tls_checks.check_head_tls(_files(a), False, until + dt.timedelta(days=1), None)
    assert gone.status == Status.fail
    assert "expired" in gone.finding
    assert f"renew {a.files.cert}" in gone.fix
    early = tls_checks.check_head_tls(_files(a), True, dt.datetime(2000, 1, 1, tzinfo=dt.UTC), None)
    assert early.status == Status.fail
    assert "valid only from" in early.finding


def test_a_certificate_another_ca_signed_or_the_wrong_key(pki: tuple[InitResult, InitResult]) -> None:
    a, b = pki
    now = dt.datetime.now(dt.UTC)
    other_ca = tls_checks.check_head_tls((a.files.cert, a.files.key, b.files.ca_cert), True, now, None)
    assert other_ca.status == Status.fail
    assert "is not signed by the CA" in other_ca.finding
    wrong_key = tls_checks.check_head_tls((a.files.cert, b.files.key, a.files.ca_cert), True, now, None)
    assert wrong_key.status == Status.fail
    assert "is not the key of" in wrong_key.finding


def test_a_head_serving_another_ca_than_its_files_must_restart(pki: tuple[InitResult, InitResult]) -> None:
    a, b = pki
    finding = tls_checks.check_head_tls(_files(a), True, dt.datetime.now(dt.UTC), b.files.ca_cert.read_text())
    assert finding.status == Status.fail
    assert b.ca_fingerprint in finding.finding
    assert a.ca_fingerprint in finding.finding
    assert "systemctl restart gpufleet-server.service" in finding.fix


def test_head_tls_without_certificates(tmp_path: Path) -> None:
    plain = tls_checks.check_head_tls(None, True, NOW, None)
    assert plain.status == Status.warn
    assert "gpufleet server init" in plain.fix
    half = tls_checks.check_head_tls(None, True, NOW, None, error="set both tls_cert and tls_key, or neither")
    assert half.status == Status.fail
    missing = tls_checks.check_head_tls((tmp_path / "c.pem", tmp_path / "k.pem", None), True, NOW, None)
    assert missing.status == Status.fail
    assert "cannot read" in missing.finding


# --- the database ---------------------------------------------------------------------------------


def _sqlite_at(path: Path, revision: str | None) -> str:
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE other (x INTEGER)")
        if revision is not None:
            conn.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL PRIMARY KEY)")
            conn.execute("INSERT INTO alembic_version VALUES (?)", (revision,))
    return f"sqlite:///{path}"


def _newest() -> str:
    return max(p.name.split("_")[0] for p in Path(probes.__file__).parents[1].glob("migrations/versions/0*.py"))


def test_a_database_at_the_newest_revision_is_ok(tmp_path: Path) -> None:
    state = probes.database_state(_sqlite_at(tmp_path / "db", _newest()), 5)
    assert state.current == state.expected == (_newest(),)
    finding = checks.check_database(state, 5)
    assert finding.status == Status.ok
    assert _newest() in finding.finding


def test_pending_migrations_name_check_upgrade(tmp_path: Path) -> None:
    older = f"{int(_newest()) - 2:04d}"
    state = probes.database_state(_sqlite_at(tmp_path / "db", older), 5)
    assert state.pending == 2
    assert not state.unknown
    finding = checks.check_database(state, 5)
    assert finding.status == Status.warn
    assert "2 migration(s) pending" in finding.finding
    assert "gpufleet server --check-upgrade" in finding.fix


def test_a_revision_this_gpufleet_does_not_know_fails(tmp_path: Path) -> None:
    state = probes.database_state(_sqlite_at(tmp_path / "db", "9999"), 5)
    assert state.unknown == ("9999",)
    finding = checks.check_database(state, 5)
    assert finding.status == Status.fail
    assert "does not know" in finding.finding


def test_no_schema_and_no_file_are_warnings(tmp_path: Path) -> None:
    empty = probes.database_state(_sqlite_at(tmp_path / "db", None), 5)
    assert empty.current == ()
    assert checks.check_database(empty, 5).status == Status.warn
    missing = probes.database_state(f"sqlite:///{tmp_path / 'none.db'}", 5)
    assert missing.missing
    assert not (tmp_path / "none.db").exists()  # looking created nothing
    assert checks.check_database(missing, 5).status == Status.warn


def test_an_unreachable_database_fails_with_its_fix() -> None:
    url = f"postgresql+psycopg://gpufleet:secret@127.0.0.1:{free_port()}/gpufleet"
    state = probes.database_state(url, 2)
    assert state.error is not None
    assert "secret" not in state.url  # the password is never shown
    finding = checks.check_database(state, 2)
    assert finding.status == Status.fail
    assert "cannot reach the database" in finding.finding
    assert "127.0.0.1" in finding.finding
    assert "database_url" in finding.fix
    assert "pg_isready" in finding.fix


def test_a_malformed_database_url_fails() -> None:
    state = probes.database_state("not a url", 2)
    assert state.error is not None
    assert checks.check_database(state, 2).status == Status.fail


def test_check_database_wording() -> None:
    state = DatabaseState(url="u", current=("0001",), expected=("0002",), pending=1)
    assert checks.check_database(state, 5).status == Status.warn


# --- the node's credential and GPUs ----------------------------------------------------------------


def test_credential(tmp_path: Path) -> None:
    path = tmp_path / "credential.json"
    assert checks.check_credential(path, "gpu1", URL, None, URL).status == Status.ok
    other = checks.check_credential(path, "gpu1", URL, None, "https://other:8080")
    assert other.status == Status.warn
    assert URL in other.fix
    none = checks.check_credential(path, None, None, None, URL)
    assert none.status == Status.warn
    assert "--join-token" in none.fix
    broken = checks.check_credential(path, None, None, "corrupt credential file", URL)
    assert broken.status == Status.fail
    assert f"delete {path}" in broken.fix


def test_no_nvml_on_a_machine_without_nvidia_gpus_is_a_warning() -> None:
    finding = checks.check_nvml(NvmlState(error="NVML Shared Library Not Found"), None)
    assert finding.status == Status.warn
    assert finding.finding.startswith("no NVML (no NVIDIA driver?)")


def test_no_nvml_where_gpus_are_expected_fails() -> None:
    on_the_bus = checks.check_nvml(NvmlState(error="Driver Not Loaded", pci_gpus=8), None)
    assert on_the_bus.status == Status.fail
    assert "8 NVIDIA GPU(s)" in on_the_bus.finding
    assert "NVIDIA driver" in on_the_bus.fix
    told = checks.check_nvml(NvmlState(error="NVML Shared Library Not Found"), True)
    assert told.status == Status.fail
    assert "--expect-gpus" in told.finding
    not_told = checks.check_nvml(NvmlState(error="Driver Not Loaded", pci_gpus=8), False)
    assert not_told.status == Status.warn
    library = checks.check_nvml(NvmlState(error="nvidia-ml-py is not installed"), True)
    assert "gpufleet[agent]" in library.fix


def test_nvml_counts() -> None:
    ok = checks.check_nvml(NvmlState(gpus=8, driver="580.65.06", pci_gpus=8), None)
    assert ok.status == Status.ok
    assert "8 GPU(s), driver 580.65.06" in ok.finding
    lost = checks.check_nvml(NvmlState(gpus=7, pci_gpus=8), None)
    assert lost.status == Status.warn
    assert "xid" in lost.fix
    none = checks.check_nvml(NvmlState(gpus=0), True)
    assert none.status == Status.fail
    cpu_node = checks.check_nvml(NvmlState(gpus=0), None)
    assert cpu_node.status == Status.ok


def test_pci_gpus_counts_nvidia_display_controllers_only(tmp_path: Path) -> None:
    for name, vendor, klass in [
        ("0000:17:00.0", "0x10de", "0x030200"),  # H100: 3D controller
        ("0000:65:00.0", "0x10de", "0x030000"),  # a VGA one
        ("0000:05:00.0", "0x10de", "0x068000"),  # NVSwitch: a bridge
        ("0000:00:02.0", "0x8086", "0x030000"),  # Intel graphics
    ]:
        device = tmp_path / name
        device.mkdir()
        (device / "vendor").write_text(vendor + "\n")
        (device / "class").write_text(klass + "\n")
    assert probes.pci_gpus(tmp_path) == 2
    assert probes.pci_gpus(tmp_path / "absent") == 0


def test_nvml_probe_answers_either_way(tmp_path: Path) -> None:
    state = probes.nvml_state(tmp_path)
    assert (state.gpus is None) == (state.error is not None)
    assert state.pci_gpus == 0


# --- systemd and the disk ---------------------------------------------------------------------------


def test_a_missing_unit_fails_with_install_unit(tmp_path: Path) -> None:
    head = checks.check_unit(Role.head, tmp_path, False, None)
    assert head.status == Status.fail
    assert f"gpufleet-server.service is not in {tmp_path}" == head.finding
    assert head.fix == "`gpufleet server install-unit`"
    node = checks.check_unit(Role.node, tmp_path, False, None)
    assert node.fix == "`gpufleet agent install-unit`"


def test_unit_states(tmp_path: Path) -> None:
    assert checks.check_unit(Role.node, tmp_path, True, None).status == Status.ok
    assert checks.check_unit(Role.node, tmp_path, True, UnitState("enabled", "active")).status == Status.ok
    stopped = checks.check_unit(Role.node, tmp_path, True, UnitState("enabled", "failed"))
    assert stopped.status == Status.fail
    assert "systemctl enable --now gpufleet-agent.service" in stopped.fix
    assert "journalctl" in stopped.fix
    disabled = checks.check_unit(Role.head, tmp_path, True, UnitState("disabled", "active"))
    assert disabled.status == Status.warn
    assert disabled.fix == "`systemctl enable gpufleet-server.service`"


def test_systemd_running_looks_at_its_marker(tmp_path: Path) -> None:
    assert not probes.systemd_running(tmp_path / "absent")


def test_disk_thresholds(tmp_path: Path) -> None:
    ok = checks.check_disk(DiskState(tmp_path, tmp_path, 50 * 10**9, 100 * 10**9), 5, 5)
    assert ok.status == Status.ok
    assert "50.00 GB free of 100.00 GB (50.0 %)" in ok.finding
    low = checks.check_disk(DiskState(tmp_path, tmp_path, 2 * 10**9, 100 * 10**9), 5, 1)
    assert low.status == Status.fail
    assert f"{tmp_path}: 2.00 GB free" in low.finding
    assert "below 5 GB or 1 %" in low.finding
    assert str(tmp_path) in low.fix
    full = checks.check_disk(DiskState(tmp_path, tmp_path, 30 * 10**9, 1000 * 10**9), 5, 5)
    assert full.status == Status.fail
    assert "(3.0 %)" in full.finding


def test_disk_of_a_directory_not_made_yet(tmp_path: Path) -> None:
    state = probes.disk_state(tmp_path / "a" / "b", "state")
    assert state.measured == tmp_path
    assert state.total > 0
    assert state.error is None
    finding = checks.check_disk(state, 0, 0)
    assert finding.status == Status.ok
    assert "does not exist yet" in finding.finding
    assert finding.check == "disk (state)"


# --- the command's wiring -----------------------------------------------------------------------------


def test_the_role_is_told_by_what_the_machine_holds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFLEET_CLIENT_CONFIG", str(tmp_path / "client.toml"))
    units = tmp_path / "units"
    units.mkdir()
    settings = load_settings(data_dir=tmp_path / "data", agent_state_dir=tmp_path / "agent")
    with pytest.raises(InvalidInput, match="--role head or --role node"):
        detect_role(settings, units)
    (units / AGENT_UNIT).touch()
    assert detect_role(settings, units) == Role.node
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "gpufleet.db").touch()
    assert detect_role(settings, units) == Role.head


def test_the_head_is_asked_at_its_listen_address(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFLEET_CLIENT_CONFIG", str(tmp_path / "client.toml"))
    assert head_url(load_settings(data_dir=tmp_path, listen="0.0.0.0:9000")) == "http://127.0.0.1:9000"
    assert head_url(load_settings(data_dir=tmp_path, listen="[::]:9000")) == "http://[::1]:9000"
    init_pki(tmp_path / "tls", ["localhost"])
    assert head_url(load_settings(data_dir=tmp_path, listen="10.1.2.3:8443")) == "https://10.1.2.3:8443"
