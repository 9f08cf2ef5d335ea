"""Which Ollama Go template produces the same prompts as a GGUF's Jinja chat template.

A template is recognised by what it renders, not by how it is written: the Jinja
template is run (sandboxed, as Hugging Face runs it) on probe conversations and
compared with a known format's rendering. A template that prints a default system
message when the conversation has none (SmolLM2's) maps to Ollama's SYSTEM, which
Ollama prepends under the same condition.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

Message = dict[str, str]

_SYSTEM = {"role": "system", "content": "pydflash2 probe: the system message"}
_TURNS = [
    {"role": "user", "content": "pydflash2 probe: the first question"},
    {"role": "assistant", "content": "pydflash2 probe: the first answer"},
    {"role": "user", "content": "pydflash2 probe: the second question"},
]


@dataclass(frozen=True)
class KnownFormat:
    name: str
    render: Callable[[list[Message]], str]  # a conversation plus the assistant prompt, as the format writes it
    go_template: str  # Ollama's template for it (Ollama's template/<name>.gotmpl)
    system_block: str  # regex of a leading system message alone, group 1 its text


def _chatml(messages: list[Message]) -> str:
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages) + "<|im_start|>assistant\n"


CHATML = KnownFormat(
    name="chatml",
    render=_chatml,
    go_template=(
        "{{- range .Messages }}<|im_start|>{{ .Role }}\n"
        "{{ .Content }}<|im_end|>\n"
        "{{ end }}<|im_start|>assistant\n"
    ),
    system_block=r"<\|im_start\|>system\n(.*)<\|im_end\|>\n",
)

KNOWN_FORMATS = (CHATML,)


@dataclass(frozen=True)
class OllamaTemplate:
    name: str
    go_template: str
    default_system: str | None  # the system message the Jinja template adds when there is none


def render_jinja(chat_template: str, messages: list[Message], bos_token: str = "", eos_token: str = "") -> str:
    """Renders a Hugging Face chat template as the engine and the server render it (pydflash2.chat_template,
    llama-cpp-python's formatter, which follows transformers' apply_chat_template)."""
    from ..chat_template import ChatTemplate

    return ChatTemplate(chat_template, eos_token, bos_token).render(messages)[0]


def derive_ollama_template(chat_template: str, bos_token: str = "", eos_token: str = "") -> OllamaTemplate | None:
    """The known Ollama template whose prompts equal chat_template's on the probe
    conversations, or None (then Ollama falls back to the GGUF's own template)."""
    try:
        with_system = render_jinja(chat_template, [_SYSTEM, *_TURNS], bos_token, eos_token)
        without = render_jinja(chat_template, _TURNS, bos_token, eos_token)
    except Exception:  # a template this renderer cannot run (jinja syntax, missing globals...) is not recognised
        return None
    for fmt in KNOWN_FORMATS:
        if with_system != fmt.render([_SYSTEM, *_TURNS]):
            continue
        rest = fmt.render(_TURNS)
        if without == rest:
            return OllamaTemplate(fmt.name, fmt.go_template, None)
        if without.endswith(rest):
            m = re.fullmatch(fmt.system_block, without[: -len(rest)], flags=re.DOTALL)
            if m and m.group(1):
                return OllamaTemplate(fmt.name, fmt.go_template, m.group(1))
    return None
