"""rlcycle: real-time reinforcement learning of LLM coding agents from production use.

collect | distill | train | eval | deploy, and `cycle` to chain them. See DESIGN.md.
"""

__version__ = "0.1.0"
