"""Ollama: Modelfiles for a target + drafter pair, and the Go template matching a GGUF's chat template."""

from .modelfile import ModelfileError, ModelfileWarning, modelfile

__all__ = ["ModelfileError", "ModelfileWarning", "modelfile"]
