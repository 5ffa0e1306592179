"""The dashboard's Logs page over HTTP: events by default, every line on request, the filters the API
has, and a clear 400 for a bad filter."""

from __future__ import annotations

import html
import re

import pytest
from fastapi.testclient import TestClient

from gpufleet.core.clock import FakeClock
from gpufleet.core.db import transaction
from gpufleet.inventory import service as inventory
from gpufleet.inventory.schemas import NodeSettings
from gpufleet.logs import store
from tests.api.dashboard_helpers import logged_in, up_node

# Pages, forms and input parsing: HTTP translation, the same on both databases (the domain tests run both).
pytestmark = pytest.mark.one_database

XID79 = "NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
LINK = "mlx5_core 0000:5c:00.0 ibp92s0: Link down"
READY = "IPv6: ADDRCONF(NETDEV_CHANGE): eth0: link becomes ready"


@pytest.fixture
def logged(client: TestClient, clock: FakeClock) -> TestClient:
    ctx = client.app.state.ctx  # type: ignore[attr-defined]
    t0 = clock.now()
    n1 = up_node(client, "gpu01", gpus=4)  # GPU 3's UUID is GPU-gpu01-3
    with transaction(ctx.sessions) as s:
        (n2,) = (n.id for n in inventory.add_nodes(s, clock, ["gpu02"], NodeSettings()))
        store.write_records(
            s,
            [
                {"node_id": n1, "ts": t0 - 300, "source": "/dev/kmsg", "line": READY},
                {
                    "node_id": n1,
                    "ts": t0 - 200,
                    "source": "/dev/kmsg",
                    "line": XID79,
                    "kind": "xid",
                    "code": 79,
                    "severity": "critical",
                    "action": "reboot",
                    "pci_bus": "0000:91:00",
                    "gpu": 3,
                },
                {
                    "node_id": n2,
                    "ts": t0 - 100,
                    "source": "/dev/kmsg",
                    "line": LINK,
                    "kind": "ib_link",
                    "severity": "warning",
                    "action": "warn",
                    "pci_bus": "0000:5c:00",
                },
            ],
        )
    return logged_in(client, "viewer")


def lines(page: str) -> list[str]:
    body = page.split('id="logs"', 1)[1].split("</table>", 1)[0]
    return [
        html.unescape(re.sub(r"<[^>]+>", "", cell)) for cell in re.findall(r'<td class="wrap mono">(.*?)</td>', body)
    ]


def test_the_page_lists_events_newest_first_and_every_line_on_request(logged: TestClient) -> None:
    page = logged.get("/logs")
    assert page.status_code == 200
    assert lines(page.text) == [LINK, XID79]
    assert '<span title="GPU-gpu01-3">GPU 3</span> 0000:91:00' in page.text

    assert 'href="/logs"' in page.text.split('aria-label="Main"', 1)[1].split("</nav>", 1)[0]  # in the top bar
    assert lines(logged.get("/logs?lines=all").text) == [LINK, XID79, READY]


def test_the_api_names_the_gpu_by_its_uuid_from_the_inventory(client: TestClient, logged: TestClient) -> None:
    events = client.get("/api/v1/logs", params={"events": True}).json()
    assert [(e["node"], e["gpu"], e["gpu_uuid"]) for e in events] == [
        ("gpu02", None, None),
        ("gpu01", 3, "GPU-gpu01-3"),
    ]


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("severity=critical", [XID79]),
        ("kind=ib_link", [LINK]),
        ("node=gpu01&lines=all", [XID79, READY]),
        ("q=fallen+bus", [XID79]),
        ("q=becomes+ready&lines=all", [READY]),
        ("q=becomes+ready", []),  # an ordinary line is not an event
        ("since=2020-01-01T00:00", [LINK, XID79]),
        ("until=2020-01-01", []),
    ],
)
def test_the_filters_narrow_the_list(logged: TestClient, query: str, expected: list[str]) -> None:
    page = logged.get(f"/logs?{query}")
    assert page.status_code == 200
    assert lines(page.text) == expected


def test_the_fragment_is_the_live_part_alone(logged: TestClient) -> None:
    fragment = logged.get("/logs?kind=xid", headers={"HX-Request": "true"})
    assert fragment.status_code == 200
    assert fragment.text.lstrip().startswith('<section id="live"')
    assert lines(fragment.text) == [XID79]


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("severity=loud", "severity must be one of info, warning, critical"),
        ("since=yesterday", "since must be a time like"),
        ("since=2026-01-02&until=2026-01-01", "until is before since"),
        ("q=" + "x" * 300, "q is at most 256 characters"),
    ],
)
def test_bad_filters_get_a_clear_400_page(logged: TestClient, query: str, message: str) -> None:
    page = logged.get(f"/logs?{query}")
    assert page.status_code == 400
    assert message in html.unescape(page.text)
