"""Every test runs without the developer's own site profile or extension-requirement override."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _isolated_site(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.mktemp("xdg-config")))
    for name in (
        "PLATOON_SITE",
        "PLATOON_HARBOR_CACHE",
        "PLATOON_TOOLCHAINS",
        "PLATOON_IGNORE_EXTENSION_REQUIREMENTS",
    ):
        monkeypatch.delenv(name, raising=False)
