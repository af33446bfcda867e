"""The escape suite's support modules (escape_suite.py, attack.py) are importable by name, and each of its
(configuration, row) tests is marked as its cell of docs/security.md's table (`@pytest.mark.escape`, which the
root conftest records)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

# importable only once the path is set
from escape_suite import Configuration, Row


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        configuration, row = params.get("configuration"), params.get("row")
        if isinstance(configuration, Configuration) and isinstance(row, Row):
            item.add_marker(configuration.cell(row))
