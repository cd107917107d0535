"""Zero-code setup without Ray: the runtime_env merge, the fatal-signal file, and `raysleuth run` itself.

`raysleuth run` is run as a real subprocess on small real programs: the
job's output, exit code and signals must come through as if it ran alone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from raysleuth.cli.run import exit_code, job_environment
from raysleuth.worker_setup import SETUP_HOOK, add_setup_hook, fatal_file_path, header_line, parse_header
from raysleuth.worker_setup.hook import ENV_HOOK, PREVIOUS_ENV_HOOK, USER_SETUP_HOOK, runtime_env_hook

SRC = str(Path(__file__).resolve().parent.parent / "src")


def _raysleuth(*args: str, **kwargs) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]))
    return subprocess.Popen([sys.executable, "-m", "raysleuth", *args], env=env, **kwargs)


# ------------------------------------------------------------- runtime_env merge (pure)


def test_hook_is_added_to_an_empty_runtime_env_with_the_settings():
    merged = add_setup_hook(None, {"RAYSLEUTH_MODE": "full", "RAYSLEUTH_HOME": "/h", "VERL_MEMORY_PROFILE": "1",
                                   "UNRELATED": "x"})
    assert merged["worker_process_setup_hook"] == SETUP_HOOK
    assert merged["env_vars"] == {"RAYSLEUTH_MODE": "full", "RAYSLEUTH_HOME": "/h", "VERL_MEMORY_PROFILE": "1"}


def test_the_jobs_own_runtime_env_is_kept_and_wins():
    job = {"pip": ["numpy"], "working_dir": ".", "env_vars": {"RAYSLEUTH_MODE": "light", "TOKENIZERS_PARALLELISM": "false"}}
    merged = add_setup_hook(job, {"RAYSLEUTH_MODE": "full", "RAYSLEUTH_HOME": "/h"})
    assert merged["pip"] == ["numpy"] and merged["working_dir"] == "."
    assert merged["env_vars"] == {"RAYSLEUTH_MODE": "light", "TOKENIZERS_PARALLELISM": "false", "RAYSLEUTH_HOME": "/h"}
    assert job["env_vars"] == {"RAYSLEUTH_MODE": "light", "TOKENIZERS_PARALLELISM": "false"}  # input untouched
    assert "worker_process_setup_hook" not in job


def test_a_jobs_own_setup_hook_still_runs_after_ours():
    merged = add_setup_hook({"worker_process_setup_hook": "mylib.setup.configure"}, {})
    assert merged["worker_process_setup_hook"] == SETUP_HOOK
    assert merged["env_vars"][USER_SETUP_HOOK] == "mylib.setup.configure"

    calls = []
    merged = add_setup_hook({"worker_process_setup_hook": lambda: calls.append("job")}, {"RAYSLEUTH_MODE": "off"})
    assert callable(merged["worker_process_setup_hook"])  # off: the job's hook, untouched
    merged = add_setup_hook({"worker_process_setup_hook": lambda: calls.append("job")}, {})
    hook = merged["worker_process_setup_hook"]
    assert hook.func.__name__ == "_setup_then" and hook.args[0]() is None and calls == ["job"]


def test_mode_off_adds_nothing():
    assert add_setup_hook(None, {"RAYSLEUTH_MODE": "off"}) is None
    assert add_setup_hook({"env_vars": {"A": "1"}}, {"RAYSLEUTH_MODE": "OFF"}) == {"env_vars": {"A": "1"}}


def test_runtime_env_hook_runs_a_previous_hook_first(monkeypatch):
    monkeypatch.setenv(PREVIOUS_ENV_HOOK, "test_worker_setup.previous_hook")
    monkeypatch.delenv("RAYSLEUTH_MODE", raising=False)
    merged = runtime_env_hook({"env_vars": {"A": "1"}})
    assert merged["env_vars"]["A"] == "1" and merged["env_vars"]["FROM_PREVIOUS_HOOK"] == "yes"
    assert merged["worker_process_setup_hook"].__name__ == "raysleuth_setup_worker"


def previous_hook(runtime_env):
    runtime_env = dict(runtime_env or {})
    runtime_env["env_vars"] = dict(runtime_env.get("env_vars") or {}, FROM_PREVIOUS_HOOK="yes")
    return runtime_env


def test_job_environment_sets_the_hook_and_keeps_a_previous_one():
    env = job_environment({"RAY_RUNTIME_ENV_HOOK": "their.hook", "PATH": "/bin"}, mode="full", address="local",
                          home=Path("/tmp/rs-home"))
    assert env["RAY_RUNTIME_ENV_HOOK"] == ENV_HOOK and env[PREVIOUS_ENV_HOOK] == "their.hook"
    assert env["RAYSLEUTH_MODE"] == "full" and env["RAY_ADDRESS"] == "local"
    assert env["RAYSLEUTH_HOME"] == "/tmp/rs-home" and env["PATH"] == "/bin"
    assert SRC in env["PYTHONPATH"].split(os.pathsep)  # workers can import raysleuth from this checkout
    plain = job_environment({}, mode=None, address=None, home=None)
    assert "RAYSLEUTH_MODE" not in plain and "RAY_ADDRESS" not in plain and PREVIOUS_ENV_HOOK not in plain


# ------------------------------------------------------------- fatal-signal file


def test_header_round_trip():
    line = header_line(4242, None, "ab12", "01000000")
    assert line == "# raysleuth fatal-signal file pid=4242 rank=- actor_id=ab12 job_id=01000000"
    fields = parse_header(line + "\nFatal Python error: Segmentation fault\n# rank=3\n")
    assert fields == {"pid": "4242", "rank": "3", "actor_id": "ab12", "job_id": "01000000"}


def test_fatal_file_gets_the_stack_of_a_real_segfault(tmp_path):
    code = (
        "import ctypes, sys\n"
        "from raysleuth.worker_setup import fatal\n"
        f"fatal.install({str(tmp_path)!r}, rank=None, job_id='02000000')\n"
        "fatal.note_rank(5)\n"
        "def read_weights():\n"
        "    ctypes.string_at(0)\n"
        "read_weights()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=SRC),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == -signal.SIGSEGV
    files = list(tmp_path.glob("raysleuth-fatal-*.log"))
    assert len(files) == 1
    text = files[0].read_text()
    assert text.startswith("# raysleuth fatal-signal file pid=")
    assert parse_header(text)["rank"] == "5"
    assert "Segmentation fault" in text and "in read_weights" in text
    assert "Fatal Python error" not in done.stderr  # the stack went to the file, not the worker's stderr


def test_fatal_file_is_removed_on_a_clean_exit(tmp_path):
    code = f"from raysleuth.worker_setup import fatal; fatal.install({str(tmp_path)!r})"
    subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=SRC), check=True, timeout=60)
    assert list(tmp_path.glob("raysleuth-fatal-*.log")) == []
    assert fatal_file_path(tmp_path, 7).name == "raysleuth-fatal-7.log"


def test_setup_worker_outside_ray_never_raises_and_prints_nothing():
    code = ("import raysleuth, sys; raysleuth.setup_worker(); from raysleuth.worker_setup import setup_report; "
            "r = setup_report(); sys.stderr.write(repr(sorted(r['installed'])) + '|' + repr(r['errors']))")
    done = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=SRC),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout == ""
    installed, errors = done.stderr.split("|")
    assert "fatal_signal_file: not available here" in errors  # no Ray session: noted, not raised
    assert "control" in installed


def test_setup_worker_in_mode_off_installs_nothing():
    code = ("import raysleuth, sys; raysleuth.setup_worker(); from raysleuth.worker_setup import setup_report; "
            "from raysleuth import control; print(setup_report()['installed'], control.thread())")
    done = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=SRC, RAYSLEUTH_MODE="off"),
                          capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "[] None"


# ------------------------------------------------------------- raysleuth run: output, exit code, signals


def test_exit_code_mapping():
    assert exit_code(0) == 0 and exit_code(3) == 3 and exit_code(-signal.SIGKILL) == 137


def test_run_passes_output_arguments_and_exit_code_through():
    job = "import sys; print('out', sys.argv[1:]); print('err', file=sys.stderr); sys.exit(7)"
    proc = _raysleuth("run", "--", sys.executable, "-c", job, "--lr", "0.1", stdout=subprocess.PIPE,
                      stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 7
    assert out == "out ['--lr', '0.1']\n" and err == "err\n"


def test_run_returns_128_plus_signal_when_the_job_is_killed():
    proc = _raysleuth("run", "--", sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert proc.wait(timeout=60) == 137


@pytest.mark.parametrize("signum,code", [(signal.SIGINT, 42), (signal.SIGTERM, 43)])
def test_run_passes_signals_to_the_job_once(signum, code):
    job = (
        "import signal, sys, time\n"
        "got = []\n"
        "signal.signal(signal.SIGINT, lambda *a: got.append('INT'))\n"
        "signal.signal(signal.SIGTERM, lambda *a: got.append('TERM'))\n"
        "print('ready', flush=True)\n"
        "deadline = time.time() + 30\n"
        "while not got and time.time() < deadline: time.sleep(0.01)\n"
        "time.sleep(0.3)\n"
        "print(got, flush=True)\n"
        "sys.exit({'INT': 42, 'TERM': 43}.get(got[0] if got else '', 1))\n"
    )
    proc = _raysleuth("run", "--", sys.executable, "-c", job, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signum)
    rest, _ = proc.communicate(timeout=60)
    assert proc.returncode == code
    assert rest.strip() in ("['INT']", "['TERM']")  # delivered once


def test_run_without_a_command_is_a_usage_error():
    proc = _raysleuth("run", stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "no command to run" in err and "Traceback" not in err
    proc = _raysleuth("run", "--mode", "loud", "--", "python", stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "unknown mode" in err
    proc = _raysleuth("run", "--", "no-such-command-xyz", stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "command not found" in err



def test_the_jobs_own_setup_hook_runs_after_raysleuths(tmp_path):
    (tmp_path / "jobhooks.py").write_text(
        "import os, sys\n"
        "def configure():\n"
        "    done = 'raysleuth.worker_setup.worker' in sys.modules\n"
        "    open(os.environ['HOOK_MARK'], 'w').write('after raysleuth' if done else 'before raysleuth')\n")
    mark = tmp_path / "mark.txt"
    done = subprocess.run([sys.executable, "-c", "import raysleuth; raysleuth.setup_worker()"],
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, str(tmp_path)]),
                                   RAYSLEUTH_USER_SETUP_HOOK="jobhooks.configure", HOOK_MARK=str(mark)),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert mark.read_text() == "after raysleuth"


def test_the_hook_raysleuth_run_ships_tolerates_a_node_without_raysleuth(tmp_path):
    import cloudpickle

    from raysleuth.worker_setup.hook import tolerant_setup_hook

    merged = runtime_env_hook({"env_vars": {"A": "1"}})
    hook = merged["worker_process_setup_hook"]
    assert callable(hook) and merged["env_vars"]["A"] == "1"
    payload = tmp_path / "hook.pkl"
    payload.write_bytes(cloudpickle.dumps(hook))  # what Ray exports to the cluster: the code itself
    (tmp_path / "raysleuth.py").write_text("raise ImportError('raysleuth is not installed here')\n")
    code = ("import pickle, sys; sys.path.insert(0, sys.argv[2]); hook = pickle.loads(open(sys.argv[1], 'rb').read()); "
            "hook(); print('worker runs on')")
    done = subprocess.run([sys.executable, "-c", code, str(payload), str(tmp_path)], capture_output=True, text=True,
                          timeout=60, env={key: value for key, value in os.environ.items() if key != "PYTHONPATH"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "worker runs on"
    assert tolerant_setup_hook().__module__ == "__main__"  # pickled by value, never by reference


def test_the_last_look_at_deaths_runs_at_exit_while_thread_pools_still_take_work():
    """The driver's last look reads logs and asks node agents through thread pools; run from plain ``atexit``
    every pool refused it ("cannot schedule new futures after interpreter shutdown") and a rank killed just
    before the job ended was never stored. The real last look is swapped for one that uses a pool the same way."""
    script = (
        "import concurrent.futures, raysleuth.deaths.watch as watch, raysleuth.worker_setup.hook as hook\n"
        "def look():\n"
        "    with concurrent.futures.ThreadPoolExecutor(2) as pool:\n"
        "        print('looked', sum(pool.map(abs, [-1, -2])), flush=True)\n"
        "watch.last_look = look\n"
        "hook._look_at_deaths_on_exit()\n"
        "print('job done', flush=True)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parent.parent / "src"),
                                                       os.environ.get("PYTHONPATH", "")]))
    env.pop("RAYSLEUTH_MODE", None)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["job done", "looked 3"], (done.stdout, done.stderr)
