"""The production side: an OpenAI-compatible chat endpoint that logs on-policy `completion` events.

    from rlcycle.gateway import GatewayConfig, start
    running = start(GatewayConfig(alias="production", registry="~/.rlcycle/registry", log_dir="logs/gateway", port=0))
    ...  # point any OpenAI client at f"{running.url}/v1"
    running.close()

Modules, top to bottom: stage.py (build, bind, serve) over app.py (the HTTP routes, auth,
idempotency), chat.py (requests ↔ harness ↔ responses and events), completions.py (vLLM's
/v1/completions: token ids in, ids and logprobs out, unlogged), engine.py (checkpoints,
batching, alias router, reloads, canary; `Fixed`, one policy object served as it is),
logwriter.py (crash-safe JSON lines) and config.py.
docs/gateway.md documents the API, the logs and the threat model.
"""

from rlcycle.gateway.config import GatewayConfig
from rlcycle.gateway.stage import Running, build, serve, start

__all__ = ["GatewayConfig", "Running", "build", "serve", "start"]
