"""Replayable randomness: every test's seed is printed; MHA_TEST_SEED=<n> replays it."""
import os
import random

import pytest


@pytest.fixture
def seed(request):
    value = int(os.environ.get("MHA_TEST_SEED", random.randrange(2**31)))
    print(f"{request.node.name}: MHA_TEST_SEED={value}")
    try:
        import torch
        torch.manual_seed(value)
    except ImportError:
        pass
    return value
