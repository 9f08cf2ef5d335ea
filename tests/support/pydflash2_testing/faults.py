"""Fault injection, for tests only: the server's scheduler hooks (pydflash2.server.scheduler.
SchedulerHooks) driven by a trigger file that the environment variable PYDFLASH2_FAULT_INJECT
names. A test starts `python -m pydflash2_testing.fault_server` (the server's own command line,
with these hooks) instead of `python -m pydflash2.server`; the product never imports this.

Each time the scheduler is about to step the engine it looks for that file;
when present and complete (one line ending in a newline: a writer's half-written
file is left for the next step), the file is consumed (deleted) and its line says
what to do:

    step [HOLD_S]   the engine step raises, as a native error would (every request
                    of that step fails; the engine recovers, and waits HOLD_S
                    seconds first so that a test can see /health say "degraded")
    slot N          delivering slot N's tokens raises (only that slot's request fails)
    stall S         the step sleeps S seconds (the stall watchdog's case)

"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from pydflash2._engine import GenerationError

ENV = "PYDFLASH2_FAULT_INJECT"
log = logging.getLogger("pydflash2.server")


class InjectedFault(GenerationError):
    """Raised where a native call would fail."""


@dataclass
class FaultInjector:
    trigger: Path
    hold_s: float = 0.0  # the recovery's wait, from the last "step" fault
    slot: int | None = None  # a pending "slot N" fault

    @classmethod
    def from_env(cls) -> FaultInjector | None:
        path = os.environ.get(ENV)
        if not path:
            return None
        log.warning("fault injection is ON (%s=%s): a test setting, never for serving", ENV, path)
        return cls(Path(path))

    def before_step(self) -> None:
        try:
            text = self.trigger.read_text()
            if not text.endswith("\n"):  # still being written: steps come faster than a write
                return
            self.trigger.unlink()
        except FileNotFoundError:
            return
        order = text.split()
        log.warning("injected fault: %s", " ".join(order))
        kind, arg = (order + ["", ""])[:2]
        if kind == "step":
            self.hold_s = float(arg or 0)
            raise InjectedFault("injected fault in the engine step")
        if kind == "slot":
            self.slot = int(arg)
        elif kind == "stall":
            time.sleep(float(arg))

    def on_deliver(self, slot: int) -> None:
        if self.slot == slot:
            self.slot = None
            raise InjectedFault(f"injected fault delivering slot {slot}'s tokens")

    def before_recover(self) -> None:
        if self.hold_s > 0:
            time.sleep(self.hold_s)
            self.hold_s = 0.0
