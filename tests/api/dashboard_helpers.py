"""What the dashboard's HTTP tests share: a logged-in browser, nodes that are up with GPUs and
metrics, and reading numbers back out of a page."""

from __future__ import annotations

import re

from fastapi.testclient import TestClient

from gpufleet.core.db import transaction
from gpufleet.inventory import service as inventory
from gpufleet.inventory.schemas import NodeSettings
from gpufleet.inventory.states import NodeState
from gpufleet.monitoring import store
from gpufleet.protocol.inventory import GpuInfo, NodeInventory
from gpufleet.protocol.metrics import EntityValues, Sample

PASSWORD = "correct horse battery"


def logged_in(client: TestClient, role: str = "viewer", username: str = "bob") -> TestClient:
    """A browser (its own cookie jar) logged in as a new user with `role`."""
    made = client.post("/api/v1/users", json={"username": username, "role": role, "password": PASSWORD})
    assert made.status_code == 201, made.text
    browser = TestClient(client.app)
    found = re.search(r'name="csrf" value="([^"]+)"', browser.get("/login").text)
    assert found is not None
    answer = browser.post("/login", data={"username": username, "password": PASSWORD, "csrf": found.group(1)})
    assert answer.status_code == 200
    return browser


def csrf_header(browser: TestClient) -> dict[str, str]:
    """The session's CSRF token as the header app.js sends, read from a page's <meta>."""
    found = re.search(r'<meta name="csrf-token" content="([^"]+)">', browser.get("/nodes").text)
    assert found is not None
    return {"X-CSRF-Token": found.group(1)}


def stat(html: str, card: str) -> str:
    """The number a stat card shows."""
    found = re.search(rf'id="{card}"[^>]*><span class="value[^"]*">([^<]*)<', html)
    assert found is not None, f"no card {card}"
    return found.group(1)


def row_names(html: str, table: str = "nodes") -> list[str]:
    """The node names of a table's rows, in order."""
    body = html.split(f'id="{table}"', 1)[1].split("</table>", 1)[0]
    return re.findall(r'<tr id="([^"]+)" data-node', body)


def up_node(
    client: TestClient,
    name: str,
    gpus: int = 2,
    model: str = "NVIDIA H200",
    category: str | None = None,
    driver: str | None = None,
) -> int:
    """Node `name`, up, with `gpus` GPUs (NVIDIA driver `driver`) in its inventory. Returns its id."""
    ctx = client.app.state.ctx  # type: ignore[attr-defined]
    with transaction(ctx.sessions) as session:
        node = inventory.add_nodes(session, ctx.clock, [name], NodeSettings(category=category))[0]
        inventory.apply_inventory(
            session,
            ctx.clock,
            node,
            NodeInventory(
                hostname=name,
                cpus=64,
                memory_total_mib=1024,
                gpu_source="nvml",
                gpus=[
                    GpuInfo(
                        index=i,
                        uuid=f"GPU-{name}-{i}",
                        model=model,
                        pci_bus_id=f"00000000:{i + 1:02x}:00.0",
                        memory_total_mib=143771,
                        driver_version=driver,
                    )
                    for i in range(gpus)
                ],
            ),
        )
        inventory.transition(session, ctx.clock, node.id, NodeState.NEW, NodeState.UP, "joined")
        return node.id


def write_gpu_sample(
    client: TestClient, node_id: int, utils: list[float], temp_c: float = 40.0, ts: float | None = None
) -> None:
    """One metric sample of the node's GPUs (utilization per GPU), at `ts` (default: now)."""
    ctx = client.app.state.ctx  # type: ignore[attr-defined]
    entities = [
        EntityValues(
            entity=f"gpu:{i}",
            values={
                "gpu_util": u,
                "gpu_temp_c": temp_c,
                "power_w": 100 + u,
                "fb_used_mib": 1000.0,
                "fb_free_mib": 3000.0,
            },
        )
        for i, u in enumerate(utils)
    ]
    sample = Sample(ts=ctx.clock.now() if ts is None else ts, entities=entities)
    with transaction(ctx.sessions) as session:
        store.write_rows(session, store.sample_rows(node_id, [sample]))
