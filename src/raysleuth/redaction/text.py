"""The text rules of redaction: which names are secret, which values look like tokens, ``redact_text``.

Pure, no I/O; :mod:`raysleuth.redaction` (the package) applies them to
structures, reprs and the environment. The line between a secret and a
look-alike is drawn in the package's docstring.
"""

from __future__ import annotations

import functools
import re
from typing import Any

__all__ = ["REDACTED", "looks_like_secret_name", "looks_like_token", "names_identifier", "redact_text"]

REDACTED = "<redacted>"

# ------------------------------------------------------------------- names

_WORD_SPLIT = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])")
#: A word that alone makes a name secret.
_SECRET_WORDS = frozenset({
    "password", "passwd", "passphrase", "pwd", "secret", "secrets", "credential", "credentials", "cookie",
    "cookies", "auth", "authorization", "apikey", "apitoken", "accesstoken", "authtoken", "secretkey",
    "privatekey", "accesskey", "apisecret", "clientsecret", "hftoken", "bearer", "refreshtoken",
    "sessiontoken", "xapikey", "oauth", "dsn", "pat", "sas", "signingkey", "webhook", "webhooks", "webhookurl",
    "connectionstring", "connstr", "databaseurl", "dburl", "jwt",
})
#: Before a final "pass", these words name a pass over data or code, not a password (``DB_PASS`` is one).
_PLAIN_PASS = frozenset({"forward", "backward", "first", "second", "third", "last", "next", "single", "multi",
                         "one", "two", "each", "per", "render", "compile", "compiler", "optimization", "opt", "post",
                         "pre", "by", "over", "under", "fused", "warmup", "eval", "train", "full", "extra", "no"})
#: Before a final "url"/"uri", these words name a URL that carries its credentials (``DATABASE_URL``).
_CREDENTIAL_URL = frozenset({"database", "db", "redis", "mongo", "mongodb", "postgres", "postgresql", "pg", "mysql",
                             "amqp", "broker", "sqlalchemy", "rabbitmq", "rabbit", "celery", "jdbc", "odbc", "sql"})
#: After "auth", these words name a setting, not a credential (``RAY_AUTH_MODE``, ``auth_url``).
_AUTH_SETTINGS = frozenset({"mode", "type", "method", "methods", "enabled", "required", "provider", "url",
                            "host", "domain", "scheme", "kind", "backend", "plugin", "timeout", "port"})
#: Before a final "token", these words name a vocabulary token (LLMs), not a credential.
_VOCAB_TOKEN = frozenset({"pad", "eos", "bos", "unk", "sep", "cls", "mask", "special", "start", "end", "stop",
                          "image", "video", "audio", "vision", "placeholder", "chat", "num", "max", "min",
                          "first", "last", "next", "prev", "sample", "output", "input", "decoder", "think",
                          "default", "additional", "new", "boi", "eoi", "tool", "user", "assistant", "system"})
#: Before a final "key", these words name a lookup/tensor key, not a credential.
_PLAIN_KEY = frozenset({"sort", "cache", "primary", "foreign", "dict", "lookup", "hash", "partition", "routing",
                        "shard", "group", "query", "kv", "map", "row", "column", "col", "field", "index",
                        "table", "unique", "s3", "object", "blob", "bucket", "sub", "parent", "child",
                        "cluster", "node", "metric", "metrics", "config", "state", "name", "file", "path",
                        "attention", "cross", "self", "dedup", "join", "record", "batch", "sample", "item",
                        "entry", "tensor", "param", "module", "layer", "weight", "checkpoint", "ckpt", "prefix",
                        "cache", "rng", "random", "seed", "data", "dataset", "redis", "store", "the", "a",
                        "keyboard", "hot", "shift", "ctrl", "alt", "event"})
#: Names that match the words above but are well known not to hold secrets.
_NOT_SECRET_NAMES = frozenset({"PWD", "OLDPWD", "KEYBOARD", "SORT_KEY", "KEY_FUNC", "TOKENIZERS_PARALLELISM",
                               "RAY_AUTH_MODE"})
#: A name that says "this is an identifier", whose hex value is kept.
_ID_WORDS = frozenset({"id", "ids", "sha", "sha1", "sha256", "commit", "rev", "revision", "digest", "checksum",
                       "hash", "fingerprint", "uuid", "xxh3", "md5", "blake2b", "etag", "hexsha", "oid"})


def _words(name: str) -> list[str]:
    return [word.lower() for word in _WORD_SPLIT.split(name) if word]


def looks_like_secret_name(name: Any) -> bool:
    """True when a variable/key/flag/environment name says its value is a secret."""
    if not name or not isinstance(name, str) or len(name) > 128:
        return False
    return _secret_name(name)


@functools.lru_cache(maxsize=8192)  # names repeat (keys, flags, loss= lr= in log lines)
def _secret_name(name: str) -> bool:
    bare = name.strip().lstrip("-").strip("'\"")
    if not bare or bare.upper() in _NOT_SECRET_NAMES:
        return False
    words = _words(bare)
    for index, word in enumerate(words):
        after = words[index + 1] if index + 1 < len(words) else None
        before = words[index - 1] if index else None
        if word in ("auth", "oauth"):
            if after not in _AUTH_SETTINGS:
                return True
            continue
        if word in _SECRET_WORDS:
            if word == "pwd" and len(words) == 1 and bare.isupper():
                return False  # the shell's working directory
            return True
        if word.endswith(("password", "passwd")):
            return True
        if word in ("connection", "conn") and after in ("string", "str", "uri", "url"):
            return True
        if after is None and word == "pass":
            return before not in _PLAIN_PASS
        if after is None and word in ("url", "uri") and before in _CREDENTIAL_URL:
            return True
        if after is None and word == "token":
            return before not in _VOCAB_TOKEN
        if after is None and word == "key":
            return before is not None and before not in _PLAIN_KEY
    return False


def names_identifier(name: Any) -> bool:
    if not name or not isinstance(name, str):
        return False
    words = _words(name)
    return bool(words) and (words[-1] in _ID_WORDS or words[-1] in _RAY_ENTITIES
                            or words[-1] in {"id", "runid", "jobid", "taskid", "nodeid", "actorid", "objectid"})


#: A name ending in one of these holds a Ray id in evidence (``dead_actor``, ``owner``, ``parent_task``).
_RAY_ENTITIES = frozenset({"actor", "actors", "task", "tasks", "node", "nodes", "worker", "workers", "owner",
                           "parent", "ref", "refs", "placement", "group"})


# ------------------------------------------------------------------ shapes

_KNOWN_TOKENS = (
    r"\bsk-(?:ant-|proj-|svcacct-)?[A-Za-z0-9_\-]{16,}"   # OpenAI / Anthropic
    r"|\bhf_[A-Za-z0-9]{20,}"                           # Hugging Face
    r"|\b(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{20,}"      # GitHub
    r"|\bgithub_pat_[A-Za-z0-9_]{20,}"
    r"|\bglpat-[A-Za-z0-9_\-]{20,}"                     # GitLab
    r"|\bxox[abposr]-[A-Za-z0-9\-]{10,}"                # Slack
    r"|\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"                   # AWS access key ids
    r"|\bAIza[0-9A-Za-z_\-]{35}"                        # Google API keys
    r"|\bya29\.[0-9A-Za-z_\-]{20,}"                     # Google OAuth access tokens
    r"|\b(?:sk|rk|pk)_(?:live|test)_[0-9A-Za-z]{16,}"   # Stripe
    r"|\bnpm_[A-Za-z0-9]{30,}"                          # npm
    r"|\bpypi-[A-Za-z0-9_\-]{40,}"                      # PyPI
    r"|\beyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}"  # JWTs
    r"|eyJ[A-Za-z0-9_\-]{5,}\.eyJ[A-Za-z0-9_\-]*\.[A-Za-z0-9_\-]*"  # JWTs glued to text (Bearer%20eyJ...), unsigned
    r"|\bhttps://hooks\.slack\.com/(?:services|workflows|triggers)/[A-Za-z0-9/_\-]+"  # Slack webhooks
    r"|\bhttps://(?:ptb\.|canary\.)?discord(?:app)?\.com/api/webhooks/[0-9]+/[A-Za-z0-9_\-]+"  # Discord webhooks
    r"|-----BEGIN[A-Z ]*PRIVATE KEY-----[\s\S]*?(?:-----END[A-Z ]*PRIVATE KEY-----|$)"
)
# the lookahead on the first characters of every shape lets the engine skip most positions (~3x faster)
_KNOWN_TOKEN = re.compile(f"(?=[shgxAyrpne-])(?:{_KNOWN_TOKENS})")
#: ``Authorization: Basic xxx`` / ``Bearer xxx`` / ``Token xxx``: the credential after the scheme.
_AUTH_SCHEME = re.compile(r"(?P<lead>\b(?:Basic|Bearer|Token|Digest|Negotiate)\s+)(?P<value>[A-Za-z0-9._~+/=\-]{6,})")
_AUTH_HEADER = re.compile(
    r"(?P<lead>\b(?:Proxy-)?Authorization['\"]?\s*[:=]\s*['\"]?(?:(?:Basic|Bearer|Token|Digest)\s+)?)"
    r"(?P<value>[^\s'\",}\]]+)", re.IGNORECASE)
#: ``scheme://user:password@host`` and ``scheme://token@host``.
_URL_CREDENTIALS = re.compile(r"(?P<lead>\b[A-Za-z][A-Za-z0-9+.\-]*://)(?P<user>[^\s/:@'\"]*)"
                              r"(?::(?P<password>[^\s/@'\"]*))?@")
#: argv flags and ``name=value`` / ``name: value`` / ``"name": "value"`` in text; the name is judged in code.
_ASSIGNMENT = re.compile(  # also with escaped quotes: \"name\": \"value\" in JSON held in a JSON string
    r"(?P<lead>(?P<q1>(?:\\*['\"])?)(?P<name>-{0,2}[A-Za-z_][A-Za-z0-9_.\-]{0,80})(?P=q1)\s*[:=]\s*"
    r"(?:(?P<q2>['\"])|(?P<e2>\\+['\"]))?)"
    r"(?P<value>(?(q2)[^'\"\n]*|(?(e2)[^'\"\n\\]*|[^\s'\",;}\)\]]+)))")
_FLAG = re.compile(r"(?<![\w-])(?P<lead>(?P<name>--?[A-Za-z][A-Za-z0-9_.\-]{0,80})\s+(?P<q2>['\"])?)"
                   r"(?P<value>(?(q2)[^'\"\n]*|[^\s'\",;}\)\]-][^\s'\",;}\)\]]*))")
#: ``('name', 'value')`` / ``'--flag', 'value'`` in a repr.
_PAIR = re.compile(r"(?P<lead>(?P<q1>['\"])(?P<name>-{0,2}[A-Za-z_][A-Za-z0-9_.\-]{0,80})(?P=q1)\s*,\s*(?P<q2>['\"]))"
                   r"(?P<value>[^'\"\n]*)")
#: 32+ hex digits as a word (not inside a path or a file name).
_HEX_RUN = re.compile(r"(?<![A-Za-z0-9/\\_.\-])[0-9a-fA-F]{32,}(?![A-Za-z0-9/\\_\-]|\.[A-Za-z])")
_HEX_CONTEXT = re.compile(
    r"(?:(?:\b(?i:commit|sha\d*|rev|revision|digest|checksum|hash|fingerprint|xxh3|blake2b|md5|etag|oid|uuid"
    r"|ids?|session|run|job|task|actor|node|object|worker|placement group)|\b[A-Za-z]+_(?i:ids?)|[a-z]ID|\bID)"
    r"['\"]?\s*[:=(]?\s*['\"]?"
    r"|\b(?:ObjectRef|ObjectID|ActorID|TaskID|NodeID|JobID|WorkerID|PlacementGroupID|ActorHandle|ClientObjectRef)"
    r"\(\s*['\"]?|@)$")
_HEX_WORD = re.compile(r"[0-9a-fA-F]{32,}")
_B64_WORD = re.compile(r"[A-Za-z0-9+/_\-]{32,}={0,2}")
#: Cheap first test (log messages pass here on the hot path): a secret this module finds needs either a run
#: of 16+ token characters (every token shape, long hex) or one of these stems (a name, a scheme, a URL).
_LONG_RUN = re.compile(r"[A-Za-z0-9_+/.=-]{16,}")
_STEMS = ("pass", "secret", "token", "key", "auth", "cred", "cookie", "pwd", "bearer", "basic", "digest",
          "negotiate", "dsn", "://", "private", "--pat", "sas=", "sas:", "eyj", "conn_str", "connstr",
          "connection_string", "connectionstring", "webhook", "_url", "_uri")


def _maybe_secret(text: str) -> bool:
    if _LONG_RUN.search(text):
        return True
    lowered = text.lower()
    return any(stem in lowered for stem in _STEMS)


def looks_like_token(value: Any) -> bool:
    """True when a whole string value looks like a credential (a known token shape, long hex/base64)."""
    if not isinstance(value, str):
        return False
    text = value.strip()
    if len(text) < 8 or len(text) > 4096:
        return False
    if _KNOWN_TOKEN.search(text) or _AUTH_SCHEME.match(text):
        return True
    if _HEX_WORD.fullmatch(text):
        return any(c.isdigit() for c in text) and any(c.isalpha() for c in text)
    if _B64_WORD.fullmatch(text) and not text.startswith(("/", "-", "_")):
        return (any(c.isupper() for c in text) and any(c.islower() for c in text)
                and any(c.isdigit() for c in text) and not _looks_like_identifier(text))
    return False


def _looks_like_identifier(text: str) -> bool:
    """snake_case/kebab-case words of letters (``my_long_module_name_for_tests``) are names, not tokens."""
    parts = re.split(r"[_\-]", text)
    return len(parts) >= 3 and all(part.isalpha() or part.isdigit() for part in parts if part)


_SCHEMES = frozenset({"Basic", "Bearer", "Token", "Digest", "Negotiate"})


def _sub_named(match: re.Match) -> str:
    value = match.group("value")
    if (not value or value.startswith(REDACTED) or value in _SCHEMES
            or not looks_like_secret_name(match.group("name"))):
        return match.group(0)
    return match.group("lead") + REDACTED


def _sub_url(match: re.Match) -> str:
    user, password = match.group("user"), match.group("password")
    if password is not None and password:
        return f"{match.group('lead')}{user}:{REDACTED}@"
    if user and looks_like_token(user):
        return f"{match.group('lead')}{REDACTED}@"
    return match.group(0)


def _sub_hex(match: re.Match) -> str:
    text = match.string
    before = text[max(0, match.start() - 40):match.start()]
    run = match.group(0)
    if not (any(c.isdigit() for c in run) and any(c.isalpha() for c in run)):
        return run
    if _HEX_CONTEXT.search(before):
        return run
    return REDACTED


def redact_text(text: Any) -> Any:
    """Free text with credentials replaced by ``<redacted>`` (see the module docstring for the line)."""
    if not text or not isinstance(text, str) or not _maybe_secret(text):
        return text
    try:
        text = _KNOWN_TOKEN.sub(REDACTED, text)
        text = _AUTH_HEADER.sub(lambda m: m.group("lead") + (m.group("value") if m.group("value").startswith(
            REDACTED) else REDACTED), text)
        text = _AUTH_SCHEME.sub(lambda m: m.group("lead") + (m.group("value") if m.group("value").startswith(
            REDACTED) else REDACTED), text)
        if "://" in text:
            text = _URL_CREDENTIALS.sub(_sub_url, text)
        text = _PAIR.sub(_sub_named, text)
        text = _ASSIGNMENT.sub(_sub_named, text)
        text = _FLAG.sub(_sub_named, text)
        return _HEX_RUN.sub(_sub_hex, text)
    except Exception:
        return REDACTED
