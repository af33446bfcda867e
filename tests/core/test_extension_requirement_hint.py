"""The requirement `platoon extensions check` suggests to an extension that states none names platoon-core: the
registry's `platoon` is an unrelated project, which an installer would fetch for a bare `platoon>=...`."""

from __future__ import annotations

import pytest

from platoon.cli.extensions import suggested_requirement


@pytest.mark.parametrize(
    ("running", "suggested"),
    [
        ("0.2.0", "platoon-core>=0.2,<0.3"),
        ("1.4.2", "platoon-core>=1.4,<2"),
        ("0.3.0rc1", "platoon-core>=0.3.0rc1,<0.4"),
        ("not a version", "platoon-core>=0.2,<0.3"),
    ],
)
def test_the_suggested_requirement_is_on_platoon_core(running, suggested):
    assert suggested_requirement(running) == suggested
