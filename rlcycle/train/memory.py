"""How much memory training takes, and whether the host is about to run out.

`peak_gb(device)` is the figure each step's metrics row records (`peak_memory_gb`): on CUDA the
allocator's peak (`torch.cuda.max_memory_allocated`), on CPU the process's peak resident set
(`getrusage` ru_maxrss: model, optimizer, the packed forward pass's activations and logits).

`pressure(device)` is a warning, or None, after a step. A CPU trainer often shares its host
with a serving engine (vLLM, the sandboxes), and the kernel's OOM killer ends the whole process
without a Python error; the trainer's own peak says nothing about what the *others* hold, so
the rule reads the host: warn when less than `LOW_AVAILABLE` of its memory is still available
(Linux `MemAvailable`, page cache counted as available). In a container with a cgroup v2 memory
limit below the host's (a Kubernetes pod) the limit is what the OOM killer enforces, so that is
read instead: available = memory.max − the working set (memory.current − inactive_file, as the
kubelet counts it). On CUDA the device is the trainer's
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
CGROUP = Path("/sys/fs/cgroup")  # cgroup v2, mounted at this process's own cgroup in a container


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


def cgroup_memory(root: Path | None = None) -> tuple[float, float] | None:
    """(available, limit) GB under a cgroup v2 memory limit at `root` (CGROUP), None without a
    limit (`max`) or without the files (cgroup v1, not Linux)."""
    root = root or CGROUP
    try:
        limit = (root / "memory.max").read_text().strip()
        current = int((root / "memory.current").read_text())
        stat = dict(line.split() for line in (root / "memory.stat").read_text().splitlines() if line.count(" ") == 1)
        if limit == "max":
            return None
        working = current - int(stat.get("inactive_file", 0))
        return max(int(limit) - working, 0) / GB, int(limit) / GB
    except (OSError, ValueError):
        return None


def host_memory() -> tuple[float, float, str] | None:
    """(available, total) GB and what they bound ("host", "cgroup limit"): the tighter of this
    host's memory and a cgroup v2 limit; None where neither is readable."""
    try:
        host = parse_meminfo(MEMINFO.read_text())
    except (OSError, ValueError):
        host = None
    cg = cgroup_memory()
    if cg is not None and (host is None or cg[1] < host[1]):
        return (*cg, "cgroup limit")
    return None if host is None else (*host, "host")


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


def cpu_pressure(host: tuple[float, float, str] | None, peak: float | None) -> str | None:
    """The CPU rule on given numbers (testable without filling a machine)."""
    if host is None:
        return None
    available, total, scope = host
    if available >= LOW_AVAILABLE * total:
        return None
    own = f"this trainer peaked at {peak:.1f} GB; " if peak is not None else ""
    return (
        f"only {available:.1f} of the {scope}'s {total:.1f} GB is still available ({own}anything "
        "sharing it, such as a vLLM server, holds the rest): the kernel's OOM killer may end "
        "this run without an error; lower micro_batch_tokens (docs/performance.md, 'Training memory')"
    )
