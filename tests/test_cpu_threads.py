"""The default thread count is the physical cores this process may run on, counted here
independently from /proc/cpuinfo (distinct physical id / core id pairs)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pydflash2.cpu_threads import default_threads, physical_cores


def cores_from_cpuinfo() -> int:
    allowed = os.sched_getaffinity(0)
    cores, cpu, phys = set(), None, "0"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        key, _, value = (part.strip() for part in line.partition(":"))
        if key == "processor":
            cpu = int(value)
        elif key == "physical id":
            phys = value
        elif key == "core id" and cpu in allowed:
            cores.add((phys, value))
    return len(cores)


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists() or "core id" not in Path("/proc/cpuinfo").read_text(),
                    reason="needs Linux /proc/cpuinfo with core ids")
def test_default_is_the_physical_cores() -> None:
    assert physical_cores() == cores_from_cpuinfo()
    assert default_threads(None) == cores_from_cpuinfo()


def test_explicit_threads_win() -> None:
    assert default_threads(3) == 3
    with pytest.raises(ValueError):
        default_threads(0)
