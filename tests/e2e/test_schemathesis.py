"""Property-based API tests from the OpenAPI schema (schemathesis), against a real head, as an admin.

Checks: no 5xx, and every documented response matches its schema. A bounded number of examples per
operation keeps this inside the suite's time budget.
"""

from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance
from sqlalchemy.orm import sessionmaker

from gpufleet.api.app import create_app
from gpufleet.core.config import load_settings
from tests.e2e.conftest import ADMIN, Head

pytestmark = pytest.mark.e2e

# The schema does not depend on the database: build it from an app that never serves.
_raw = create_app(load_settings(client_file=Path("/nonexistent")), sessionmaker(), run_loops=False).openapi()
schema = schemathesis.openapi.from_dict(_raw)


@pytest.fixture(scope="module")
def shared_head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Head]:
    head = Head(tmp_path_factory.mktemp("schemathesis")).start()
    yield head
    head.kill()


@schema.parametrize()
@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
def test_api_never_fails_and_matches_its_schema(case: schemathesis.Case, shared_head: Head) -> None:
    case.call_and_validate(
        base_url=shared_head.url,
        headers={"Authorization": f"Bearer {ADMIN}"},
        checks=[not_a_server_error, response_schema_conformance],
    )
