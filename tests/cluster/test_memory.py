"""A replicating leader's memory does not grow with what it replicates."""

from __future__ import annotations

import pytest

from .soak import soak

pytestmark = pytest.mark.slow  # started first when the suite runs in parallel (tests/conftest.py)


def test_a_leader_holds_no_memory_for_what_it_replicated(cluster, client):
    # 192 MB: a leader keeping each replicated byte (it kept about 1.3 bytes per byte
    # before) ends far past the bound; one that keeps nothing stays near its followers.
    result = soak(cluster, client, total_mb=192)
    assert result.within_bound, str(result)
