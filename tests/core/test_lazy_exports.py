"""The lazy exports every package `__init__.py` of platoon-core builds its `__getattr__` and `__dir__` from."""

from __future__ import annotations

import importlib
import json

import pytest

from platoon._lazy import lazy_exports

LAZY_PACKAGES = [
    "platoon",
    "platoon.config",
    "platoon.envs",
    "platoon.envs.ors",
    "platoon.episode",
    "platoon.gateway",
    "platoon.programs",
    "platoon.renderers",
    "platoon.rollouts.workers",
    "platoon.testing",
]


def test_a_name_is_imported_from_its_module_once_and_then_kept():
    namespace = {"__name__": "acme"}
    get, listing = lazy_exports(namespace, {"dumps": "json"}, submodules={"decoder": "json.decoder"})

    assert "dumps" not in namespace
    assert get("dumps") is json.dumps and namespace["dumps"] is json.dumps
    assert get("decoder") is importlib.import_module("json.decoder")
    assert listing() == ["__name__", "decoder", "dumps"]


def test_an_unknown_name_raises_what_python_would():
    get, _listing = lazy_exports({"__name__": "acme"}, {"dumps": "json"})

    with pytest.raises(AttributeError) as raised:
        get("loads")
    assert str(raised.value) == "module 'acme' has no attribute 'loads'"


@pytest.mark.parametrize("package", LAZY_PACKAGES)
def test_every_lazy_package_gives_and_lists_its_public_names(package):
    module = importlib.import_module(package)

    for name in module.__all__:
        assert getattr(module, name) is not None, f"{package}.{name}"
    assert set(module.__all__) <= set(dir(module))
    with pytest.raises(AttributeError, match=rf"^module '{package}' has no attribute 'no_such_name'$"):
        module.no_such_name  # noqa: B018
