"""The drafter uses the target's token embedding and output head in place: the
target GGUF is mapped shared and read-only, not copied, so its pages are the
same ones llama.cpp's own mapping of that file uses."""

from __future__ import annotations

import os

import llama_cpp

from pydflash2 import Drafter


def _mappings_of(path) -> list[str]:
    real = os.path.realpath(path)
    return [line for line in open("/proc/self/maps") if line.rstrip().endswith(real)]


def test_target_head_is_mapped_in_place(target_gguf, drafter2_gguf) -> None:
    llm = llama_cpp.Llama(str(target_gguf), n_ctx=256, verbose=False, use_mmap=True)
    before = len(_mappings_of(target_gguf))
    with Drafter(drafter2_gguf, target_gguf, n_ctx=256, device="CPU") as d:
        assert d.info["target_head_mapped"] is True
        maps = _mappings_of(target_gguf)
        assert len(maps) > before
        # read-only and shared: the page cache backs both llama.cpp's view and ours
        assert all(line.split()[1].startswith("r") and line.split()[1].endswith("s") for line in maps[before:])
        # and it computes with it
        p = d.propose(anchor=5, pos=0, n=4)
        assert p.candidates is not None and p.candidates.shape == (3, 4)
    del llm
