"""The decoder families Tally can split into spans, by Hugging Face ``model_type``, with their display names.

Kept apart from :mod:`node.compute.arch` (which imports torch) so that the CLI can name them in ``--help``
without paying torch's import (about 2 s) on every command."""

from __future__ import annotations

SUPPORTED = {
    "llama": "Llama",
    "mistral": "Mistral",
    "qwen2": "Qwen2",
    "qwen3": "Qwen3",
    "gemma2": "Gemma2",
    "gemma3_text": "Gemma3 (text)",
}
