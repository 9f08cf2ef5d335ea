#!/bin/sh
# Offline vs online `pydflash2 train` on SmolLM2, alternated twice (ABAB) in one script, 2 threads
# each; prints each run's summary figures. docs/training.md ("Throughput on SmolLM2") is its output.
#   benchmarks/train_modes_throughput.sh [OUT]   (default /tmp/train_modes)
set -eu
PY=${PYTHON:-python}
OUT=$(realpath -m "${1:-/tmp/train_modes}")
COMMON="--target smollm2 --max-prompts 16 --max-new 32 --n-seq 8 --threads 2 --batch 4 --max-steps 6
        --max-minutes 1000 --draft-vocab 0 --eval-prompts 0 --train-device cpu"
cd "$(mktemp -d)"
rm -rf "$OUT"
mkdir -p "$OUT"
for r in 1 2; do
  for mode in offline online; do
    uptime
    extra=""
    [ "$mode" = online ] && extra="--online"
    # shellcheck disable=SC2086
    "$PY" -m pydflash2 train --out "$OUT/$mode$r" $COMMON $extra 2>&1 | grep "data:" || true
    "$PY" -c "import json,sys; s=json.load(open(sys.argv[1])); print(sys.argv[2], {k: s.get(k) for k in
      ('steps', 'train_seconds', 'data_seconds', 'sequences', 'target_tokens', 'feature_mib')})" \
      "$OUT/$mode$r/summary.json" "$mode$r"
  done
done
