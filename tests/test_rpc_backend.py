"""Every drafter/target placement on ggml's RPC backend, the stand-in here for
CUDA/Metal: its buffers are not host memory, and its ops run on this CPU's
kernels in another process, so results must equal the all-CPU ones bit for bit.

The module starts two ggml RPC servers on 127.0.0.1 (child processes calling
ggml_backend_rpc_start_server from llama_cpp's libggml-rpc.so) and stops them
at the end. RPC devices, once registered, stay in the process's ggml registry
(and "auto" would pick them), so every scenario that uses them runs in a client
child process: this file run as a script. A scenario that aborts shows up as a
failed child with its exit status, not as a dead test run.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np
import pytest
from lossless import greedy_generate

pytestmark = pytest.mark.build  # every claim here changes with the build (tier 2)

RPC_AVAILABLE = bool(llama_cpp.llama_supports_rpc())
LIB_DIR = Path(llama_cpp.__file__).resolve().parent / "lib"
HOT_OFFSET = 6

# child process body of one RPC server: serves this machine's CPU backend
SERVER_SCRIPT = r"""
import ctypes, sys
lib_dir, endpoint, n_threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
ggml = ctypes.CDLL(lib_dir + "/libggml.so", mode=ctypes.RTLD_GLOBAL)
rpc = ctypes.CDLL(lib_dir + "/libggml-rpc.so", mode=ctypes.RTLD_GLOBAL)
ggml.ggml_backend_load_all.restype = None
ggml.ggml_backend_dev_by_type.restype = ctypes.c_void_p
ggml.ggml_backend_dev_by_type.argtypes = [ctypes.c_int]
cpu = ggml.ggml_backend_dev_by_type(0)  # GGML_BACKEND_DEVICE_TYPE_CPU
assert cpu, "no CPU device"
devices = (ctypes.c_void_p * 1)(cpu)
rpc.ggml_backend_rpc_start_server.restype = None
rpc.ggml_backend_rpc_start_server.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t,
                                              ctypes.POINTER(ctypes.c_void_p)]
# endpoint, cache_dir (none), n_threads, n_devices, devices: serves until killed
rpc.ggml_backend_rpc_start_server(endpoint.encode(), None, n_threads, 1, devices)
"""


# ---------------------------------------------------------------- scenarios (run in the client child, or here on CPU)


def drafter_cycles(drafter: str, target: str, device: str, seed: int, n_cycles: int) -> list[dict[str, Any]]:
    """Inject / propose / truncate cycles of varying shapes; every proposal's output."""
    from pydflash2 import Drafter

    rng = np.random.default_rng(seed)
    out: list[dict[str, Any]] = []
    with Drafter(drafter, target, n_ctx=600, n_threads=1, device=device) as d:
        pos = 0
        for cycle in range(n_cycles):
            m = int(rng.integers(1, 12)) if cycle else 200  # chunked (> 64 rows); the cache later crosses 256 rows
            feats = rng.standard_normal((m, d.feature_width)).astype(np.float32)
            d.inject(feats, np.arange(pos, pos + m))
            pos += m
            for _ in range(int(rng.integers(1, 3))):  # propose once or twice in a row (graph reuse)
                n = int(rng.integers(2, d.block_size + 1))
                p = d.propose(int(rng.integers(0, d.n_vocab)), pos, n)
                path = d.select_path("greedy")
                rec = {"cycle": cycle, "n": n, "tokens": path.tokens.tolist()}
                if p.candidates is not None:
                    rec["candidates"] = p.candidates.tolist()
                    rec["scores"] = p.scores.tolist()
                else:
                    rec["logits"] = p.logits.tolist()
                out.append(rec)
            if cycle % 3 == 2:  # rollback: drop the last rows, recommit others next cycle
                pos -= int(rng.integers(1, 4))
                d.truncate(pos)
        out.append({"info": d.info})
    return out


def make_llm(target: str, placement: str, devices: list[str], tree_budget: int = 0,
             context_drafts: str = "off") -> llama_cpp.Llama:
    """placement: "cpu"; a device name (whole model there); "split" (layers over every RPC device).
    tree_budget > 0 or context drafts: a context for tree verification (as load_target makes it)."""
    from pydflash2._engine import EngineConfig

    config = EngineConfig(n_max="auto", tree_budget=tree_budget).with_context(context_drafts)
    kw: dict[str, Any] = {"n_gpu_layers": 0}
    if placement == "split":
        kw = {"n_gpu_layers": 99, "split_mode": llama_cpp.LLAMA_SPLIT_MODE_LAYER}
    elif placement != "cpu":
        # llama.cpp numbers the GPU-type devices it sees: main_gpu picks one of them
        kw = {"n_gpu_layers": 99, "split_mode": llama_cpp.LLAMA_SPLIT_MODE_NONE, "main_gpu": devices.index(placement)}
    from pydflash2.speculator import with_lazy_head

    llm = llama_cpp.Llama(target, n_ctx=512, n_batch=512, n_threads=1, n_threads_batch=1, verbose=False,
                          flash_attn=config.trees, **kw)
    if config.trees:  # the context with_lazy_head makes takes these
        llm.context_params.n_seq_max = config.target_sequences()
        llm.context_params.kv_unified = True
    # with the lazy LM head: on a device placement its head runs on that device
    return with_lazy_head(llm)


def speculate(target: str, drafter: str, placement: str, device: str, prompts: list[str], n_max: int,
              max_tokens: int, devices: list[str], tree_budget: int = 0, context_drafts: str = "off") -> dict[str, Any]:
    """Greedy generations, a stream, a cancelled stream, and a sampled run of one configuration."""
    from pydflash2 import Speculator

    llm = make_llm(target, placement, devices, tree_budget, context_drafts)
    res: dict[str, Any] = {"plain": {p: greedy_generate(llm, p, max_tokens) for p in prompts}}
    with Speculator(llm, drafter, n_max=n_max, device=device, tree_budget=tree_budget,
                    context_drafts=context_drafts) as spec:
        res["drafter_device"] = spec.drafter.device if spec.drafter else None
        res["greedy"] = {}
        drafted = accepted = lazy_rows = context_accepted = 0
        for p in prompts:
            c = spec.generate(p, max_tokens=max_tokens, chat=False)
            res["greedy"][p] = c.tokens
            drafted += sum(c.stats["drafted_per_position"])
            accepted += sum(c.stats["accepted_per_position"])
            lazy_rows += c.stats["lazy_head_rows"]
            context_accepted += c.stats.get("context_accepted", 0)
        res["drafted"], res["accepted"], res["lazy_head_rows"] = drafted, accepted, lazy_rows
        res["context_accepted"] = context_accepted
        res["stream"] = "".join(spec.stream(prompts[0], max_tokens=max_tokens, chat=False))
        gen = spec.stream(prompts[1], max_tokens=max_tokens, chat=False)
        next(gen)
        gen.close()  # cancelled mid-generation
        res["after_cancel"] = spec.generate(prompts[2], max_tokens=max_tokens, chat=False).tokens
        res["sampled"] = [spec.generate(prompts[0], max_tokens=max_tokens, chat=False, temperature=0.8, seed=s).tokens
                          for s in (1, 1, 2)]
    return res


def device_errors(drafter: str, target: str) -> dict[str, Any]:
    from pydflash2 import Drafter, DrafterError
    from pydflash2.devices import resolve_device

    res: dict[str, Any] = {"auto": resolve_device("auto")}
    try:
        Drafter(drafter, target, device="NoSuchDevice")
    except DrafterError as e:
        res["unknown"] = str(e)
    return res


def stale_graph(drafter: str, target: str, device: str) -> dict[str, Any]:
    """inject -> propose -> inject -> propose with split graphs reused across schedules (the
    PYDFLASH2_DEBUG_REUSE_SPLIT_GRAPHS test hook: the behaviour that made ggml assert)."""
    from pydflash2 import Drafter, DrafterError

    rng = np.random.default_rng(5)
    res: dict[str, Any] = {}
    with Drafter(drafter, target, n_ctx=256, n_threads=1, device=device) as d:
        d.inject(rng.standard_normal((10, d.feature_width)).astype(np.float32), np.arange(10))
        res["first"] = d.propose(7, 10, 4).scores.tolist()
        d.inject(rng.standard_normal((1, d.feature_width)).astype(np.float32), [10])
        try:
            d.propose(7, 11, 4)
            res["error"] = None
        except DrafterError as e:
            res["error"] = str(e)
        res["n_cached"] = d.n_cached
        res["retry"] = d.propose(7, 11, 4).scores.tolist()  # the drafter stays usable
    return res


def speculator_rpc_servers(target: str, drafter: str, endpoints: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    """Speculator(rpc_servers=..., n_gpu_layers=99) from a target path; the servers are registered already."""
    from pydflash2 import Speculator, native_info

    with Speculator(target, drafter, n_ctx=512, n_threads=1, n_max=3, device="RPC1", rpc_servers=endpoints,
                    n_gpu_layers=99) as spec:
        tokens = spec.generate(prompt, max_tokens=max_tokens, chat=False).tokens
    return {"tokens": tokens, "devices": [d["name"] for d in native_info()["devices"]]}


def train_eval(target: str, drafter: str, device: str, prompts: list[str], max_tokens: int) -> dict[str, Any]:
    """`pydflash2 train`'s engine evaluation of a drafter, placed on `device`."""
    from pydflash2.train.evaluate import evaluate_drafter

    return evaluate_drafter(target, drafter, prompts, max_tokens=max_tokens, device=device, n_threads=1, n_ctx=512,
                            chat=False)


SCENARIOS = {
    "drafter_cycles": drafter_cycles,
    "train_eval": train_eval,
    "speculate": speculate,
    "speculator_rpc_servers": speculator_rpc_servers,
    "device_errors": device_errors,
    "stale_graph": stale_graph,
}


def client_main(request: dict[str, Any]) -> None:
    """Child process: registers the RPC servers, runs one scenario, prints its result as JSON."""
    from pydflash2.devices import add_rpc_servers

    devices = add_rpc_servers(request["servers"])
    kwargs = dict(request["kwargs"])
    if request["scenario"] == "speculate":
        kwargs["devices"] = devices
    result = SCENARIOS[request["scenario"]](**kwargs)
    print("RESULT " + json.dumps({"devices": devices, "result": result}), flush=True)


# ---------------------------------------------------------------- fixtures


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_listening(port: int, proc: subprocess.Popen, log: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"RPC server exited with {proc.returncode}: {log.read_text()}")
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"RPC server on port {port} did not start: {log.read_text()}")


@pytest.fixture(scope="module")
def rpc_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    from conftest import require_build_feature

    require_build_feature(RPC_AVAILABLE, "the ggml RPC backend (CMAKE_ARGS=-DGGML_RPC=ON)")
    logs = tmp_path_factory.mktemp("rpc")
    procs: list[subprocess.Popen] = []
    endpoints = []
    try:
        for i in range(2):
            port = free_port()
            endpoint = f"127.0.0.1:{port}"
            log = logs / f"server{i}.log"
            with open(log, "w") as f:
                proc = subprocess.Popen([sys.executable, "-c", SERVER_SCRIPT, str(LIB_DIR), endpoint, "1"],
                                        stdout=f, stderr=subprocess.STDOUT)
            procs.append(proc)
            wait_listening(port, proc, log)
            endpoints.append(endpoint)
        yield endpoints
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def run_client(servers: list[str], scenario: str, timeout: float = 300, env_extra: dict[str, str] | None = None,
               **kwargs: Any) -> dict[str, Any]:
    request = {"servers": ",".join(servers), "scenario": scenario, "kwargs": kwargs}
    env = dict(os.environ, **(env_extra or {}))
    r = subprocess.run([sys.executable, __file__, json.dumps(request)], capture_output=True, text=True,
                       timeout=timeout, env=env)
    lines = [line for line in r.stdout.splitlines() if line.startswith("RESULT ")]
    assert r.returncode == 0 and lines, f"client exited with {r.returncode}:\n{r.stderr[-4000:]}"
    return json.loads(lines[-1][len("RESULT "):])


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    import pydflash2_testing as testing

    d = tmp_path_factory.mktemp("rpc-models")
    hot = tuple(testing.FIRST_MERGED_ID + i for i in range(HOT_OFFSET))
    target = testing.make_target_gguf(d / "target.gguf", testing.TargetSpec(hot_tokens=hot))
    v2 = testing.make_drafter_checkpoint(d / "v2-hf", target, testing.DrafterSpec(version=2))
    v1 = testing.make_drafter_checkpoint(d / "v1-hf", target, testing.DrafterSpec(version=1, seed=7))
    return {
        "target": str(target),
        "v2": str(testing.checkpoint_to_gguf(v2, target, d / "v2.gguf")),
        "v1": str(testing.checkpoint_to_gguf(v1, target, d / "v1.gguf")),
    }


# prompts on which the fixture drafter gets some drafts accepted and others rejected
PROMPTS = ["Water boils at", "The capital of France", "It learned to guess", "42"]
MAX_TOKENS = 20


@pytest.fixture(scope="module")
def cpu_reference(models) -> dict[str, list[int]]:
    llm = make_llm(models["target"], "cpu", [])
    return {p: greedy_generate(llm, p, MAX_TOKENS) for p in PROMPTS}


# ---------------------------------------------------------------- tests


@pytest.mark.parametrize("version", ["v2", "v1"])
def test_drafter_on_rpc_is_bit_identical_to_cpu(rpc_servers, models, version) -> None:
    args = dict(drafter=models[version], target=models["target"], seed=3, n_cycles=24)
    got = run_client(rpc_servers, "drafter_cycles", device="RPC0", **args)
    assert got["devices"] == ["RPC0", "RPC1"]
    rpc = got["result"]
    cpu = drafter_cycles(device="CPU", **args)
    assert rpc[-1]["info"]["device"] == "RPC0" and cpu[-1]["info"]["device"] == "CPU"
    assert len(rpc) == len(cpu) > 30
    for a, b in zip(rpc[:-1], cpu[:-1], strict=True):
        assert a == b, f"cycle {a['cycle']}, n {a['n']}: RPC and CPU proposals differ"


@pytest.mark.parametrize("placement, device", [
    ("cpu", "RPC0"),      # drafter on the device, target on the CPU
    ("RPC0", "CPU"),      # target on the device, drafter on the CPU
    ("RPC0", "RPC0"),     # both on one device
    ("RPC0", "RPC1"),     # target and drafter on different devices
    ("split", "RPC1"),    # target split over both servers by llama.cpp's RPC backend
])
def test_speculator_placements_give_the_cpu_tokens(rpc_servers, models, cpu_reference, placement, device) -> None:
    res = run_client(rpc_servers, "speculate", target=models["target"], drafter=models["v2"], placement=placement,
                     device=device, prompts=PROMPTS, n_max=3, max_tokens=MAX_TOKENS)["result"]
    assert res["drafter_device"] == device
    assert res["plain"] == cpu_reference  # the target itself is unchanged by its placement
    assert res["greedy"] == cpu_reference  # lossless
    # drafts were both accepted and rejected: the drafter cache was rolled back on the device
    assert 0 < res["accepted"] < res["drafted"]
    assert res["lazy_head_rows"] > 0  # the target's head ran lazily, where its weight lives
    assert res["after_cancel"] == cpu_reference[PROMPTS[2]]
    a, b, c = res["sampled"]
    assert a == b and len(a) == MAX_TOKENS


def test_tree_verification_on_rpc_gives_the_cpu_tokens(rpc_servers, models) -> None:
    """Tree verification (issue 27) with the drafter on RPC0: the tokens of the same run on the CPU."""
    kw = dict(target=models["target"], drafter=models["v2"], prompts=PROMPTS, n_max=4, max_tokens=MAX_TOKENS,
              tree_budget=8)
    res = run_client(rpc_servers, "speculate", placement="cpu", device="RPC0", **kw)["result"]
    cpu = speculate(placement="cpu", device="CPU", devices=[], **kw)
    assert res["drafter_device"] == "RPC0" and cpu["drafter_device"] == "CPU"
    assert res["greedy"] == cpu["greedy"] == cpu["plain"]  # lossless, on either device
    assert 0 < res["accepted"] < res["drafted"]
    assert res["stream"] == cpu["stream"] and res["after_cancel"] == cpu["after_cancel"]
    assert res["sampled"] == cpu["sampled"]


def test_context_drafts_on_rpc_give_the_cpu_tokens(rpc_servers, models) -> None:
    """Context drafts merged with the lattice (issue 35), the drafter on RPC0: the CPU run's tokens."""
    kw = dict(target=models["target"], drafter=models["v2"], prompts=[p + p for p in PROMPTS], n_max=4,
              max_tokens=MAX_TOKENS, tree_budget=8, context_drafts="request")
    res = run_client(rpc_servers, "speculate", placement="cpu", device="RPC0", **kw)["result"]
    cpu = speculate(placement="cpu", device="CPU", devices=[], **kw)
    assert res["drafter_device"] == "RPC0"
    assert res["greedy"] == cpu["greedy"] == cpu["plain"]  # lossless, on either device
    assert res["context_accepted"] == cpu["context_accepted"] > 0
    assert res["stream"] == cpu["stream"] and res["sampled"] == cpu["sampled"]


def test_stream_on_rpc_equals_cpu_generate(rpc_servers, models) -> None:
    from pydflash2 import Speculator

    res = run_client(rpc_servers, "speculate", target=models["target"], drafter=models["v2"], placement="RPC0",
                     device="RPC0", prompts=PROMPTS, n_max=4, max_tokens=MAX_TOKENS)["result"]
    llm = make_llm(models["target"], "cpu", [])
    with Speculator(llm, models["v2"], n_max=4, device="CPU") as spec:
        want = spec.generate(PROMPTS[0], max_tokens=MAX_TOKENS, chat=False).text
        sampled = spec.generate(PROMPTS[0], max_tokens=MAX_TOKENS, chat=False, temperature=0.8, seed=1).tokens
    assert res["stream"] == want
    assert res["sampled"][0] == sampled  # the same seed samples the same tokens on either device


def test_scheduler_assert_becomes_an_error(rpc_servers, models) -> None:
    # the graph reuse that aborted the process (GGML_ASSERT(src_backend_id != -1)) is caught
    # before ggml_backend_sched_alloc_graph, reported, and the drafter goes on
    args = dict(drafter=models["v2"], target=models["target"])
    stale = run_client(rpc_servers, "stale_graph", env_extra={"PYDFLASH2_DEBUG_REUSE_SPLIT_GRAPHS": "1"},
                       device="RPC0", **args)["result"]
    assert stale["error"] is not None and "left over from an earlier schedule" in stale["error"], stale["error"]
    assert stale["n_cached"] == 11
    fresh = stale_graph(device="CPU", **args)
    assert fresh["error"] is None
    assert stale["first"] == fresh["first"] and stale["retry"] == fresh["retry"]


def test_speculator_rpc_servers_argument(rpc_servers, models, cpu_reference) -> None:
    res = run_client(rpc_servers, "speculator_rpc_servers", target=models["target"], drafter=models["v2"],
                     endpoints=",".join(rpc_servers), prompt=PROMPTS[0], max_tokens=MAX_TOKENS)["result"]
    assert res["tokens"] == cpu_reference[PROMPTS[0]]
    assert res["devices"] == ["CPU", "RPC0", "RPC1"]  # registering the same servers again adds nothing


def test_device_names_and_auto(rpc_servers, models) -> None:
    res = run_client(rpc_servers, "device_errors", drafter=models["v2"], target=models["target"])["result"]
    assert res["auto"] == "RPC0"  # the first GPU-type device
    assert "unknown device 'NoSuchDevice'" in res["unknown"]
    assert "RPC0 (gpu)" in res["unknown"] and "RPC1 (gpu)" in res["unknown"] and "CPU (cpu)" in res["unknown"]


def test_cli_generate_with_rpc(rpc_servers, models, cpu_reference, tmp_path) -> None:
    cmd = [sys.executable, "-m", "pydflash2", "generate", PROMPTS[3], "--raw", "--json", "--model", models["target"],
           "--draft", models["v2"], "--n-max", "3", "--max-tokens", str(MAX_TOKENS), "--n-ctx", "512",
           "--rpc", ",".join(rpc_servers), "--device", "RPC1", "-ngl", "99"]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["tokens"] == cpu_reference[PROMPTS[3]]


def test_server_on_rpc_concurrent_answers_equal_sequential(rpc_servers, models, cpu_reference, tmp_path) -> None:
    # the server with its target split over both RPC servers and every slot's drafter on RPC1: 8 clients at
    # once over 4 slots (waiting requests join mid-batch) get their sequential answers, which are the all-CPU ones
    from concurrent.futures import ThreadPoolExecutor

    import httpx
    from server_process import ServerProcess, check_same_greedy

    server = ServerProcess(["--model", models["target"], "--draft", models["v2"], "--parallel", "4", "--n-ctx", "512",
                            "--n-max", "3", "--threads", "1", "--rpc", ",".join(rpc_servers), "--device", "RPC1",
                            "-ngl", "99"], tmp_path, timeout=300)
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(8)]
    lengths = [MAX_TOKENS - 2 * (i // len(PROMPTS)) for i in range(8)]  # finish at different steps

    def ask(i: int) -> list[int]:
        r = httpx.post(server.url + "/v1/completions", timeout=300, json={
            "prompt": prompts[i], "max_tokens": lengths[i], "temperature": 0, "return_token_ids": True})
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["token_ids"]

    try:
        sequential = [ask(i) for i in range(8)]
        with ThreadPoolExecutor(8) as pool:
            concurrent = list(pool.map(ask, range(8)))
        drafts = httpx.get(server.url + "/metrics", timeout=60).text
    finally:
        server.stop()
    assert concurrent == sequential
    llm = make_llm(models["target"], "cpu", [])
    for i, p in enumerate(prompts):
        ref = cpu_reference[p][: lengths[i]]
        check_same_greedy(sequential[i], ref, llm.tokenize(p.encode(), add_bos=True, special=True), llm, p)
    accepted = next(line for line in drafts.splitlines() if line.startswith("pydflash2:spec_decode_num_accepted_"
                                                                              "tokens_total "))
    assert float(accepted.split()[1]) > 0  # the drafters on RPC1 drafted, and some drafts were right


def test_train_evaluation_on_rpc_equals_cpu(rpc_servers, models, cpu_reference) -> None:
    """The engine evaluation `pydflash2 train` runs after the export, with the drafter on
    RPC0: the CPU run's tokens (plain greedy's) and the same acceptance counts."""
    args = dict(target=models["target"], drafter=models["v2"], prompts=PROMPTS, max_tokens=MAX_TOKENS)
    rpc = run_client(rpc_servers, "train_eval", device="RPC0", **args)["result"]
    cpu = train_eval(device="CPU", **args)
    assert rpc["device"] == "RPC0" and cpu["device"] == "CPU"
    assert rpc["tokens"] == cpu["tokens"] == [cpu_reference[p] for p in PROMPTS]
    assert 0 < sum(rpc["accepted_per_position"]) < sum(rpc["drafted_per_position"])
    assert {k: v for k, v in rpc.items() if k != "device"} == {k: v for k, v in cpu.items() if k != "device"}


def test_cli_train_evaluates_on_the_rpc_device(rpc_servers, models, tmp_path) -> None:
    pytest.importorskip("torch", reason="pydflash2[train] (torch) is not installed")
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "pydflash2", "train", "--target", models["target"], "--out", str(out),
           "--max-prompts", "4", "--max-new", "8", "--n-seq", "2", "--taps", "2", "--block-size", "4",
           "--draft-vocab", "300", "--max-steps", "2", "--batch", "2", "--anchors", "4", "--top-k", "4", "--rank", "4",
           "--outtype", "f16", "--threads", "1", "--eval-prompts", "2", "--eval-max-tokens", "8",
           "--rpc", ",".join(rpc_servers), "--device", "RPC1"]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    ev = json.loads((out / "summary.json").read_text())["eval"]
    assert ev["device"] == "RPC1" and ev["prompts"] == 2 and len(ev["acceptance_per_position"]) == 3
    assert "(drafter on RPC1): tau" in r.stderr


# ---------------------------------------------------------------- errors (any build; nothing is registered)


def test_malformed_rpc_endpoints_are_refused() -> None:
    from pydflash2.devices import DeviceError, add_rpc_servers

    for bad in ["localhost", "127.0.0.1:", "127.0.0.1:99999", "127.0.0.1:port", ":50052", ""]:
        with pytest.raises(DeviceError, match="RPC|HOST:PORT|port"):
            add_rpc_servers(bad)


def test_unreachable_rpc_server_is_an_error_not_an_abort() -> None:
    from pydflash2.devices import DeviceError, add_rpc_servers

    port = free_port()  # nothing listens there
    with pytest.raises(DeviceError, match="not reachable" if RPC_AVAILABLE else "no RPC backend"):
        add_rpc_servers(f"127.0.0.1:{port}")


def test_unknown_device_lists_the_devices(models) -> None:
    from pydflash2 import Drafter, DrafterError
    from pydflash2.devices import DeviceError, resolve_device

    with pytest.raises(DeviceError, match=r"unknown device 'CUDA7'; this ggml offers: .*CPU \(cpu\)"):
        resolve_device("CUDA7")
    with pytest.raises(DrafterError, match=r"unknown device 'CUDA7'.*CPU \(cpu\)"):
        Drafter(models["v2"], models["target"], device="CUDA7")
    assert resolve_device("cpu") == "CPU"


def test_cli_train_unknown_device_fails_before_training(models, tmp_path) -> None:
    pytest.importorskip("torch", reason="pydflash2[train] (torch) is not installed")
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "pydflash2", "train", "--target", models["target"], "--out", str(out),
           "--device", "CUDA7"]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and "unknown device 'CUDA7'" in r.stderr
    assert not out.exists()  # nothing distilled or trained


def test_cli_unknown_device_is_one_line(models, tmp_path) -> None:
    cmd = [sys.executable, "-m", "pydflash2", "generate", "hi", "--model", models["target"], "--draft", models["v2"],
           "--device", "CUDA7"]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and "unknown device 'CUDA7'" in r.stderr


if __name__ == "__main__":
    client_main(json.loads(sys.argv[1]))
