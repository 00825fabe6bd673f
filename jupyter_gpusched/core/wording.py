"""Words for numbers in the messages users read (reasons, refusals): "1 GPU", "2 GPUs"."""

from __future__ import annotations


def gpus_text(count: float) -> str:
    """``count`` GPUs in words: ``1 GPU``, ``0 GPUs``, ``2 GPUs``, ``0.5 GPUs``."""
    return f"{count:g} GPU" + ("" if count == 1 else "s")
