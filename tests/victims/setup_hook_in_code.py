"""The one-line way in for a job you *can* edit: raysleuth's setup hook given to ``ray.init``.

The only raysleuth in it is the ``runtime_env`` argument, exactly as the
README shows it: a task that meets a malformed record raises KeyError.

Run: ``python tests/victims/setup_hook_in_code.py``.
"""

from __future__ import annotations

import ray


@ray.remote(num_cpus=0)
def tokenize_record(record: dict) -> list[str]:
    return record["text"].split()


def main() -> None:
    ray.init(runtime_env={"worker_process_setup_hook": "raysleuth.setup_worker"})
    try:
        ray.get(tokenize_record.remote({"body": "no text field"}))
    except ray.exceptions.RayTaskError as error:
        print(f"skipped a record: {type(error.cause).__name__}: {error.cause}")


if __name__ == "__main__":
    main()
