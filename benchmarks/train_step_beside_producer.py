"""One process: seconds per training step on the same stored batches, alone, with the online
producer (llama.cpp distilling SmolLM2) running beside it, and alone again.

    python benchmarks/train_step_beside_producer.py RUN_DIR   (an offline run of
    benchmarks/train_modes_throughput.sh, e.g. /tmp/train_modes/offline2)
"""

import sys
import time

import torch

from pydflash2.models import resolve_target
from pydflash2.train.dataset import Dataset
from pydflash2.train.model import DrafterConfig
from pydflash2.train.online import OnlineStream
from pydflash2.train.parallel import Parallel
from pydflash2.train.prompts import TRAIN_FILE, read_prompts
from pydflash2.train.trainer import (
    Objective,
    TrainSettings,
    build_model,
    loss_and_grads,
    offline_batches,
    split_sequences,
)

torch.set_num_threads(2)
target = resolve_target("smollm2")
st = torch.load(f"{sys.argv[1]}/checkpoint.pt", map_location="cpu", weights_only=False)
cfg = DrafterConfig(**st["config"])
model = build_model(cfg, target)
d = Dataset(f"{sys.argv[1]}/data")
s = TrainSettings(batch_seqs=4)
tr, _ = split_sequences(d, s.val_seqs, 0)
batches = offline_batches(d, tr, s, Parallel(torch.device("cpu")), cfg.block_size)
obj = Objective(model, s, Parallel(torch.device("cpu")))
params = [p for p in model.parameters() if p.requires_grad]


def steps(n: int) -> float:
    t = time.monotonic()
    for i in range(n):
        model.zero_grad(set_to_none=True)
        loss_and_grads(obj, batches(i), torch.device("cpu"), params)
    return (time.monotonic() - t) / n


print("alone", round(steps(3), 2), "s/step", flush=True)
with OnlineStream(target, read_prompts(TRAIN_FILE)[:16], cfg.target_layer_ids, 576, n_seq=8, max_new=32,
                  n_threads=2, queue_size=64) as stream:
    time.sleep(5)
    print("with the producer", round(steps(3), 2), "s/step", flush=True)
print("alone", round(steps(3), 2), "s/step", flush=True)
