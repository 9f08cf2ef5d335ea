"""GET /health once the model is loaded (lifecycle answers it before, and while shutting down):

    200 {"status": "ok"}        serving
    200 {"status": "degraded"}  re-creating the engine after a fault; requests wait and are served after
    503 {"status": "stalled"}   the step loop has made no progress for stall_timeout_s while work is pending
    503 {"status": "error"}     the engine failed beyond recovery
"""

from __future__ import annotations

import time
from typing import Any

from .scheduler import Scheduler


def health(scheduler: Scheduler, stall_timeout_s: float) -> tuple[int, dict[str, Any]]:
    load = scheduler.load()
    faults = scheduler.n_faults
    if scheduler.fatal is not None:
        return 503, {"status": "error", "error": scheduler.fatal, **load}
    quiet_s = time.monotonic() - scheduler.progress_at
    if stall_timeout_s > 0 and quiet_s > stall_timeout_s and scheduler.pending():
        return 503, {"status": "stalled", "no_progress_s": round(quiet_s, 1), "faults": faults, **load}
    if scheduler.recovering:
        return 200, {"status": "degraded", "faults": faults, **load}
    return 200, {"status": "ok", "faults": faults, **load}
