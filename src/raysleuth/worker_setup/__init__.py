"""Zero code change: instrument every worker of a job that contains no raysleuth.

Three ways in, one setup:

- ``raysleuth run -- python train.py``: the driver runs unchanged, with
  ``RAY_RUNTIME_ENV_HOOK`` pointing at :func:`runtime_env_hook`, which adds
  the worker hook to whatever ``runtime_env`` the job's ``ray.init`` asks for;
- ``ray job submit --runtime-env-json '{"worker_process_setup_hook": "raysleuth.setup_worker"}' -- python train.py``;
- ``ray.init(runtime_env={"worker_process_setup_hook": "raysleuth.setup_worker"})``.

Modules: :mod:`.worker` (what each worker installs), :mod:`.hook` (the
driver-side merge into ``runtime_env``), :mod:`.fatal` (the fatal-signal file).
"""

from raysleuth.worker_setup.fatal import fatal_file_path, header_line, parse_header
from raysleuth.worker_setup.hook import ENV_HOOK, SETUP_HOOK, add_setup_hook, runtime_env_hook
from raysleuth.worker_setup.worker import setup_report, setup_worker

__all__ = [
    "ENV_HOOK",
    "SETUP_HOOK",
    "add_setup_hook",
    "fatal_file_path",
    "header_line",
    "parse_header",
    "runtime_env_hook",
    "setup_report",
    "setup_worker",
]
