import multiprocessing

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _no_leftover_processes():
    """Every test must stop the processes it starts."""
    yield
    children = multiprocessing.active_children()
    assert not children, f"processes left running: {children}"
