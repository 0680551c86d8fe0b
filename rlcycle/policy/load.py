"""`load_policy(spec)`: one string names a policy, whatever the backend.

    load_policy("runs/demo/policy")          # a model directory -> in-process HFPolicy
    load_policy("http://127.0.0.1:8000")     # an OpenAI-compatible server -> HTTPPolicy
    load_policy("http://127.0.0.1:8000#production")  # ... asking for that model or alias's adapter

Registry aliases (`registry:production`) are resolved by the registry module into a directory
before they reach this function.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlcycle.errors import InputError
from rlcycle.policy.base import Policy


def load_policy(spec: str | Path, **options: Any) -> Policy:
    """A directory → `HFPolicy` (options: HFPolicyConfig fields); http(s)://… → `HTTPPolicy`
    (options: HTTPPolicyConfig fields; `http://host:port#MODEL` sets `model`: a served name, or a
    registry alias / checkpoint whose adapter the server must list, rlcycle/policy/served.py)."""
    text = str(spec)
    if text.startswith(("http://", "https://")):
        from rlcycle.policy.http import HTTPPolicy, HTTPPolicyConfig

        url, _, model = text.partition("#")  # `URL#MODEL`: HTTPPolicyConfig.model, for one reference
        if model:
            options = {**options, "model": model}
        return HTTPPolicy(url, _config(HTTPPolicyConfig, options, text))
    path = Path(text)
    if path.is_dir():
        from rlcycle.policy.hf import HFPolicy, HFPolicyConfig

        return HFPolicy.from_pretrained(path, _config(HFPolicyConfig, options, text))
    raise InputError(
        f"policy {text!r} is neither a model directory nor an http(s):// URL",
        hint="create a model with `rlcycle init-model -o DIR`, or start a server with "
        "`rlcycle serve --policy DIR` and pass its URL",
    )


def _config(cls: type, options: dict[str, Any], spec: str) -> Any:
    import dataclasses

    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(options) - names)
    if unknown:
        raise InputError(
            f"policy {spec}: unknown option(s) {', '.join(unknown)}", hint=f"valid options: {', '.join(sorted(names))}"
        )
    obj = cls(**options)
    problems = obj.validate() if hasattr(obj, "validate") else []
    if problems:
        raise InputError(f"policy {spec}: " + "; ".join(problems), hint=f"see {cls.__name__}")
    return obj
