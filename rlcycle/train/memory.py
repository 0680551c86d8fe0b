"""How much memory training takes, and whether the host is about to run out.

`peak_gb(device)` is the figure each step's metrics row records (`peak_memory_gb`): on CUDA the
allocator's peak (`torch.cuda.max_memory_allocated`), on CPU the process's peak resident set
(`getrusage` ru_maxrss: model, optimizer, the packed forward pass's activations and logits).

`pressure(device)` is a warning, or None, after a step. A CPU trainer often shares its host
with a serving engine (vLLM, the sandboxes), and the kernel's OOM killer ends the whole process
without a Python error; the trainer's own peak says nothing about what the *others* hold, so
the rule reads the host: warn when less than `LOW_AVAILABLE` of its memory is still available
(Linux `MemAvailable`, page cache counted as available). On CUDA the device is the trainer's
own: warn when the allocator has reserved more than `HIGH_RESERVED` of it. The remedy either
way is a smaller packed pass (`micro_batch_tokens`, docs/performance.md "Training memory").
"""

from __future__ import annotations

import resource
import sys
from pathlib import Path

import torch

GB = 1e9
LOW_AVAILABLE = 0.15  # CPU: warn when less than this share of the host's memory is available
HIGH_RESERVED = 0.90  # CUDA: warn when the allocator has reserved more than this share
MEMINFO = Path("/proc/meminfo")


def peak_gb(device: torch.device) -> float | None:
    """The peak memory so far in GB (CUDA: allocated on `device`; CPU: this process's RSS)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / GB
    if device.type != "cpu":
        return None
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / GB if sys.platform == "darwin" else rss * 1024 / GB  # bytes on macOS, KiB on Linux


def parse_meminfo(text: str) -> tuple[float, float] | None:
    """(available, total) in GB from /proc/meminfo's text; None without both lines."""
    kib = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name in ("MemAvailable", "MemTotal") and rest.split():
            kib[name] = int(rest.split()[0])
    if len(kib) < 2:
        return None
    return kib["MemAvailable"] * 1024 / GB, kib["MemTotal"] * 1024 / GB


def host_memory() -> tuple[float, float] | None:
    """(available, total) GB of this host, or None where /proc/meminfo is not readable."""
    try:
        return parse_meminfo(MEMINFO.read_text())
    except OSError:
        return None


def pressure(device: torch.device) -> str | None:
    """A warning when this step left the host (CPU) or the device (CUDA) nearly full; else None."""
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        reserved = torch.cuda.max_memory_reserved(device)
        if reserved > HIGH_RESERVED * total:
            return (
                f"the CUDA allocator reserved {reserved / GB:.1f} of {total / GB:.1f} GB on {device}: "
                "a longer batch may not fit; lower micro_batch_tokens (docs/performance.md, 'Training memory')"
            )
        return None
    if device.type != "cpu":
        return None
    return cpu_pressure(host_memory(), peak_gb(device))


def cpu_pressure(host: tuple[float, float] | None, peak: float | None) -> str | None:
    """The CPU rule on given numbers (testable without filling a machine)."""
    if host is None:
        return None
    available, total = host
    if available >= LOW_AVAILABLE * total:
        return None
    own = f"this trainer peaked at {peak:.1f} GB; " if peak is not None else ""
    return (
        f"only {available:.1f} of the host's {total:.1f} GB is still available ({own}anything "
        "sharing the host, such as a vLLM server, holds the rest): the kernel's OOM killer may end "
        "this run without an error; lower micro_batch_tokens (docs/performance.md, 'Training memory')"
    )
