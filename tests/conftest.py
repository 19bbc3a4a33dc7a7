"""How the test session is shared between pytest-xdist's workers (``-n auto --dist loadgroup``,
pyproject.toml's ``addopts``; ``-n 0`` runs everything in one process).

* A test that uses one of this suite's module- or session-scoped fixtures (often a batch of RTL
  simulations, minutes long) joins the ``xdist_group`` of that fixture, so that the fixture runs
  once, on one worker, not once on each. A test that names its group itself keeps it.
* Tests marked ``slow`` (a Verilator or yosys build, or a simulation of a minute or more) are
  collected first. xdist hands out the groups first (the largest first), then single tests in
  collection order, so the long ones start early and short ones fill the end of the run on both
  workers.
"""

from __future__ import annotations

import pytest

_SHARED_SCOPES = ("module", "package", "session")


def _shared_fixtures(item: pytest.Item) -> list[str]:
    """Names of the module-, package- or session-scoped fixtures of this suite ``item`` uses."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return []
    names = []
    for name in item.fixturenames:
        for fixturedef in info.name2fixturedefs.get(name, ()):
            module = getattr(fixturedef.func, "__module__", "") or ""
            if fixturedef.scope in _SHARED_SCOPES and module.split(".")[0] == "tests":
                names.append(f"{module}::{name}")
                break
    return sorted(names)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            shared = _shared_fixtures(item)
            if shared:
                item.add_marker(pytest.mark.xdist_group("+".join(shared)))
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
