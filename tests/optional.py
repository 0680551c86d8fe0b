"""The optional packages some tests need: peft (LoRA) and ray (the Ray executor).

Both are in rlcycle's dev extras (`rlcycle[lora,ray]`, installed by `bash scripts/dev.sh setup`).
`require(name)` imports one for a test module. When it is missing: under CI=1 a failure (CI must
run those tests, as it must the Docker and vLLM ones: tests/conftest.py), elsewhere a skip of the
module with the reason and the install command.
"""

from __future__ import annotations

import importlib
import os
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
