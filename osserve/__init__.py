"""osserve: a fast, correct inference server for OpenAI's gpt-oss models."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["LLM", "SamplingParams", "__version__"]

if TYPE_CHECKING:
    from osserve.engine.core.sampling_params import SamplingParams
    from osserve.engine.llm import LLM


def __getattr__(name: str) -> Any:
    # Lazy, so `import osserve` stays cheap (no torch import) for the CLI and tools.
    if name == "LLM":
        from osserve.engine.llm import LLM

        return LLM
    if name == "SamplingParams":
        from osserve.engine.core.sampling_params import SamplingParams

        return SamplingParams
    raise AttributeError(name)
