"""The escape suite on the process provider unconfined (`provider_options: {confine: none}`): commands run on
the host as platoon's user, with only their network namespace of their own. Nothing is required of it; the table in
docs/security.md says what gets out (escape_suite.py says how)."""

from __future__ import annotations

import pytest
from escape_suite import (
    ALLOWED,
    ATTEMPTS,
    HOST_CHECKS,
    PROCESS_UNCONFINED,
    EscapeRun,
    Row,
    check_allowed,
    check_attempt,
    check_host,
    run_configuration,
)

CONFIGURATION = PROCESS_UNCONFINED
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
