"""Rank-aware stdlib loggers: a filter, a store handler, and ``get_logger``.

- :class:`RankFilter` adds ``rank``, ``world_size``, ``node``, ``node_id``,
  ``pid``, ``actor``, ``actor_id``, ``step``, ``phase`` and ``rank_label``
  to every record it sees (add it to your own handlers or loggers).
- :class:`StoreHandler` ships records at or above
  ``runtime.settings().log_level`` to the evidence store (kind ``log``)
  through the batching client: a deque append, never a block, never a raise.
- :func:`get_logger` returns a real ``logging.Logger`` (a subclass that also
  takes ``rank=``, ``step=``, ``phase=`` and extra keyword fields:
  ``logger.info("loss=%.3f", loss, rank=3, step=100)``), with the filter,
  the store handler, a rank-tagged console handler (when nothing else prints
  logs) and a file handler for ``VERL_DEBUG_LOG`` / ``RAYSLEUTH_LOG_FILE``.
- :func:`install_log_shipping` puts the filter and store handler on the root
  logger of a worker process (idempotent): every library's logs reach the store.
"""

from __future__ import annotations

import logging
import sys
import threading
import weakref
from typing import Any

from raysleuth import runtime
from raysleuth.recorder import record as store_record
from raysleuth.redaction import REDACTED, looks_like_secret_name, redact, redact_text, redacted_repr

__all__ = [
    "RANK_FORMAT",
    "RankFilter",
    "RankLogger",
    "StoreHandler",
    "distributed_logger",
    "get_logger",
    "install_log_shipping",
    "refresh_levels",
    "ship_level",
    "uninstall_log_shipping",
]

#: The format of raysleuth's console and file handlers.
RANK_FORMAT = "%(asctime)s [%(rank_label)s] %(levelname)s %(name)s: %(message)s"

#: Attributes :class:`RankFilter` sets on a record.
FIELDS = ("rank", "world_size", "node", "node_id", "pid", "actor", "actor_id", "step", "phase", "rank_label")

_LOGRECORD_ATTRS = frozenset(logging.LogRecord("x", 0, "x", 0, "", (), None).__dict__) | {"message", "asctime"}
_KNOWN_ATTRS = _LOGRECORD_ATTRS | set(FIELDS) | {"raysleuth_aggregate"}
_MAX_FIELD = 500


_LEVELS = {"DEBUG": logging.DEBUG, "INFO": logging.INFO, "WARNING": logging.WARNING,
           "ERROR": logging.ERROR, "CRITICAL": logging.CRITICAL}


def ship_level() -> int:
    """The lowest level shipped to the store (``runtime.settings().log_level``)."""
    return _LEVELS.get(runtime.settings().log_level, logging.INFO)


class RankFilter(logging.Filter):
    """Adds rank, world size, node, pid, actor, step and phase to each record.

    Values already on the record (from ``extra=`` or ``rank=``) win. Never
    drops a record. Add it to any handler or logger::

        handler.addFilter(rs.RankFilter())
        handler.setFormatter(logging.Formatter("[%(rank_label)s] %(message)s"))
    """

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            annotate(record)
        except Exception:
            pass
        return True


def annotate(record: logging.LogRecord) -> logging.LogRecord:
    """Set the rank fields on ``record`` (once; explicit values win)."""
    if getattr(record, "_raysleuth_annotated", False):
        return record
    me = runtime.whoami()
    values = record.__dict__
    if values.get("rank") is None:
        values["rank"] = me.rank
    if values.get("world_size") is None:
        values["world_size"] = me.world_size
    values.setdefault("node", me.node_ip or me.hostname)
    values.setdefault("node_id", me.node_id)
    values.setdefault("pid", me.pid)
    values.setdefault("actor", me.actor_name or me.actor_class or me.actor_id)
    values.setdefault("actor_id", me.actor_id)
    if values.get("step") is None:
        values["step"] = runtime.current_step()
    if values.get("phase") is None:
        values["phase"] = runtime.current_phase()
    rank = values["rank"]
    values["rank_label"] = f"rank {rank}" if rank is not None else me.role
    values["_raysleuth_annotated"] = True
    return record


def _redact_field(name: str, value: Any) -> Any:
    if isinstance(value, (bool, int, float)) or value is None:
        return REDACTED if looks_like_secret_name(name) else value
    return redacted_repr(name, value, 100_000) if not isinstance(value, str) else redact(name, value)


def _redact_arg(arg: Any, message: str, clean: str) -> str:
    """An argument's repr, redacted; and redacted whole when the message around it showed it is a secret."""
    if clean is not message and isinstance(arg, (str, bytes, int)):
        text = str(arg)
        if len(text) >= 4 and text in message and text not in clean:
            return REDACTED
    return redacted_repr(None, arg, 100_000)


def _short(value: Any) -> Any:
    if isinstance(value, (bool, int, float)) or value is None:
        return value
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= _MAX_FIELD else text[:_MAX_FIELD] + f"...(+{len(text) - _MAX_FIELD})"


class StoreHandler(logging.Handler):
    """Ships log records to the evidence store (kind ``log``) through the batching client.

    The threshold is read on every record from ``runtime.settings().log_level``
    (so switching modes applies at once), on top of the handler's own level.
    A record that passed through another StoreHandler already (propagation)
    is not shipped twice. Never raises into the caller: the first failure is
    reported once on stderr, later ones are counted in :attr:`failures`.
    """

    def __init__(self, level: int = logging.NOTSET) -> None:
        super().__init__(level)
        self.failures = 0
        self._busy = threading.local()

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "_raysleuth_shipped", False) or getattr(record, "raysleuth_aggregate", False):
            return
        settings = runtime.settings()
        if settings.mode == "off" or record.levelno < ship_level():
            return
        if getattr(self._busy, "active", False):
            return  # a log written while shipping one (recorder warnings): don't loop
        self._busy.active = True
        try:
            record._raysleuth_shipped = True
            annotate(record)
            store_record("log", record_data(record), name=record.name, level=record.levelname,
                         step=getattr(record, "step", None), phase=getattr(record, "phase", None), time_=record.created,
                         rank=getattr(record, "rank", None))
        except Exception:
            self.handleError(record)
        finally:
            self._busy.active = False

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 (stdlib name)
        self.failures += 1
        if self.failures == 1:
            try:
                error = sys.exc_info()[1]
                sys.stderr.write(f"raysleuth: could not ship a log record to the evidence store ({error!r}); "
                                 "further failures are silent\n")
            except Exception:
                pass


def record_data(record: logging.LogRecord) -> dict[str, Any]:
    """The ``data`` of a ``log`` record: message, template, place, args, exception, extra fields."""
    try:
        message = record.getMessage()
    except Exception as error:
        message = f"{record.msg!r} % {record.args!r} (formatting failed: {error})"
    clean = redact_text(message)
    data: dict[str, Any] = {
        "message": clean,
        # a template's literal text is in the message: redact it only when the message had something to hide
        "template": (record.msg if clean is message else redact_text(record.msg)) if isinstance(record.msg, str)
        else redact_text(repr(record.msg)),
        "module": record.module,
        "lineno": record.lineno,
        "funcName": record.funcName,
        "thread": record.threadName,
        "node": getattr(record, "node", None),
        "actor": getattr(record, "actor", None),
    }
    if record.args:
        args = record.args if isinstance(record.args, tuple) else (record.args,)
        data["args"] = [_short(_redact_arg(arg, message, clean)) for arg in args]
    if record.exc_info and not record.exc_text:
        try:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        except Exception:
            pass
    if record.exc_text:
        data["exc_text"] = redact_text(record.exc_text[-20_000:])
    if record.stack_info:
        data["stack_info"] = redact_text(record.stack_info[-20_000:])
    extra = record.__dict__.keys() - _KNOWN_ATTRS  # set arithmetic in C: cheap when there is none
    if extra:
        fields = {key: _short(_redact_field(key, record.__dict__[key])) for key in extra if not key.startswith("_")}
        if fields:
            data["fields"] = fields
    return data


class RankLogger(logging.Logger):
    """A stdlib logger whose calls also take ``rank=``, ``step=``, ``phase=`` and extra fields.

    ``logger.info("loss=%.3f", loss, rank=3, step=10, lr=1e-4)``: ``rank``,
    ``step`` and ``phase`` become the record's fields (and store columns);
    other keywords go to the record like ``extra=`` and to the store's
    ``data["fields"]``.
    """

    def _log(self, level, msg, args, exc_info=None, extra=None, stack_info=False, stacklevel=1,  # noqa: PLR0913
             **fields: Any) -> None:
        if fields:
            merged = dict(extra) if extra else {}
            for key, value in fields.items():
                if key in _LOGRECORD_ATTRS:
                    key = f"field_{key}"  # a field named like a LogRecord attribute would clash
                merged.setdefault(key, value)
            extra = merged
        # This frame is not in logging's own file: skip it so funcName/lineno name the caller.
        super()._log(level, msg, args, exc_info=exc_info, extra=extra, stack_info=stack_info,
                     stacklevel=stacklevel + _OWN_FRAMES)


_OWN_FRAMES = 1 if sys.version_info >= (3, 11) else 0


_rank_classes: dict[type, type] = {RankLogger: RankLogger, logging.Logger: RankLogger}
_managed: "weakref.WeakSet[logging.Logger]" = weakref.WeakSet()
_store_handler: StoreHandler | None = None
_file_handlers: dict[str, logging.Handler] = {}
_setup_lock = threading.RLock()


def _rank_class(cls: type) -> type:
    found = _rank_classes.get(cls)
    if found is None:
        found = type(f"Rank{cls.__name__}", (RankLogger, cls), {"_log": RankLogger._log})
        _rank_classes[cls] = found
    return found


def _to_rank_logger(name: str | None) -> logging.Logger:
    manager = logging.Logger.manager
    with logging._lock:  # type: ignore[attr-defined]  # the module lock Manager.getLogger takes (re-entrant)
        existing = manager.loggerDict.get(name) if name else None
        if name is None or name == "root":
            logger = logging.getLogger()
        elif isinstance(existing, logging.Logger):
            logger = existing
        else:
            previous = manager.loggerClass
            manager.loggerClass = RankLogger
            try:
                logger = manager.getLogger(name)
            finally:
                manager.loggerClass = previous
        if not isinstance(logger, RankLogger):
            try:
                logger.__class__ = _rank_class(type(logger))
            except TypeError:
                pass  # an exotic logger class: it keeps working, without rank= keywords
    return logger


def store_handler() -> StoreHandler:
    """The process's one :class:`StoreHandler` (shared by every raysleuth logger)."""
    global _store_handler
    with _setup_lock:
        if _store_handler is None:
            _store_handler = StoreHandler()
            _store_handler.addFilter(RankFilter())
        return _store_handler


def _file_handler(path: str) -> logging.Handler | None:
    with _setup_lock:
        handler = _file_handlers.get(path)
        if handler is None:
            try:
                handler = logging.FileHandler(path, encoding="utf-8", delay=True)
            except Exception:
                return None
            handler.addFilter(RankFilter())
            handler.setFormatter(logging.Formatter(RANK_FORMAT))
            handler._raysleuth_file = True  # type: ignore[attr-defined]
            _file_handlers[path] = handler
        return handler


class _ConsoleHandler(logging.StreamHandler):
    """stderr, rank-tagged; skips records another raysleuth console handler printed."""

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "_raysleuth_printed", False):
            return
        record._raysleuth_printed = True
        super().emit(record)


def get_logger(name: str | None = None, *, level: int | str | None = None, console: bool | None = None) -> logging.Logger:
    """A rank-aware stdlib logger for ``name`` (usually ``__name__``).

    The logger is the one ``logging.getLogger(name)`` returns (made to accept
    ``rank=``/``step=``/``phase=`` keywords), with :class:`RankFilter`, the
    store handler, and a file handler when ``RAYSLEUTH_LOG_FILE`` /
    ``VERL_DEBUG_LOG`` is set. ``console`` adds a rank-tagged stderr handler
    (default: only when the root logger has no handlers). ``level`` sets the
    logger's level (default: the shipping level, when the logger has none).
    Calling it again returns the same logger and adds nothing twice.
    """
    logger = _to_rank_logger(name)
    with _setup_lock:
        if level is not None:
            logger.setLevel(level)
        elif logger.level == logging.NOTSET or logger in _managed:
            logger.setLevel(ship_level())
            _managed.add(logger)
        if not any(isinstance(f, RankFilter) for f in logger.filters):
            logger.addFilter(RankFilter())
        handler = store_handler()
        if handler not in logger.handlers:
            logger.addHandler(handler)
        path = runtime.settings().log_file
        if path:
            file_handler = _file_handler(path)
            if file_handler is not None and file_handler not in logger.handlers:
                logger.addHandler(file_handler)
        if console is None:
            console = not logging.getLogger().handlers and not any(
                isinstance(h, _ConsoleHandler) for h in logger.handlers)
        if console and not any(isinstance(h, _ConsoleHandler) for h in logger.handlers):
            stream = _ConsoleHandler(sys.stderr)
            stream.addFilter(RankFilter())
            stream.setFormatter(logging.Formatter(RANK_FORMAT))
            logger.addHandler(stream)
    return logger


def distributed_logger(name: str | None = None, **options: Any) -> logging.Logger:
    """The seed articles' name for :func:`get_logger`."""
    return get_logger(name, **options)


def refresh_levels() -> None:
    """Re-apply the shipping level to the loggers :func:`get_logger` set it on (after a mode switch)."""
    level = ship_level()
    with _setup_lock:
        for logger in list(_managed):
            logger.setLevel(level)


def install_log_shipping(logger: logging.Logger | str | None = None) -> logging.Logger:
    """Ship every record of ``logger`` (default: the root logger) to the store. Idempotent.

    Puts :class:`RankFilter` and the store handler on it, and lowers its level
    to the shipping level when it is higher. For worker processes: after this,
    plain ``logging.getLogger(__name__).warning(...)`` in any library reaches
    ``raysleuth logs`` tagged with the rank.
    """
    target = logger if isinstance(logger, logging.Logger) else logging.getLogger(logger)
    with _setup_lock:
        handler = store_handler()
        if handler not in target.handlers:
            target.addHandler(handler)
        if target.getEffectiveLevel() > ship_level():
            target.setLevel(ship_level())
            _managed.add(target)
    return target


def uninstall_log_shipping(logger: logging.Logger | str | None = None) -> None:
    """Undo :func:`install_log_shipping` (the handler comes off; the level stays)."""
    target = logger if isinstance(logger, logging.Logger) else logging.getLogger(logger)
    with _setup_lock:
        if _store_handler is not None and _store_handler in target.handlers:
            target.removeHandler(_store_handler)
        _managed.discard(target)
