"""``sat train --backend llm``: the LLM backend, now :mod:`sat_llm.backend` (this module
re-exports it for code written against the old name)."""

from .backend import LLMBackend, build_llm_config

__all__ = ["build_llm_config", "LLMBackend"]
