"""The escape suite in Docker under gVisor (`provider_options: {runtime: runsc}`): an agent in a Harbor task's
container tries every way out, in one episode (escape_suite.py says how; docs/security.md has the table made from
these results). CI starts the Docker engine, with runsc as a runtime, first (`.ci/docker-engine start`)."""

from __future__ import annotations

import pytest
from escape_suite import (
    ALLOWED,
    ATTEMPTS,
    DOCKER_RUNSC,
    HOST_CHECKS,
    EscapeRun,
    Row,
    check_allowed,
    check_attempt,
    check_host,
    run_configuration,
)

CONFIGURATION = DOCKER_RUNSC
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> EscapeRun:
    return run_configuration(CONFIGURATION, tmp_path_factory.mktemp(CONFIGURATION.name))


@pytest.mark.parametrize("row", CONFIGURATION.rows(ATTEMPTS))
def test_the_attempt_is_held(run: EscapeRun, row: Row, request: pytest.FixtureRequest) -> None:
    check_attempt(run, row, request)


@pytest.mark.parametrize("row", CONFIGURATION.rows(ALLOWED))
def test_the_allowed_path_works(run: EscapeRun, row: Row, request: pytest.FixtureRequest) -> None:
    check_allowed(run, row, request)


@pytest.mark.parametrize("row", CONFIGURATION.rows(HOST_CHECKS))
def test_the_host_is_as_it_was(run: EscapeRun, row: Row, request: pytest.FixtureRequest) -> None:
    check_host(run, row, request)


def test_the_provider_claims_what_it_must_enforce(run: EscapeRun) -> None:
    missing = sorted(CONFIGURATION.required - CONFIGURATION.unclaimed - run.capabilities)
    assert not missing, f"{CONFIGURATION.label} must enforce {missing} but its provider does not claim them"
