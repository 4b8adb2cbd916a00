"""Property-based API tests generated from /openapi.json by schemathesis: whatever it sends,
valid or not, the API answers without a 5xx and as its schema says."""

from __future__ import annotations

from typing import Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (content_type_conformance, negative_data_rejection,
                                               response_schema_conformance, status_code_conformance)

from qforge.api.app import create_app
from qforge.api.server import BackgroundServer
from qforge.settings import Settings

EXAMPLES_PER_OPERATION = 45  # 19 operations (several requests per example): over 1,000 in all
REQUESTS: list[str] = []


# The schema needs no database; the requests go to a server on this test's database.
# (schemathesis.pytest.from_fixture does not work with pytest 9 in schemathesis 4.32.)
schema = schemathesis.openapi.from_dict(create_app("postgresql://unused@/unused").openapi())


@pytest.fixture
def api_url(db_url: str) -> Iterator[str]:
    app = create_app(db_url, settings=Settings(database_url=db_url, api_token=None))
    with BackgroundServer(app) as server:
        yield server.url


# The stream never ends, so it is tested by tests/test_sse.py instead.
@schema.exclude(path="/events/stream").parametrize()
@settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
def test_generated_requests_get_no_5xx_and_match_the_schema(case, api_url):
    response = case.call(base_url=api_url, timeout=30)
    REQUESTS.append(case.operation.label)
    case.validate_response(response, checks=[not_a_server_error, status_code_conformance,
                                             content_type_conformance,
                                             response_schema_conformance,
                                             negative_data_rejection])


def test_enough_requests_were_generated():
    if not REQUESTS:
        pytest.skip("the generated tests did not run in this session")
    assert len(REQUESTS) >= 1000, f"only {len(REQUESTS)} generated requests"
    print(f"schemathesis: {len(REQUESTS)} generated requests")
