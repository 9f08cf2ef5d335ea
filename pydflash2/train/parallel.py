"""Where training runs: the torch device and, under `torchrun`, the process group.

One process: rank 0 of 1, no process group. Under `torchrun` (WORLD_SIZE > 1)
every rank trains on its own device (cuda:LOCAL_RANK, or the CPU) in one
process group: nccl on CUDA, gloo on the CPU. Rank 0 alone does what touches
shared files (distillation, export, conversion, evaluation); `main_only` runs
such a stage there and tells every rank how it went, so a failure on rank 0
stops all ranks instead of leaving them waiting in a barrier.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TypeVar

import torch

T = TypeVar("T")

# ranks > 0 wait for rank 0's distillation in a barrier: the default 30 minutes is too short
STAGE_TIMEOUT = timedelta(hours=24)


def resolve_device(spec: str, local_rank: int = 0, world: int = 1) -> torch.device:
    """auto|cpu|cuda|cuda:N|mps -> a torch device ("auto": CUDA, else MPS, else the CPU).
    Under torchrun, cuda means cuda:LOCAL_RANK."""
    spec = spec.strip().lower()
    if spec == "auto":
        if torch.cuda.is_available():
            spec = "cuda"
        elif torch.backends.mps.is_available() and world == 1:
            spec = "mps"
        else:
            spec = "cpu"
    if spec == "cpu":
        return torch.device("cpu")
    if spec == "mps":
        if world > 1:
            raise ValueError("--train-device mps runs in one process only (torch has no MPS process group)")
        if not torch.backends.mps.is_available():
            raise ValueError("--train-device mps: this torch build or machine has no MPS device")
        return torch.device("mps")
    if spec == "cuda" or spec.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise ValueError(f"--train-device {spec}: this torch build or machine has no CUDA device "
                             "(install a CUDA build of torch, or use --train-device cpu)")
        if spec == "cuda":
            index = local_rank if world > 1 else torch.cuda.current_device()
        else:
            if world > 1:
                raise ValueError("under torchrun every rank trains on cuda:LOCAL_RANK: pass --train-device cuda")
            try:
                index = int(spec.split(":", 1)[1])
            except ValueError:
                raise ValueError(f"--train-device {spec}: expected cuda:N") from None
        if not 0 <= index < torch.cuda.device_count():
            raise ValueError(f"--train-device: cuda:{index} does not exist ({torch.cuda.device_count()} CUDA devices)")
        return torch.device("cuda", index)
    raise ValueError(f"--train-device must be auto, cpu, cuda, cuda:N or mps, got {spec!r}")


@dataclass
class Parallel:
    """This process's place in the run."""

    device: torch.device
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world > 1

    def barrier(self) -> None:
        if self.distributed:
            import torch.distributed as dist

            dist.barrier()

    def broadcast_object(self, value: T) -> T:
        """Rank 0's value on every rank."""
        if not self.distributed:
            return value
        import torch.distributed as dist

        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def broadcast_float(self, value: float) -> float:
        """Rank 0's number on every rank (one small collective: cheap enough for every step)."""
        if not self.distributed:
            return value
        import torch.distributed as dist

        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.broadcast(t, src=0)
        return float(t.item())

    def global_sum(self, x: torch.Tensor) -> torch.Tensor:
        """x summed over the ranks (x itself in one process); no gradient flows through it."""
        if not self.distributed:
            return x
        import torch.distributed as dist

        t = x.detach().clone()
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    def main_only(self, stage: Callable[[], T]) -> T:
        """Runs `stage` on rank 0 only; every rank gets its result, or raises its error."""
        result: T | None = None
        error: str | None = None
        if self.is_main:
            try:
                result = stage()
            except Exception as e:  # relayed, then re-raised on rank 0 itself
                error = f"{type(e).__name__}: {e}"
                if not self.distributed:
                    raise
                caught = e
        if self.distributed:
            result, error = self.broadcast_object((result, error))
        if error is not None:
            if self.is_main:
                raise caught
            raise RuntimeError(f"rank 0 failed: {error}")
        return result  # type: ignore[return-value]

    def close(self) -> None:
        if self.distributed:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()


def setup(device: str = "auto") -> Parallel:
    """This process's device, and the process group when torchrun started it."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    dev = resolve_device(device, local_rank, world)
    par = Parallel(dev, rank, world, local_rank)
    if world > 1:
        import torch.distributed as dist

        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        if not dist.is_initialized():
            dist.init_process_group("nccl" if dev.type == "cuda" else "gloo", timeout=STAGE_TIMEOUT,
                                    device_id=dev if dev.type == "cuda" else None)
    return par
