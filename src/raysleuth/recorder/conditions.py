"""The SQL conditions the store's partial indexes are made with (:mod:`raysleuth.recorder.migrations`) and its
readers spell again, exactly, so that SQLite reads those indexes."""

from __future__ import annotations

_NUMBER = " AND ".join(f"typeof({c}) IN ('integer', 'null') AND coalesce({c}, 0) != -9223372036854775808"
                       for c in ("rank", "step", "v0", "v1", "v2", "v3", "v4"))
#: The memory rows a pass of :mod:`raysleuth.recorder.blocks` copies into its blocks: a packed sample of a known
#: sender whose rank, step and numbers are integers or null (never int64's lowest, a block's null) and whose
#: source is text or null. Migration 5 spells it in its index; a reader matches that spelling exactly.
SEALED = (f"kind = 'memory' AND data = '' AND sender IS NOT NULL AND typeof(time) IN ('real', 'integer') "
          f"AND {_NUMBER} AND typeof(v5) IN ('text', 'null')")

#: The span rows a pass of :mod:`raysleuth.recorder.span_blocks` reads (those it takes into its block, the
#: top-level ones with a numeric duration, it tells apart itself): a span whose fields the writer copied into the
#: value columns (:data:`COPIED`, marked), of a known sender, with an integer step and rank, a text phase and a
#: duration that is a float or an integer within 2**31 (as a float it sums as the integers do). Migration 7
#: spells it in its index; a reader matches that spelling exactly.
SPAN_SEALED = ("kind = 'span' AND NOT (data = '') AND v5 IS 1 AND sender IS NOT NULL AND typeof(step) = 'integer' "
               "AND typeof(rank) = 'integer' AND typeof(coalesce(name, phase, '?')) = 'text' "
               "AND (typeof(v0) != 'integer' OR v0 BETWEEN -2147483647 AND 2147483647)")

#: The log levels the report's logs section shows (most severe first).
SEVERE_LEVELS = ("CRITICAL", "ERROR", "WARNING")
#: The log rows that may be warnings or errors: the level column one of :data:`SEVERE_LEVELS` in any case, or empty
#: (a foreign writer's row may name its level in its data; the reader looks there). Migration 8 spells it in its
#: index; a reader matches that spelling exactly (``reading.where_clause(severe_logs=True)``).
LOG_SEVERE = ("kind = 'log' AND (upper(level) IN (" + ", ".join(f"'{level}'" for level in SEVERE_LEVELS) +
              ") OR coalesce(level, '') = '')")

#: The spans with a step that no span block holds as they were written (:mod:`raysleuth.recorder.span_blocks` keeps
#: those with a rank, no parent and a numeric duration that :data:`SPAN_SEALED` admits, named ``coalesce(name,
#: phase, '?')``): without a rank, without a name, nested, with another duration, or left out by ``SPAN_SEALED``.
#: ``raysleuth timeline --summary`` reads these row by row beside the blocks. Migration 9 spells it in its index.
SPAN_UNBLOCKED = ("kind = 'span' AND step IS NOT NULL AND (rank IS NULL OR name IS NULL OR NOT (IFNULL(v1, 0) IN "
                  f"(0, '') AND typeof(v0) IN ('integer', 'real')) OR NOT ({SPAN_SEALED}))")
