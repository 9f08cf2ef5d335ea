"""The default CPU thread count: the physical cores this process may run on, as llama.cpp's tools
count them (`cpu_get_num_math()` -> `cpu_get_num_physical_cores()`: one thread per core, since a
second hyperthread on a core adds nothing to matrix work and makes ggml's barriers wait).

llama-cpp-python defaults to half the logical CPUs instead, which on a 2-core machine without
hyperthreads is 1 thread: half the speed the machine has. On a machine shared with other busy
processes fewer threads can be faster (docs/python-api.md, "threads"); pass them explicitly there."""

from __future__ import annotations

import os
from pathlib import Path

_SYS_CPU = Path("/sys/devices/system/cpu")


def _allowed_cpus() -> set[int]:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return set(range(os.cpu_count() or 1))


def logical_cpus() -> int:
    """The logical CPUs this process may run on."""
    return len(_allowed_cpus()) or 1


def physical_cores() -> int:
    """Physical cores among the CPUs this process may use (>= 1).

    A core is a distinct set of hardware-thread siblings (sysfs `thread_siblings_list`, as
    llama.cpp reads it); without sysfs, half the logical CPUs when there is more than one."""
    allowed = _allowed_cpus()
    cores: set[str] = set()
    for cpu in allowed:
        siblings = _SYS_CPU / f"cpu{cpu}" / "topology" / "thread_siblings_list"
        try:
            cores.add(siblings.read_text().strip())
        except OSError:
            cores.clear()
            break
    if cores:
        return len(cores)
    n = len(allowed)
    return max(1, n // 2) if n > 1 else 1


def default_threads(n_threads: int | None) -> int:
    """`n_threads` when given, else the physical cores."""
    if n_threads is not None:
        if n_threads < 1:
            raise ValueError(f"threads must be >= 1, got {n_threads}")
        return n_threads
    return physical_cores()
