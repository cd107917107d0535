"""What is a secret, and how values are shown without them (locals, environments, log arguments)."""

from __future__ import annotations

import os
import re
import reprlib
import sys
from collections.abc import Mapping
from typing import Any

REDACTED = "<redacted>"

#: Names (of variables, keys, environment variables) whose values are secrets.
_SECRET_NAME = re.compile(r"TOKEN|SECRET|KEY|PASSWORD|PASSWD|PWD|CREDENTIAL|AUTH|COOKIE|PRIVATE", re.IGNORECASE)
#: Names that match the pattern above but hold no secret.
_NOT_SECRET_NAMES = frozenset({"PWD", "OLDPWD", "KEYBOARD", "SORT_KEY", "KEY_FUNC"})

#: Token shapes recognised inside free text (messages, tracebacks, reprs).
_INLINE_TOKENS = re.compile(
    r"(?:"
    r"\bsk-[A-Za-z0-9_\-]{16,}"                       # OpenAI-style keys
    r"|\bhf_[A-Za-z0-9]{20,}"                          # Hugging Face tokens
    r"|\b(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{20,}"     # GitHub tokens
    r"|\bgithub_pat_[A-Za-z0-9_]{20,}"
    r"|\bxox[abposr]-[A-Za-z0-9\-]{10,}"               # Slack tokens
    r"|\bAKIA[0-9A-Z]{16}\b"                           # AWS access key ids
    r"|\beyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}"  # JWTs
    r"|(?<=Bearer )[A-Za-z0-9._~+/=\-]{8,}"            # Authorization: Bearer ...
    r")"
)
#: ``name=value`` / ``'name': 'value'`` pairs whose name says "secret".
_INLINE_ASSIGNMENT = re.compile(
    r"(?P<key>['\"]?[A-Za-z0-9_.\-]*(?:token|secret|key|password|passwd|credential|auth)[A-Za-z0-9_.\-]*['\"]?"
    r"\s*[:=]\s*)(?P<quote>['\"]?)(?P<value>[^\s'\",}\)\]]+)",
    re.IGNORECASE,
)
#: A whole value that is one long hex or base64-ish word looks like a token.
_HEX_TOKEN = re.compile(r"[0-9a-fA-F]{32,}")
_B64_TOKEN = re.compile(r"[A-Za-z0-9+/_\-]{32,}={0,2}")


def looks_like_secret_name(name: str | None) -> bool:
    """True when a variable/key/environment name says its value is a secret."""
    if not name:
        return False
    upper = str(name).upper()
    if upper in _NOT_SECRET_NAMES:
        return False
    return _SECRET_NAME.search(upper) is not None


def looks_like_token(value: str) -> bool:
    """True when a whole string value looks like a credential (long hex/base64, sk-, hf_, ghp_, Bearer ...)."""
    if not isinstance(value, str):
        return False
    text = value.strip()
    if len(text) < 8 or len(text) > 4096:
        return False
    if _INLINE_TOKENS.search(text):
        return True
    if " " in text or "/" in text.strip("=")[:1]:
        return False
    if _HEX_TOKEN.fullmatch(text):
        return True
    if _B64_TOKEN.fullmatch(text):
        # Mixed classes: a path-free word with upper, lower and digits (not a plain identifier).
        return (any(c.isupper() for c in text) and any(c.islower() for c in text)
                and any(c.isdigit() for c in text))
    return False


def redact_text(text: str) -> str:
    """Free text with token-shaped substrings and ``secret_name=value`` pairs replaced by ``<redacted>``."""
    if not text:
        return text
    try:
        text = _INLINE_TOKENS.sub(REDACTED, text)
        return _INLINE_ASSIGNMENT.sub(
            lambda m: m.group("key") + m.group("quote") + (m.group("value") if m.group("value") == REDACTED
                                                           else REDACTED),
            text,
        )
    except Exception:
        return text


def redact(name: str | None, value: Any) -> Any:
    """The value to keep for ``name``: ``<redacted>`` when the name or the value looks secret.

    Strings that are not secrets as a whole still have token-shaped pieces
    replaced; other values are returned unchanged unless the name is secret.
    """
    if looks_like_secret_name(name):
        return REDACTED
    if isinstance(value, str):
        if looks_like_token(value):
            return REDACTED
        return redact_text(value)
    return value


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
    """A bounded ``repr`` that never raises (tensors and arrays summarised, long text cut)."""
    try:
        text = _array_summary(value) or _repr.repr(value)
    except Exception as error:
        text = f"<repr failed: {type(error).__name__}>"
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return text


def _redacted_repr(name: str, value: Any, limit: int = 300) -> str:
    if looks_like_secret_name(name):
        return REDACTED
    if isinstance(value, str) and looks_like_token(value):
        return REDACTED
    return redact_text(safe_repr(value, limit))


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
