"""CPU hogs: processes that spin beside a measurement, to show how decoding degrades
under contention (a compiler or another model sharing the cores).

    with CpuHogs(2):
        ...  # measured with two busy processes beside it

Each hog is a separate Python process (not a fork of this one, which may hold a loaded
model and threads) running a busy loop at this process's priority."""

from __future__ import annotations

import subprocess
import sys
from types import TracebackType


class CpuHogs:
    """n busy-loop processes while the context is open (n = 0: nothing)."""

    def __init__(self, n: int) -> None:
        if n < 0:
            raise ValueError(f"the number of CPU hogs must be >= 0, got {n}")
        self.n = n
        self._procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        for _ in range(self.n - len(self._procs)):
            self._procs.append(subprocess.Popen([sys.executable, "-c", "while True: pass"],
                                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL))

    def stop(self) -> None:
        for p in self._procs:
            p.kill()
        for p in self._procs:
            p.wait()
        self._procs.clear()

    def __enter__(self) -> CpuHogs:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
