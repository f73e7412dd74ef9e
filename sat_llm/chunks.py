"""Row chunks of the team's model passes: a pass over many rows runs in chunks that an
out-of-memory error halves (:func:`in_chunks`), and a reference pass computed in chunks is
read back by rows (:func:`_rows`)."""

from __future__ import annotations

import logging

import torch

__all__ = ["in_chunks"]

log = logging.getLogger("sat_llm")


def _is_oom(e: BaseException) -> bool:
    """An out-of-memory error of any device (CUDA raises ``torch.OutOfMemoryError``, the CPU
    allocator a ``RuntimeError`` that says it cannot allocate)."""
    return isinstance(e, torch.OutOfMemoryError) or (
        isinstance(e, RuntimeError) and ("out of memory" in str(e)
                                         or "can't allocate memory" in str(e)))


def in_chunks(n: int, size: int, fn, *, what: str, device=None) -> tuple[list, int]:
    """``([fn(a, b) for each chunk [a, b) of range(n)], final size)``: chunks of ``size``
    rows; a chunk that runs out of memory is retried with half the size (logged), down to
    one row (then the error propagates)."""
    out, a = [], 0
    while a < n:
        b = min(a + size, n)
        try:
            out.append(fn(a, b))
            a = b
        except (RuntimeError, torch.OutOfMemoryError) as e:
            if not _is_oom(e) or size == 1:
                raise
            size = max(1, (b - a) // 2)
            log.warning("sat_llm: out of memory in %s on %s with %d rows; retrying with %d",
                        what, device or "the device", b - a, size)
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    return out, size


def _rows(chunks: list, a: int, b: int, T: int) -> tuple:
    """Rows ``[a, b)`` with ``T`` token columns of row-chunked tuples of ``(B,T,V)`` or
    ``(B,T)`` tensors (the reference pass: ``(logp, tokens, mask)``),
    ``chunks = [(start, end, tuple), ...]``: the chunk itself when it is exactly those rows
    (no copy), else the rows gathered and padded (masked columns)."""
    for s, e, c in chunks:
        if (s, e) == (a, b) and c[0].shape[1] == T:
            return c
    parts = []
    for s, e, c in chunks:
        lo, hi = max(a, s), min(b, e)
        if lo < hi:
            pad = max(T - c[0].shape[1], 0)
            parts.append(tuple(torch.nn.functional.pad(x[lo - s:hi - s], (0, 0, 0, pad) if x.dim() == 3
                                                       else (0, pad))[:, :T] for x in c))
    return tuple(torch.cat(x) for x in zip(*parts, strict=True))


def _longest(msgs) -> int:
    return max(len(m) for m in msgs)
