"""The native core runs on llama-cpp-python's own ggml: one ggml per process."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import llama_cpp

import pydflash2


def test_native_info_reports_build_and_cpu_device() -> None:
    info = pydflash2.native_info()
    assert info["ggml_version"].count(".") == 2
    assert info["ggml_commit"]
    assert "CPU" in info["llama_system_info"]
    cpu = [d for d in info["devices"] if d["type"] == "cpu"]
    assert len(cpu) == 1 and cpu[0]["name"] == "CPU"
    assert cpu[0]["memory_total"] > 0
    assert info["native_library"].endswith("libpydflash2_native.so")
    # the system info string comes from the same libllama llama_cpp uses
    assert info["llama_system_info"] == llama_cpp.llama_print_system_info().decode()


def test_one_ggml_and_one_llama_in_the_process(target_gguf, tmp_path) -> None:
    # A fresh interpreter: load a model with llama_cpp, call into pydflash2,
    # then count the distinct files mapped for libggml-base and libllama.
    code = textwrap.dedent(
        f"""
        import json, llama_cpp, pydflash2
        llm = llama_cpp.Llama({str(target_gguf)!r}, n_ctx=64, verbose=False)
        llm.tokenize(b"hello")
        pydflash2.native_info()
        files = {{}}
        for line in open("/proc/self/maps"):
            parts = line.split()
            if len(parts) < 6:
                continue
            path, inode = parts[5], parts[4]
            for lib in ("libggml-base", "libllama", "libggml-cpu"):
                if "/" + lib + "." in path:
                    files.setdefault(lib, set()).add(inode)
        print(json.dumps({{k: sorted(v) for k, v in files.items()}}))
        """
    )
    # run outside the repo so the installed package (with its native library) is imported
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path)
    files = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(files["libggml-base"]) == 1, files
    assert len(files["libllama"]) == 1, files
    assert len(files.get("libggml-cpu", ["x"])) == 1, files
