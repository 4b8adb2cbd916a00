"""Property-based API tests generated from /openapi.json by schemathesis: whatever it sends,
valid or not, the API answers without a 5xx and as its schema says."""

from __future__ import annotations

import secrets
from typing import Iterator

import psycopg
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (content_type_conformance, negative_data_rejection,
                                               response_schema_conformance, status_code_conformance)

from cluster_procs import start_api
from tests.conftest import _create_database, _drop_database
from qforge.api.app import create_app
from qforge.db import with_database
from test_worker_support import Processes
from qforge.api.server import BackgroundServer
from qforge.commands import tokens
from qforge.commands.enqueue import enqueue
from qforge.commands.specs import JobSpec
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


@pytest.fixture
def read_only_api(db_url: str) -> Iterator[tuple[str, str, str]]:
    with psycopg.connect(db_url, autocommit=True) as conn:
        secret = tokens.create_token(conn, "fuzz-reader", "read", actor="test")
        # a job carrying a credential, which the read token must never see
        enqueue(conn, [JobSpec(task="http", payload={"url": "http://127.0.0.1:9/", "headers": {
            "Authorization": HIDDEN}, "env": {"KEY": HIDDEN}}, tags={"fuzz": "yes"})], actor="test")
    app = create_app(db_url, settings=Settings(database_url=db_url, api_token=None))
    with BackgroundServer(app) as server:
        yield server.url, secret, db_url


READ_ONLY_EXAMPLES = 20  # per operation
HIDDEN = "Bearer fuzz-credential"


@schema.exclude(path="/events/stream").parametrize()
@settings(max_examples=READ_ONLY_EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
def test_a_read_only_token_gets_no_5xx_and_no_write_accepted(case, read_only_api):
    url, secret, db_url = read_only_api
    response = case.call(base_url=url, headers={"Authorization": f"Bearer {secret}"}, timeout=30)
    case.validate_response(response, checks=[not_a_server_error])
    assert HIDDEN not in response.text, (case.method, case.path)
    if case.method.upper() not in ("GET", "HEAD") and case.path != "/events/stream-ticket":
        # refused: for the scope (403), or earlier for a malformed body or an unknown route
        # 415: a body that is not application/json (contract §7)
        assert response.status_code in (400, 403, 404, 405, 413, 415), (case.method, case.path, response.status_code)
    with psycopg.connect(db_url) as conn:
        logged = conn.execute("SELECT stream_type, type FROM events ORDER BY position").fetchall()
    assert logged == [("token", "TokenCreated"), ("job", "Enqueued")]  # nothing written since


# --------------------------------------------------------------------------- positive examples, real API
# Valid requests only (schemathesis's positive mode), to a real `qforge api` process: every
# answer must be the one its operation documents, status and body (issue 29: a response model
# that refused what its request model took answered 500).

positive_schema = schemathesis.openapi.from_dict(create_app("postgresql://unused@/unused").openapi())
positive_schema.config.generation.update(modes=[GenerationMode.POSITIVE])
POSITIVE_EXAMPLES = 1  # per operation: a bounded run (the hand-made forms are in test_surface.py)


@pytest.fixture(scope="module")
def live_api(server_url: str, template_database: str, tmp_path_factory) -> Iterator[str]:
    name = f"t_positive_{secrets.token_hex(4)}"
    _create_database(server_url, name, template=template_database)
    folder = tmp_path_factory.mktemp("positive")
    processes = Processes(with_database(server_url, name), folder, folder)
    try:
        yield start_api(processes, timeout=90)[1]
    finally:
        processes.close()
        _drop_database(server_url, name)


# The operations that take a body (their forms are what issue 29 found broken); reads are
# covered by the generated tests above and by test_surface.py.
@positive_schema.include(method=["POST", "PUT", "PATCH"]).exclude(path="/events/stream").parametrize()
@settings(max_examples=POSITIVE_EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
def test_valid_requests_to_a_real_api_get_the_documented_answer(case, live_api):
    response = case.call(base_url=live_api, timeout=30)
    case.validate_response(response, checks=[not_a_server_error, status_code_conformance,
                                             content_type_conformance, response_schema_conformance])
