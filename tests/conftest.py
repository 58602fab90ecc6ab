import os

import pytest

from tests.speed import ENV, REFERENCE_IMPORT_S, scaled, slowness

# Patch failures must fail tests, not degrade to a logged warning.
os.environ.setdefault("TOKENRING_XDIT_STRICT", "1")


def pytest_configure(config):
    # Measured here, before xdist starts its workers: they and every rank inherit the value.
    slowness()


def pytest_report_header(config):
    return (f"deadlines x{slowness():.2f} ({ENV}; 1 = importing torch takes "
            f"{REFERENCE_IMPORT_S} s, as on the machine they were set on)")  # fmt: skip


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_timeout_set_timer(item, settings):
    """pytest-timeout's limits (the ini's and each mark's) are deadlines like any other."""
    import pytest_timeout

    scaled_settings = settings._replace(timeout=scaled(settings.timeout))
    return pytest_timeout.pytest_timeout_set_timer(item, scaled_settings)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """--dist loadfile (scripts/dev.sh's): files that share a cached launch stay on one worker
    (tests/xdist_scopes.py)."""
    if config.getoption("dist") != "loadfile":
        return None
    from tests.xdist_scopes import SharedLaunchScheduling

    return SharedLaunchScheduling(config, log)


@pytest.fixture
def reference():
    """tests/reference.py: exact fp64 attention, its gradients, zigzag / contiguous slicing."""
    from tests import reference as module

    return module
