"""What is a secret, and how evidence is written without it: the one redaction module.

Every writer of evidence passes what it keeps through here. Some redact
what they capture themselves (crash capsules: locals, messages, tracebacks,
environment; ``@rs.debug_decorator`` arguments; shipped log messages;
failed-task error texts; memory-capsule source lines), and the recorder
applies :func:`redact_record` to every record of every kind as it leaves
the worker's buffer (on its background thread; urgent records also before
their write-ahead line), so death records, stack reports, span attributes,
event keyword arguments and whatever a new writer adds are redacted too.

Where the line is drawn
-----------------------
The decision works first on **structure**, then on **value shape**.

Redacted (the value, never the name around it):

- a value whose *name* says secret: variables, dict keys, keyword
  arguments, environment variables, argv flags (``--hf-token X``,
  ``--api-key=X``), ``(name, value)`` pairs, ``name=value`` and
  ``"name": "value"`` in free text. A name is secret when one of its words
  (split at ``_ - .`` and camelCase) is ``password passwd passphrase secret
  credential(s) cookie auth authorization apikey webhook ...``, or it ends in
  ``token``/``key``/``pass`` with a secret-ish sense (``hf_token``,
  ``api_key``, ``access_key``, ``DB_PASS``; not ``pad_token``,
  ``max_tokens``, ``sort_key``, ``key_states``, ``forward_pass``), or it is
  a connection string (``*_CONNECTION_STRING``) or a database/broker URL
  (``DATABASE_URL``, ``REDIS_URL``, ``SQLALCHEMY_DATABASE_URI``);
- JSON text (``RAY_JOB_CONFIG_JSON_ENV_VAR``, JSON held in a JSON string):
  parsed and redacted by its structure, so its names count;
- ``Authorization: Basic|Bearer|Token <credential>`` and a lone
  ``Bearer <credential>``;
- the password of a URL (``scheme://user:PASSWORD@host``), and a URL's
  user part when it is token-shaped (``https://ghp_...@github.com``);
- known token shapes anywhere in text: OpenAI/Anthropic ``sk-``, Hugging
  Face ``hf_``, GitHub ``ghp_ gho_ ghs_ ghu_ ghr_ github_pat_``, GitLab
  ``glpat-``, Slack ``xox?-``, AWS ``AKIA/ASIA`` key ids, Google ``AIza``
  keys and ``ya29.`` tokens, Stripe ``sk_live_``/``rk_live_``, npm
  ``npm_``, PyPI ``pypi-``, JWTs (also glued to text, ``Bearer%20eyJ...``,
  and unsigned), Slack and Discord webhook URLs, PEM private-key blocks;
- a run of 32 or more hex digits inside text (mixing letters and digits),
  unless it is named as an identifier (below);
- a whole string value that is one long hex word, or one long base64 word
  mixing upper case, lower case and digits.

Kept (the look-alikes): tensor and array reprs, numbers, paths and file
names (hex inside a path or a file name, e.g. Ray's
``worker-<hex>-<pid>.out``), UUIDs, and hex named as an identifier: after
``commit``, ``sha``, ``rev``, ``digest``, ``checksum``, ``hash``, an
``...id``/``..._id`` name (``actor_id=``, ``run_id:``, ``task id``), or a
Ray id repr (``ObjectRef(...)``, ``ActorID(...)``, ``TaskID(...)``,
``NodeID(...)``), or a name itself saying identifier (``commit``,
``actor_id``, a name ending in ``actor``/``task``/``node``/``worker``/
``owner``; the items of a list under such a name too). A secret behind a name that says identifier *and* a shape
that says token (``"run_id": "hf_..."``) is still redacted: known token
shapes always win.

Not attempted: secrets with no name and no known shape (a 20-character
random password in a positional argument) cannot be told from data.
"""

from __future__ import annotations

import functools
import json
import os
import reprlib
import sys
from collections.abc import Mapping
from typing import Any

__all__ = [
    "REDACTED", "looks_like_secret_name", "looks_like_token", "redact", "redact_record", "redact_text",
    "redact_value", "redacted_repr", "relevant_environment", "safe_repr",
]

from raysleuth.redaction.text import (
    _KNOWN_TOKEN, REDACTED, looks_like_secret_name, looks_like_token, names_identifier, redact_text,
)

# --------------------------------------------------------------- structure

_MAX_DEPTH = 32
"""Containers deeper than this are kept as their redacted, bounded repr (never passed through raw)."""
_MAX_BYTES = 1 << 20
"""Bytes and JSON text up to this size are decoded and redacted; longer ones are not kept."""
_REPR_ITEMS = 200
"""Items kept per container by :func:`redact_value` (it feeds reprs); records keep every item."""

_secret_name = functools.lru_cache(maxsize=8192)(looks_like_secret_name)
_identifier_name = functools.lru_cache(maxsize=8192)(names_identifier)


def redact_value(value: Any, name: Any = None, _depth: int = 0) -> Any:
    """``value`` with secrets replaced, looking into dicts, lists, tuples, argv lists, pairs and JSON text.

    Containers come back as new containers of the same kind (at most 200
    items each; deeper than 32 levels, their redacted repr); bytes come back
    as redacted text; other objects come back unchanged (their ``repr`` is
    redacted as text by :func:`redacted_repr`).
    """
    return _redact(value, name, _depth, _REPR_ITEMS)


def redact_record(data: Any) -> Any:
    """A record's data as it may be stored: every string, name and byte string redacted, at any depth.

    What the recorder applies to every record of every kind (crash, death,
    stack_report, span, event, log...) when it leaves the worker's buffer,
    off the caller's thread. Unlike :func:`redact_value` it keeps every item,
    and objects JSON would write as their ``repr`` are kept as that repr,
    redacted. Never raises.
    """
    try:
        return _redact(data, None, 0, None)
    except Exception:
        return REDACTED


_PLAIN_TYPES = frozenset({int, float, bool, type(None)})


def _redact(value: Any, name: Any, depth: int, cap: int | None) -> Any:
    if type(name) is str:
        if _secret_name(name):
            return REDACTED
    else:
        name = None
    kind = type(value)
    if kind in _PLAIN_TYPES:
        return value
    if kind is str:
        return _redact_str(value, name, depth)
    if depth >= _MAX_DEPTH:
        return value if isinstance(value, (int, float)) else redact_text(safe_repr(value))
    try:
        if kind is dict or isinstance(value, Mapping):
            return _redact_mapping(value, depth, cap)
        if kind is list or kind is tuple or isinstance(value, (list, tuple)):
            return _redact_sequence(value, name, depth, cap)
    except Exception:
        return REDACTED
    if isinstance(value, (int, float)):  # numpy scalars, enums: numbers hold no secret
        return value
    if isinstance(value, str):
        return _redact_str(str(value), name, depth)
    if isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        if len(raw) > _MAX_BYTES:
            return f"<{len(raw)} bytes not kept: over {_MAX_BYTES} to redact>"
        return _redact_str(raw.decode("utf-8", "replace"), name, depth)
    if cap is None:  # a record: what JSON would write as its repr, redacted
        return redact_text(safe_repr(value, limit=4000))
    return value


def _redact_mapping(value: Mapping, depth: int, cap: int | None) -> dict:
    out = {}
    for key, item in (value.items() if cap is None else list(value.items())[:cap]):
        if type(key) is str and _secret_name(key):
            out[key] = REDACTED
        elif type(item) in _PLAIN_TYPES:  # most of a record: numbers, inline (spans are many)
            out[key] = item
        else:
            out[key] = _redact(item, key, depth + 1, cap)
    return out


def _redact_str(value: str, name: str | None, depth: int) -> str:
    if name is not None and _identifier_name(name):  # a commit, an actor id: kept unless it has a known token shape
        return _KNOWN_TOKEN.sub(REDACTED, value)
    if value[:1] in ("{", "[") and len(value) <= _MAX_BYTES and depth < _MAX_DEPTH:
        parsed = _json(value)
        if isinstance(parsed, (dict, list)):  # JSON text (RAY_JOB_CONFIG_JSON_ENV_VAR...): redacted by structure
            cleaned = _redact(parsed, name, depth + 1, None)
            return value if cleaned == parsed else json.dumps(cleaned)
    if len(value) <= 64:
        return _short_text(value)
    return REDACTED if looks_like_token(value) else redact_text(value)


@functools.lru_cache(maxsize=8192)
def _short_text(value: str) -> str:
    """A short string redacted (span names, phases, attribute values repeat: remembered)."""
    return REDACTED if looks_like_token(value) else redact_text(value)


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _redact_sequence(value: list | tuple, name: str | None, depth: int, cap: int | None) -> list | tuple:
    items = list(value if cap is None else value[:cap])
    inherited = name if name is not None and _identifier_name(name) else None  # actor_ids: [...] stay ids
    if len(items) == 2 and isinstance(items[0], str) and _secret_name(items[0]):
        out = [items[0], REDACTED]  # a (name, value) pair
    else:
        out = []
        secret_next = False
        for item in items:
            if secret_next:
                out.append(REDACTED)
                secret_next = False
                continue
            if isinstance(item, str) and item.startswith("-") and "=" not in item and len(item.split()) == 1 \
                    and _secret_name(item):
                secret_next = True  # argv: "--hf-token", "X"
                out.append(item)
                continue
            out.append(_redact(item, inherited, depth + 1, cap))
    if isinstance(value, tuple):
        try:
            return type(value)(*out) if hasattr(value, "_fields") else tuple(out)
        except Exception:
            return tuple(out)
    return out


# ------------------------------------------------------------------- reprs

_repr = reprlib.Repr()
_repr.maxstring = 240
_repr.maxother = 240
_repr.maxlist = _repr.maxtuple = _repr.maxset = _repr.maxfrozenset = _repr.maxdeque = 20
_repr.maxdict = 20
_repr.maxlevel = 3


def _array_summary(value: Any) -> str | None:
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if isinstance(value, torch.Tensor):
                return f"Tensor(shape={tuple(value.shape)}, dtype={value.dtype}, device={value.device})"
        except Exception:
            return None
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        try:
            if isinstance(value, numpy.ndarray):
                return f"ndarray(shape={value.shape}, dtype={value.dtype})"
        except Exception:
            return None
    return None


def safe_repr(value: Any, limit: int = 300) -> str:
    """A bounded ``repr`` that never raises (tensors and arrays summarised, long text cut). Not redacted."""
    try:
        text = _array_summary(value) or _repr.repr(value)
    except Exception as error:
        text = f"<repr failed: {type(error).__name__}>"
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return text


def redacted_repr(name: Any, value: Any, limit: int = 300) -> str:
    """The text to keep for ``name = value``: structure redacted, then the repr redacted as text."""
    if looks_like_secret_name(name):
        return REDACTED
    if value is None or isinstance(value, (bool, int, float)):  # numbers hold no secret: the hot path of logs
        return repr(value)
    try:
        cleaned = redact_value(value, name)
    except Exception:
        return REDACTED
    if cleaned is REDACTED or cleaned == REDACTED:
        return REDACTED
    text = safe_repr(cleaned, limit)
    if names_identifier(name) and isinstance(value, str):
        return text
    return redact_text(text)


_redacted_repr = redacted_repr  # the name capsule.py used


def redact(name: Any, value: Any) -> Any:
    """The value to keep for ``name``: ``<redacted>`` when the name or the value looks secret.

    Strings that are not secrets as a whole still have secret pieces
    replaced; dicts, lists and tuples are redacted inside; other values are
    returned unchanged unless the name is secret.
    """
    return redact_value(value, name)


# ------------------------------------------------------------ environment

_ENV_NAMES = frozenset({
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "ROLE_RANK",
    "CUDA_VISIBLE_DEVICES", "CUDA_LAUNCH_BLOCKING", "OMP_NUM_THREADS", "PYTHONPATH", "VIRTUAL_ENV",
    "HOSTNAME", "PYTORCH_CUDA_ALLOC_CONF", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
})
_ENV_PREFIXES = ("RAY_", "RAYSLEUTH_", "NCCL_", "MASTER_", "TORCH_", "TORCHELASTIC_", "VERL_", "VLLM_",
                 "HF_", "HUGGING_FACE_", "CUDA_", "TORCHINDUCTOR_", "GLOO_", "PYTORCH_")


def relevant_environment(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment variables that matter for a distributed crash, redacted."""
    env = os.environ if env is None else env
    kept = {}
    for name in sorted(env):
        if name in _ENV_NAMES or name.startswith(_ENV_PREFIXES):
            value = redact(name, env[name])
            kept[name] = value if len(value) <= 500 else value[:497] + "..."
    return kept
