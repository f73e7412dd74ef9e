"""Tests of the LLM backend (``sat_llm``), its engines, studies and peers."""
