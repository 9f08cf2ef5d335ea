"""A real `python -m pydflash2.server` subprocess on 127.0.0.1 at a free port,
and the greedy-equality rule the server tests apply to its answers."""

from __future__ import annotations

import os
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx
import llama_cpp
import numpy as np

# Largest top-1 minus top-2 logit gap of plain decoding at which batching may
# flip the argmax on a stock (not batch-invariant) build: 4 x EPSILON, EPSILON
# being the largest |logit difference| of a sequence's verify rows decoded
# alone and decoded in one batch with 1, 3 or 7 other sequences' rows, in a
# context made as the server makes it (benchmarks/server_load.py
# --measure-delta). Measured on the stock llama-cpp-python 0.3.36 build (x86-64,
# AVX2) for the tiny fixture target and SmolLM2-135M Q4_1: 0 for both, since
# each slot has its own KV stream and every slot verifies the same number of
# rows. So answers must be identical but at an exact tie.
EPSILON = 0.0
NEAR_TIE_DELTA = 4 * EPSILON
SPECIAL_BUILD = os.environ.get("PYDFLASH2_REQUIRE_SPECIAL_BUILD") == "1"
SUPPORT = Path(__file__).resolve().parent / "support"  # pydflash2_testing, outside the wheel
FAULT_ENV = "PYDFLASH2_FAULT_INJECT"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerProcess:
    """Starts the server (from `cwd`, so that the installed package is imported)
    and waits until /health answers 200 (unless wait=False). env: added to this
    process's environment; scheme: "https" for a server given a certificate."""

    def __init__(self, args: list[str], cwd: Path, timeout: float = 120.0, env: dict[str, str] | None = None,
                 wait: bool = True, scheme: str = "http", verify: ssl.SSLContext | bool = True) -> None:
        self.port = free_port()
        self.url = f"{scheme}://127.0.0.1:{self.port}"
        self.log_path = cwd / f"server-{self.port}.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 (closed in stop)
        env = {**os.environ, **(env or {})}
        # fault injection: the server with the test-only scheduler hooks (pydflash2_testing.fault_server)
        module = "pydflash2.server"
        if env.get(FAULT_ENV):
            module = "pydflash2_testing.fault_server"
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SUPPORT), env.get("PYTHONPATH", "")) if p)
        self.proc = subprocess.Popen([sys.executable, "-m", module, "--port", str(self.port), *args],
                                     cwd=cwd, stdout=self._log, stderr=subprocess.STDOUT, env=env)
        if wait:
            self.wait_ready(timeout, verify)

    def wait_ready(self, timeout: float = 120.0, verify: ssl.SSLContext | bool = True) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.url + "/health", timeout=1.0, verify=verify).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                log = self.log()  # before stop() closes it
                self.stop()
                raise RuntimeError(f"server did not come up in {timeout} s:\n{log}")
            time.sleep(0.1)

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def last_logits(llm: llama_cpp.Llama) -> np.ndarray:
    """The logits of the last token llm.eval() decoded (llm.scores holds them only with logits_all)."""
    ptr = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
    return np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),)).copy()


def plain_margin(llm: llama_cpp.Llama, tokens: list[int]) -> float:
    """Plain batch-1 decoding's top-1 minus top-2 logit after `tokens`."""
    llm.reset()
    llm.eval(tokens)
    logits = last_logits(llm)
    llm.reset()
    top2 = np.partition(logits, -2)[-2:]
    return float(top2[1] - top2[0])


def check_same_greedy(got: list[int], ref: list[int], prompt: list[int], llm: llama_cpp.Llama, what: object) -> bool:
    """Two greedy answers to one prompt must be identical on a batch-invariant
    build; elsewhere they may part only where plain decoding is at a near-tie.
    Returns True when they parted (at a near-tie)."""
    if got == ref:
        return False
    assert not SPECIAL_BUILD, (what, "greedy output depends on the batch on a batch-invariant build")
    first = next((i for i in range(min(len(got), len(ref))) if got[i] != ref[i]), min(len(got), len(ref)))
    margin = plain_margin(llm, prompt + ref[:first])
    assert margin <= NEAR_TIE_DELTA, (what, f"answers part at token {first} where plain decoding's top-2 margin "
                                            f"is {margin:.3g} > {NEAR_TIE_DELTA:.3g}")
    return True
