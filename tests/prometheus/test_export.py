"""`gpufleet export prometheus|grafana`: the files pass Debian's promtool (check config, check rules,
test rules), the rules agree with gpufleet's own checks, and the CLI needs no prometheus-client."""

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufleet.core.errors import InvalidInput
from gpufleet.monitoring.checks import FATAL_XIDS
from gpufleet.prometheus import grafana, rules, scrape, yamltext
from gpufleet.prometheus.names import (
    ALERTS_FIRING,
    DISK_SERIES,
    GPU_LABELS,
    GPU_SERIES,
    HOST_SERIES,
    IB_SERIES,
    NIC_SERIES,
    NODE_DRAINED,
    NODE_HEALTH,
    NODE_UP,
)
from tests.prometheus_service import run_promtool

# The CLI generates these files on machines without the server's packages or prometheus-client.
BLOCKED = ["prometheus_client", "fastapi", "starlette", "uvicorn", "sqlalchemy", "alembic", "psycopg", "jinja2"]
PROBE = f"""
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {BLOCKED!r}:
            raise ImportError("imported on a CLI-only install: " + name)
        return None
sys.meta_path.insert(0, Block())
from gpufleet.entry import main
sys.argv = ["gpufleet", *sys.argv[1:]]
main()
"""


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"GPUFLEET_CLIENT_CONFIG": str(cwd / "client.toml"), "PATH": "/usr/bin:/bin"},
    )


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("export")
    (out / "token").write_text("gfa_not-a-real-token\n")
    (out / "ca.pem").write_text("")  # promtool checks the files exist, not what they hold
    made = _cli(
        "export",
        "prometheus",
        "--out",
        str(out),
        "--server",
        "https://head.example:8443/gpufleet",
        "--token-file",
        str(out / "token"),
        "--ca-file",
        str(out / "ca.pem"),
        "--scrape-interval",
        "2",
        cwd=out,
    )
    assert made.returncode == 0, made.stderr
    dash = _cli("export", "grafana", "--out", str(out / "dashboard.json"), cwd=out)
    assert dash.returncode == 0, dash.stderr
    return out


def test_the_rules_pass_promtool_check_rules(exported: Path) -> None:
    checked = run_promtool("check", "rules", "gpufleet-rules.yml", cwd=exported)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(rules.alert_rules())} rules found" in checked.stdout


def test_every_rule_passes_its_promtool_unit_test(exported: Path) -> None:
    tested = run_promtool("test", "rules", "gpufleet-rules.test.yml", cwd=exported)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    tests = yaml.safe_load((exported / "gpufleet-rules.test.yml").read_text())["tests"]
    fired = {t["alert_rule_test"][1]["alertname"] for t in tests if t["alert_rule_test"][1]["exp_alerts"]}
    quiet = {t["alert_rule_test"][0]["alertname"] for t in tests if not t["alert_rule_test"][0]["exp_alerts"]}
    assert fired == quiet == {r.name for r in rules.alert_rules()}


def test_promtool_would_notice_a_wrong_expectation(exported: Path, tmp_path: Path) -> None:
    """The unit tests bite: an alert expected with another severity fails them."""
    (tmp_path / "gpufleet-rules.yml").write_text((exported / "gpufleet-rules.yml").read_text())
    test_file = (exported / "gpufleet-rules.test.yml").read_text()
    (tmp_path / "broken.test.yml").write_text(test_file.replace("severity: warning", "severity: info", 1))
    tested = run_promtool("test", "rules", "broken.test.yml", cwd=tmp_path)
    assert tested.returncode != 0
    assert "FAILED" in tested.stdout + tested.stderr


def test_the_scrape_config_passes_promtool_check_config(exported: Path) -> None:
    checked = run_promtool("check", "config", "prometheus.yml", cwd=exported)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    job = yaml.safe_load((exported / "prometheus.yml").read_text())["scrape_configs"][0]
    assert job["scheme"] == "https"
    assert job["metrics_path"] == "/gpufleet/metrics"
    assert job["static_configs"] == [{"targets": ["head.example:8443"]}]
    assert job["authorization"] == {"type": "Bearer", "credentials_file": str(exported / "token")}
    assert (job["scrape_interval"], job["scrape_timeout"]) == ("2s", "2s")


def test_export_never_overwrites_without_force(exported: Path) -> None:
    before = (exported / "prometheus.yml").read_text()
    again = _cli("export", "prometheus", "--out", str(exported), "--server", "http://127.0.0.1:1", cwd=exported)
    assert again.returncode == 4, again.stderr
    assert "--force" in again.stderr
    assert (exported / "prometheus.yml").read_text() == before
    shown = _cli("export", "prometheus", "--out", str(exported), "--dry-run", "--server", "http://h:1", cwd=exported)
    assert shown.returncode == 0
    assert "--- " + str(exported / "prometheus.yml") in shown.stdout
    assert (exported / "prometheus.yml").read_text() == before


def test_the_fatal_xids_are_gpufleets() -> None:
    assert set(rules.FATAL_XID_CODES) == set(FATAL_XIDS)


def test_the_test_series_carry_the_labels_the_head_exposes() -> None:
    gpu_series = [
        s["series"]
        for t in rules.rules_test_document(rules.alert_rules(), "r.yml")["tests"]
        for s in t["input_series"]
        if s["series"].startswith("DCGM_")
    ]
    assert gpu_series
    for series in gpu_series:
        labels = tuple(re.findall(r'(\w+)="', series))
        assert labels == (*GPU_LABELS, "job", "instance"), series


def test_the_rules_use_only_series_gpufleet_exposes() -> None:
    exposed = {s.name for group in (GPU_SERIES, HOST_SERIES, DISK_SERIES, IB_SERIES) for s in group.values()}
    exposed |= {NODE_UP.name, NODE_HEALTH.name, "up"}
    for rule in rules.alert_rules():
        used = set(re.findall(r"\b(DCGM_FI_\w+|gpufleet_\w+|up)\b", rule.expr))
        assert used, rule.name
        assert used <= exposed, (rule.name, used - exposed)


def test_the_temperature_threshold_is_a_parameter() -> None:
    hot = {r.name: r for r in rules.alert_rules(gpu_temp_c=80)}["GpuTemperatureHigh"]
    assert hot.expr == "DCGM_FI_DEV_GPU_TEMP > 80"


@pytest.mark.parametrize(
    ("seconds", "text"), [(5.0, "5s"), (0.5, "500ms"), (60.0, "1m"), (90.0, "90s"), (1.25, "1250ms")]
)
def test_durations(seconds: float, text: str) -> None:
    assert scrape.duration(seconds) == text


@pytest.mark.parametrize("server", ["ftp://head", "head.example:8443", "https://"])
def test_a_bad_server_url_is_refused(server: str) -> None:
    with pytest.raises(InvalidInput):
        scrape.scrape_config(server, 5.0)


def test_a_plain_http_head_gets_no_tls_config() -> None:
    job = scrape.scrape_config("http://[::1]:8080", 0.25, ca_file="/ca.pem")["scrape_configs"][0]
    assert "tls_config" not in job
    assert job["static_configs"] == [{"targets": ["[::1]:8080"]}]
    assert (job["scrape_interval"], job["scrape_timeout"]) == ("250ms", "250ms")


TRICKY: list[Any] = [
    "yes",
    "No",
    "~",
    "1.0",
    "0x10",
    "a: b",
    "#x",
    "",
    " lead",
    "é ✓",
    "line\nbreak",
    '"q"',
    "{{ $v }}",
]


def test_yaml_round_trips_what_a_parser_reads() -> None:
    document = {"tricky": TRICKY, "nested": [{"a": 1, "b": [True, None, 2.5]}, {"empty": {}, "list": []}], "k-1": "x"}
    assert yaml.safe_load(yamltext.dump(document, "a header\n\nwith a gap")) == document


def test_yaml_refuses_what_it_cannot_write() -> None:
    with pytest.raises(TypeError):
        yamltext.dump({"when": object()})


def test_the_grafana_dashboard(exported: Path) -> None:
    board = json.loads((exported / "dashboard.json").read_text())
    assert board == json.loads(json.dumps(grafana.dashboard()))
    assert board["schemaVersion"] >= 39
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    panels = board["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    exprs = [t["expr"] for p in panels for t in p.get("targets", [])]
    used = {name for e in exprs for name in re.findall(r"\b(DCGM_FI_\w+|gpufleet_\w+)\b", e)}
    exposed = {s.name for group in (GPU_SERIES, HOST_SERIES) for s in group.values()}
    exposed |= {NODE_UP.name, NODE_HEALTH.name, NODE_DRAINED.name, ALERTS_FIRING.name}
    assert used <= exposed
    # What the issue asks to see: utilization, memory, temperature, power, Xid, node health, alerts.
    for needed in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE"):
        assert needed in used
    assert {"DCGM_FI_DEV_XID_ERRORS", NODE_HEALTH.name, ALERTS_FIRING.name} <= used


def test_the_cli_probe_would_notice_prometheus_client(tmp_path: Path) -> None:
    probe = PROBE.replace(
        "from gpufleet.entry import main", "import gpufleet.prometheus.exposition\nfrom gpufleet.entry import main"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe, "--help"], capture_output=True, text=True, timeout=60, check=False, cwd=tmp_path
    )
    assert result.returncode != 0
    assert "imported on a CLI-only install: prometheus_client" in result.stderr


def test_the_docs_name_every_series_and_rule() -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "prometheus.md").read_text()
    series = [s.name for group in (GPU_SERIES, HOST_SERIES, DISK_SERIES, NIC_SERIES, IB_SERIES) for s in group.values()]
    series += [NODE_UP.name, NODE_HEALTH.name, NODE_DRAINED.name, ALERTS_FIRING.name]
    missing = [name for name in series if f"`{name}`" not in page]
    missing += [rule.name for rule in rules.alert_rules() if f"| `{rule.name}` |" not in page]
    assert missing == []
