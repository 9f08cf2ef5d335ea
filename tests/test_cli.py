"""The `pydflash2` command line, run as a real subprocess."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys


def _run(*args: str, cwd) -> subprocess.CompletedProcess:
    exe = shutil.which("pydflash2")
    cmd = [exe, *args] if exe else [sys.executable, "-m", "pydflash2", *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=120)


def test_info_lists_backends(tmp_path) -> None:
    r = _run("info", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "backend devices:" in r.stdout
    assert "CPU" in r.stdout


def test_info_json(tmp_path) -> None:
    r = _run("info", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert any(d["type"] == "cpu" for d in info["devices"])


def test_info_on_drafter_prints_hyperparameters(tmp_path, drafter2_gguf) -> None:
    r = _run("info", str(drafter2_gguf), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "DFlash2 drafter" in r.stdout
    assert "CPU" in r.stdout
    lines = {line.split()[0]: line.split(None, 1)[1] for line in r.stdout.splitlines()[2:]}
    assert lines["selector_top_k"] == "4"
    assert lines["block_size"] == "8"
    assert lines["target_layers"] == "[1, 2, 3]"


def test_info_on_bad_file_exits_2(tmp_path, target_gguf) -> None:
    r = _run("info", str(target_gguf), cwd=tmp_path)
    assert r.returncode == 2
    assert "general.architecture is 'llama'" in r.stderr


def test_demo_files_command(tmp_path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "pydflash2.testing", str(tmp_path / "demo")],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "demo" / "dflash2.gguf").stat().st_size > 0
    assert (tmp_path / "demo" / "dflash1-hf" / "config.json").exists()
