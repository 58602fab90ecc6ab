import os

import pytest

# Patch failures must fail tests, not degrade to a logged warning.
os.environ.setdefault("TOKENRING_XDIT_STRICT", "1")


@pytest.fixture
def reference():
    """tests/reference.py: exact fp64 attention, its gradients, zigzag / contiguous slicing."""
    from tests import reference as module

    return module
