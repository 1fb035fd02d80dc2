"""GPU tests carry ``@pytest.mark.gpu`` and are skipped, with the reason shown, without a GPU."""

import os

import pytest

from cudarl.testing import gpu_skip_reason, poison_pool


def pytest_collection_modifyitems(config, items):
    reason = gpu_skip_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"GPU test: {reason}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_report_header(config):
    reason = gpu_skip_reason()
    return "cudarl GPU tests: " + ("enabled" if reason is None else f"SKIPPED ({reason})")


@pytest.fixture
def cp():
    """The cupy module, for GPU tests; with ``CUDARL_POISON_POOL=1`` its memory pool poisoned first
    (:func:`cudarl.testing.poison_pool`)."""
    import cupy

    if os.environ.get("CUDARL_POISON_POOL") == "1":
        poison_pool(cupy)
    return cupy


@pytest.fixture
def rng(request):
    """A NumPy generator seeded from the test's name, so each test has fixed, distinct draws."""
    import zlib

    import numpy as np

    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))
