"""What the newest migrations added, as statements that take it out again: tests make files of older versions by
running them (then ``PRAGMA user_version``)."""

#: Migration 9's kept counts of each kind and its index of the spans no block holds as written.
UNDO_9 = ("DROP TRIGGER kind_counts_insert", "DROP TRIGGER kind_counts_update", "DROP TRIGGER kind_counts_delete",
          "DROP TABLE kind_counts", "DROP INDEX span_unblocked")
