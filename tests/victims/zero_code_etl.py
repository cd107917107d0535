"""Victim job with no raysleuth in it: a small Ray data-prep job in which one record is malformed.

``parse_record`` raises KeyError for the bad record; the driver skips that
record, reports it, and finishes (exit 0). Used with ``ray job submit`` and
the ``worker_process_setup_hook`` given at submission.

Run: ``python tests/victims/zero_code_etl.py``.
"""

from __future__ import annotations

import ray


@ray.remote(num_cpus=0)
def parse_record(record: dict) -> int:
    db_password = "pg-s3cr3t-pa55w0rd"  # noqa: F841 - a secret in the locals of the crash
    return len(record["text"])


def main() -> None:
    ray.init()
    records = [{"text": "hello"}, {"body": "no text field"}, {"text": "world!"}]
    lengths = []
    for ref in [parse_record.remote(record) for record in records]:
        try:
            lengths.append(ray.get(ref))
        except ray.exceptions.RayTaskError as error:
            print(f"skipped a record: {type(error.cause).__name__}: {error.cause}")
    print(f"parsed lengths: {lengths}")


if __name__ == "__main__":
    main()
