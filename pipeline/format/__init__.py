"""Formatting: rows -> documents (templates, chat rendering and its checks, prompts)."""
