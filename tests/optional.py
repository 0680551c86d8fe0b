"""The optional packages some tests need: peft (LoRA) and ray (the Ray executor).

Both are in rlcycle's dev extras (`rlcycle[lora,ray]`, installed by `bash scripts/dev.sh setup`).
`require(name)` imports one for a test module. When it is missing: under CI=1 a failure (CI must
run those tests, as it must the Docker and vLLM ones: tests/conftest.py), elsewhere a skip of the
module with the reason and the install command.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

import pytest

EXTRA = {"peft": "lora", "ray": "ray"}  # the extra of pyproject.toml that installs each


def require(name: str) -> ModuleType:
    """`import name`, or fail (CI=1) / skip the calling module (elsewhere) saying how to install it."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        why = f"{name} is not installed ({e}); `pip install -e '.[{EXTRA.get(name, 'dev')}]'` or `bash scripts/dev.sh setup`"
        if os.environ.get("CI"):
            pytest.fail(f"{why}; CI must run the tests that need {name}", pytrace=False)
        pytest.skip(why, allow_module_level=True)


@contextmanager
def two_node_ray(store: int = 80 * 1024 * 1024) -> Iterator[object]:
    """A real two-node Ray cluster on loopback (`ray.cluster_utils.Cluster`, one CPU a node),
    this process its driver; a dead node is noticed after ~1.5 s of missed health checks."""
    ray = require("ray")
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    fast = {"health_check_period_ms": 500, "health_check_failure_threshold": 3}
    head = {"num_cpus": 1, "object_store_memory": store, "include_dashboard": False, "_system_config": fast}
    cluster = Cluster(initialize_head=True, head_node_args=head)
    cluster.add_node(num_cpus=1, object_store_memory=store)
    ray.init(address=cluster.address, log_to_driver=False)
    cluster.wait_for_nodes()
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
