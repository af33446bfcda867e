"""The escape suite: in each sandbox configuration (the process provider unconfined and under bubblewrap, Docker
with runc and with gVisor's runsc) an agent in a Harbor task's sandbox tries every way out, in one episode per
configuration (escape_suite.py says how; docs/security.md has the table made from these results). CI starts the
Docker engine, with runsc as a runtime, first (`.ci/docker-engine start`)."""

from __future__ import annotations

import pytest
from escape_suite import (
    ALLOWED,
    ATTEMPTS,
    CONFIGURATIONS,
    HOST_CHECKS,
    Configuration,
    EscapeRun,
    Row,
    check_allowed,
    check_attempt,
    check_host,
    run_configuration,
)

pytestmark = pytest.mark.slow

ROWS = {
    "test_the_attempt_is_held": ATTEMPTS,
    "test_the_allowed_path_works": ALLOWED,
    "test_the_host_is_as_it_was": HOST_CHECKS,
}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Every test once per configuration (whose episode is the module-scoped `run`, so the tests are grouped by
    configuration), and the row tests once per row; conftest.py marks each (configuration, row) as its cell of
    docs/security.md's table."""
    params = [pytest.param(c, id=c.name) for c in CONFIGURATIONS.values()]
    metafunc.parametrize("configuration", params, indirect=True, scope="module")
    rows = ROWS.get(metafunc.function.__name__)
    if rows is not None:
        metafunc.parametrize("row", [pytest.param(row, id=row.name) for row in rows])


@pytest.fixture(scope="module")
def configuration(request: pytest.FixtureRequest) -> Configuration:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def run(configuration: Configuration, tmp_path_factory: pytest.TempPathFactory) -> EscapeRun:
    return run_configuration(configuration, tmp_path_factory.mktemp(configuration.name))


def test_the_attempt_is_held(run: EscapeRun, row: Row, request: pytest.FixtureRequest) -> None:
    check_attempt(run, row, request)


def test_the_allowed_path_works(run: EscapeRun, row: Row, request: pytest.FixtureRequest) -> None:
    check_allowed(run, row, request)


def test_the_host_is_as_it_was(run: EscapeRun, row: Row, request: pytest.FixtureRequest) -> None:
    check_host(run, row, request)


def test_the_provider_claims_what_it_must_enforce(run: EscapeRun, configuration: Configuration) -> None:
    missing = sorted(configuration.required - configuration.unclaimed - run.capabilities)
    assert not missing, f"{configuration.label} must enforce {missing} but its provider does not claim them"
