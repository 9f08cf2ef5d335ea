"""Ollama Modelfiles for target + drafter pairs, read back by a port of Ollama's
own Modelfile parser (tests/ollama_modelfile.py) as `ollama create` reads them."""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path

import gguf
import llama_cpp
import pydflash2_testing as testing
import pytest
from ollama_modelfile import (
    CreateError,
    MissingFrom,
    ParserError,
    UnexpectedEOF,
    create_request,
    parse,
    render_go_template,
)

from pydflash2 import ModelfileError, modelfile
from pydflash2.ollama.go_template import CHATML, derive_ollama_template, render_jinja
from pydflash2.ollama.modelfile import ModelfileWarning, quote

CONVERSATION = [
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "Paris."},
    {"role": "user", "content": "And of Italy?"},
]
SMOLLM2_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def read_back(text: str, folder: Path) -> dict:
    """What `ollama create -f folder/Modelfile` would send, or Ollama's error."""
    return create_request(parse(text), folder)


def chat_template_of(path: Path) -> str:
    return llama_cpp.Llama(str(path), n_ctx=64, verbose=False).metadata["tokenizer.chat_template"]


# ------------------------------------------------------------ the port of Ollama's parser itself


def test_parser_follows_ollamas_grammar() -> None:
    text = (
        "# a comment\n"
        "from base\n"
        "Draft ./assistant\n"
        "PARAMETER stop <|im_end|>\n"
        "parameter stop \"two words\"\n"
        "PARAMETER what the \n"
        'TEMPLATE """{{ .Prompt }}\n\n   indented"""   \n'
        'MESSAGE system """\nYou are a parser.\n"""\n'
        "License MIT\n"
        "SYSTEM be brief\n"
        "ADAPTER ./lora.gguf\n"
        "requires 0.30.0\n"
    )
    assert parse(text) == [
        ("model", "base"), ("draft", "./assistant"), ("stop", "<|im_end|>"), ("stop", "two words"),
        ("what", "the"), ("template", "{{ .Prompt }}\n\n   indented"),
        ("message", "system: \nYou are a parser.\n"), ("license", "MIT"), ("system", "be brief"),
        ("adapter", "./lora.gguf"), ("requires", "0.30.0"),
    ]
    # Ollama's own parser_test.go cases
    assert parse('FROM "     model 1"') == [("model", "     model 1")]
    assert parse("FROM /what/is/the path ") == [("model", "/what/is/the path")]
    assert parse("PARAMETER param1 value1\nFROM foo") == [("param1", "value1"), ("model", "foo")]


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("", MissingFrom),
        ("PARAMETER param1 value1", MissingFrom),
        ("FROM foo\nBADCOMMAND param1 value1\n", ParserError),
        ("FROM foo\nMESSAGE badguy I'm a bad guy!\n", ParserError),
        ("FROM foo\nPARAMETER param1\n", UnexpectedEOF),
        ('FROM foo\nTEMPLATE """never closed\n', UnexpectedEOF),
        ("FROM foo\nSYSTEM", UnexpectedEOF),
    ],
)
def test_parser_rejects_what_ollama_rejects(text: str, error: type[Exception]) -> None:
    with pytest.raises(error):
        parse(text)


def test_create_rejects_unknown_and_mistyped_parameters(tmp_path: Path) -> None:
    with pytest.raises(CreateError, match="unknown parameter 'n_max'"):
        read_back("FROM foo\nPARAMETER n_max 4\n", tmp_path)
    with pytest.raises(CreateError, match="invalid int value"):
        read_back("FROM foo\nPARAMETER draft_num_predict four\n", tmp_path)
    with pytest.raises(CreateError, match="invalid float value"):
        read_back("FROM foo\nPARAMETER temperature hot\n", tmp_path)
    with pytest.raises(CreateError, match="semver"):
        read_back("FROM foo\nREQUIRES latest\n", tmp_path)
    assert read_back("FROM foo\nREQUIRES 0.30.0\n", tmp_path)["requires"] == "0.30.0"
    req = read_back("FROM foo\nPARAMETER mirostat 1\nPARAMETER use_mmap false\nPARAMETER stop a\nPARAMETER stop b\n",
                    tmp_path)
    assert req["parameters"] == {"use_mmap": False, "stop": ["a", "b"]}
    assert req["warnings"] == ["parameter mirostat is deprecated"]
    assert req["from"] == "foo"


@pytest.mark.parametrize(
    "value",
    ["/plain/path.gguf", "/dir with spaces/model.gguf", "  padded  ", 'say "hi"', '"quoted"', '""x', "a\nb",
     'line "one"\nline two', 'ends with quote"\nnext', "tab\tinside", "", "multi\n\nline\n",
     '"""', 'a"\n""" b\n'],
)
def test_quote_round_trips_through_ollamas_parser(value: str) -> None:
    assert parse(f"FROM foo\nSYSTEM {quote(value)}\n") == [("model", "foo"), ("system", value)]


def test_quote_refuses_what_a_modelfile_cannot_carry() -> None:
    with pytest.raises(ModelfileError):
        quote("bell\a")
    with pytest.raises(ModelfileError):
        quote('x"""\ny')  # a line ending in quotes ends both quoted forms early


# ------------------------------------------------------------ generated Modelfiles


def test_tiny_pair_modelfile(tmp_path: Path, target_gguf: Path, drafter2_gguf: Path) -> None:
    text = modelfile(target_gguf, drafter2_gguf)
    req = read_back(text, tmp_path)
    assert req["files"] == [str(target_gguf.absolute())]
    assert req["draft_files"] == [str(drafter2_gguf.absolute())]
    # block_size 8 -> up to 7 drafts; the tiny target's eos <|im_end|> and llama.cpp's EOG <|endoftext|>
    assert req["parameters"] == {"draft_num_predict": 7, "num_ctx": 4096, "stop": ["<|endoftext|>", "<|im_end|>"]}
    assert req["template"] == CHATML.go_template
    assert "system" not in req
    # the Go template prompts exactly as the GGUF's Jinja template does
    assert render_go_template(req["template"], CONVERSATION) == render_jinja(chat_template_of(target_gguf),
                                                                              CONVERSATION)


def test_smollm2_modelfile(tmp_path: Path, smollm2_pair: tuple[Path, Path]) -> None:
    target, draft = smollm2_pair
    req = read_back(modelfile(draft=draft, num_ctx=2048), tmp_path)  # the default target
    assert req["files"] == [str(target.absolute())] and req["draft_files"] == [str(draft.absolute())]
    # <reponame> is among llama.cpp's FIM repo tokens (Granite's spelling), which end generation too
    assert req["parameters"] == {"draft_num_predict": 15, "num_ctx": 2048,
                                 "stop": ["<|endoftext|>", "<|im_end|>", "<reponame>"]}
    # SmolLM2's template adds its system message when a conversation has none: Ollama's SYSTEM does the same
    assert req["system"] == SMOLLM2_SYSTEM
    jinja = chat_template_of(target)
    assert render_go_template(req["template"], [{"role": "system", "content": req["system"]}, *CONVERSATION]) \
        == render_jinja(jinja, CONVERSATION)
    custom = [{"role": "system", "content": "Answer in French."}, *CONVERSATION]
    assert render_go_template(req["template"], custom) == render_jinja(jinja, custom)


def test_draft_num_predict_is_clamped_to_the_block(tmp_path: Path, target_gguf: Path, drafter2_gguf: Path,
                                                   drafter1_gguf: Path) -> None:
    assert read_back(modelfile(target_gguf, drafter2_gguf, n_max=3), tmp_path)["parameters"]["draft_num_predict"] == 3
    with pytest.warns(ModelfileWarning, match="clamped"):
        text = modelfile(target_gguf, drafter1_gguf, n_max=100)
    assert read_back(text, tmp_path)["parameters"]["draft_num_predict"] == 7
    with pytest.raises(ModelfileError, match="n_max must be >= 1"):
        modelfile(target_gguf, drafter2_gguf, n_max=0)


def test_bundle_links_both_files_beside_the_modelfile(tmp_path: Path, target_gguf: Path,
                                                      drafter2_gguf: Path) -> None:
    bundle = tmp_path / "bundle"
    text = modelfile(target_gguf, drafter2_gguf, bundle=bundle)
    req = read_back(text, bundle)
    assert req["files"] == [str(bundle / target_gguf.name)]
    assert req["draft_files"] == [str(bundle / drafter2_gguf.name)]
    for src in (target_gguf, drafter2_gguf):
        assert (bundle / src.name).read_bytes() == src.read_bytes()
    # the bundle outlives the originals (a venv that goes away)
    assert modelfile(target_gguf, drafter2_gguf, bundle=bundle) == text  # a rerun keeps what is there
    (bundle / drafter2_gguf.name).unlink()
    (bundle / drafter2_gguf.name).write_bytes(b"something else")
    (bundle / target_gguf.name).unlink()
    with pytest.raises(ModelfileError, match="exists and differs"):
        modelfile(target_gguf, drafter2_gguf, bundle=bundle)
    assert (bundle / drafter2_gguf.name).read_bytes() == b"something else"
    assert not (bundle / target_gguf.name).exists()  # nothing made when the bundle is refused


def test_bundle_keeps_same_named_files_apart(tmp_path: Path, target_gguf: Path, drafter2_gguf: Path) -> None:
    for sub, src in (("t", target_gguf), ("d", drafter2_gguf)):
        (tmp_path / sub).mkdir()
        shutil.copy(src, tmp_path / sub / "model.gguf")
    bundle = tmp_path / "b"
    req = read_back(modelfile(tmp_path / "t" / "model.gguf", tmp_path / "d" / "model.gguf", bundle=bundle), bundle)
    assert Path(req["files"][0]).read_bytes() == target_gguf.read_bytes()
    assert Path(req["draft_files"][0]).read_bytes() == drafter2_gguf.read_bytes()


def test_paths_with_spaces_are_quoted(tmp_path: Path, target_gguf: Path, drafter2_gguf: Path) -> None:
    folder = tmp_path / "my models"
    folder.mkdir()
    target, draft = folder / "tiny target.gguf", folder / "the drafter.gguf"
    os.link(target_gguf, target)
    os.link(drafter2_gguf, draft)
    text = modelfile(target, draft)
    assert f'FROM "{target}"' in text and f'DRAFT "{draft}"' in text
    req = read_back(text, tmp_path)
    assert req["files"] == [str(target)] and req["draft_files"] == [str(draft)]


def test_a_drafter_for_another_target_is_refused(tmp_path: Path, drafter2_gguf: Path) -> None:
    wide = testing.make_target_gguf(tmp_path / "wide.gguf", testing.TargetSpec(n_embd=128, n_head=4))
    with pytest.raises(ModelfileError, match="hidden size mismatch: drafter hidden_size 64 != target's 128"):
        modelfile(wide, drafter2_gguf)
    shallow = testing.make_target_gguf(tmp_path / "shallow.gguf", testing.TargetSpec(n_layer=2))
    with pytest.raises(ModelfileError, match="target layer id 2 is out of range"):
        modelfile(shallow, drafter2_gguf)


def test_a_tap_on_the_last_layer_is_written_with_the_converters_warning(tmp_path: Path,
                                                                       drafter2_gguf: Path) -> None:
    three = testing.make_target_gguf(tmp_path / "three.gguf", testing.TargetSpec(n_layer=3))
    with pytest.warns(ModelfileWarning, match="target layer id 2 is the target's last layer"):
        text = modelfile(three, drafter2_gguf)
    assert read_back(text, tmp_path)["draft_files"] == [str(drafter2_gguf)]


def test_smollm2_refuses_the_tiny_drafter(target_gguf: Path, drafter2_gguf: Path,
                                          smollm2_pair: tuple[Path, Path]) -> None:
    with pytest.raises(ModelfileError, match="vocab size mismatch"):
        modelfile("smollm2", drafter2_gguf)


def test_a_target_is_no_drafter_and_a_drafter_no_target(target_gguf: Path, drafter2_gguf: Path) -> None:
    with pytest.raises(ModelfileError, match="not a usable drafter: .*general.architecture"):
        modelfile(target_gguf, target_gguf)
    with pytest.raises(ModelfileError, match="is a DFlash drafter, not a target model"):
        modelfile(drafter2_gguf, drafter2_gguf)


def test_missing_files(tmp_path: Path, target_gguf: Path, drafter2_gguf: Path) -> None:
    with pytest.raises(ModelfileError, match="target .*nope.gguf does not exist"):
        modelfile(tmp_path / "nope.gguf", drafter2_gguf)
    with pytest.raises(ModelfileError, match="drafter .* is not a file"):
        modelfile(target_gguf, tmp_path)


def test_template_left_out_when_none_is_known(tmp_path: Path, target_gguf: Path, drafter2_gguf: Path) -> None:
    llama2 = ("{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
              "{% else %}{{ m['content'] }}{% endif %}{% endfor %}")
    string = gguf.GGUFValueType.STRING
    for name, change in (
        ("llama2", {"set_keys": {"tokenizer.chat_template": (llama2, string)}}),
        ("broken", {"set_keys": {"tokenizer.chat_template": ("{% for m in messages %}", string)}}),
        ("none", {"drop_keys": ("tokenizer.chat_template",)}),
    ):
        target = testing.rewrite_gguf(target_gguf, tmp_path / f"{name}.gguf", **change)
        req = read_back(modelfile(target, drafter2_gguf), tmp_path)
        assert "template" not in req and "system" not in req, name
        assert req["parameters"]["stop"] == ["<|endoftext|>", "<|im_end|>"]


def test_chatml_recognised_by_output_not_by_spelling() -> None:
    # written differently from the tiny target's, same prompts
    respelled = ("{%- for message in messages -%}{{- '<|im_start|>' ~ message.role ~ '\n' ~ message.content"
                 " ~ '<|im_end|>\n' -}}{%- endfor -%}{%- if add_generation_prompt %}<|im_start|>assistant\n"
                 "{% endif -%}")
    assert derive_ollama_template(respelled).go_template == CHATML.go_template
    # one character off (no newline after the role): not ChatML
    assert derive_ollama_template(respelled.replace("message.role ~ '\n'", "message.role")) is None


def test_num_ctx_never_exceeds_the_training_context(tmp_path: Path, drafter2_gguf: Path) -> None:
    short = testing.make_target_gguf(tmp_path / "short.gguf", testing.TargetSpec(n_ctx=1024))
    assert read_back(modelfile(short, drafter2_gguf), tmp_path)["parameters"]["num_ctx"] == 1024
    assert read_back(modelfile(short, drafter2_gguf, num_ctx=8192), tmp_path)["parameters"]["num_ctx"] == 8192


def test_no_warning_for_a_fitting_pair(target_gguf: Path, drafter2_gguf: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        modelfile(target_gguf, drafter2_gguf)
