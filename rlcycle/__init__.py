"""rlcycle: real-time reinforcement learning of LLM coding agents from production use.

collect | distill | train | eval | deploy, and `cycle` to chain them. See docs/design.md.
"""

__version__ = "0.1.0"
