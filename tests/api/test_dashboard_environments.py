"""The Environments page: each environment with the driver it needs, how many nodes can run it and why
the others cannot (grouped by driver), and the job templates on offer."""

import pytest
from fastapi.testclient import TestClient

from tests.api.dashboard_helpers import logged_in, up_node

# Pages, forms and input parsing: HTTP translation, the same on both databases (the domain tests run both).
pytestmark = pytest.mark.one_database


def test_environments_show_which_nodes_can_run_them_and_the_templates(client: TestClient) -> None:
    for name, driver in (("new001", "580.159.04"), ("old001", "535.183.01"), ("old002", "535.183.01")):
        up_node(client, name, driver=driver)
    up_node(client, "nodrv01")  # no driver reported yet
    made = client.post(
        "/api/v1/environments",
        json={"name": "pytorch", "version": "24.05", "image": "nvcr.io/nvidia/pytorch:24.05-py3", "cuda": "12.4"},
    )
    assert made.status_code == 201, made.text

    page = logged_in(client).get("/environments")  # a viewer: jobs:read is enough
    assert page.status_code == 200
    row = page.text.split('data-env="pytorch:24.05"', 1)[1].split("</tr>", 1)[0]
    assert "550.54.14" in row
    assert 'data-compatible="1"' in row
    assert "1 of 4" in row
    assert 'data-nodes="old001,old002"' in row
    assert "535.183.01, which runs CUDA up to 12.2" in row
    assert 'data-nodes="nodrv01"' in row
    templates = page.text.split('id="templates"', 1)[1].split("</table>", 1)[0]
    assert 'data-template="torchrun-ddp"' in templates
    assert 'data-template="notebook"' in templates
