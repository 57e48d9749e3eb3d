"""Markers: tests under tests/integration need the real stack and are marked automatically. Hypothesis
runs without its per-example deadline: on a loaded 2-core CI machine one example descheduled for a
quarter of a second failed a property that holds."""

import pytest
from hypothesis import settings

settings.register_profile("palace", deadline=None)
settings.load_profile("palace")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "/integration/" in str(item.fspath):
            item.add_marker(pytest.mark.integration)
