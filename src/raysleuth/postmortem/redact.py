"""Moved to :mod:`raysleuth.redact` (one redaction module for every writer of evidence); kept importable."""

from raysleuth.redact import (  # noqa: F401
    _B64_WORD,
    _HEX_WORD,
    REDACTED,
    _array_summary,
    _redacted_repr,
    looks_like_secret_name,
    looks_like_token,
    redact,
    redact_text,
    redact_value,
    redacted_repr,
    relevant_environment,
    safe_repr,
)
