"""explain and advise: real error texts (issue reports and actual runs) against the knowledge base.

Every knowledge-base entry has at least one real text in ``tests/data/error_texts.json``
(its source is recorded next to it); ``get-timeout`` is produced live on the
test cluster. Pure matching runs without Ray.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from raysleuth.advise import PROBLEMS, advise
from raysleuth.errors import UsageError
from raysleuth.explain import explain, knowledge_base

HERE = Path(__file__).parent
REPO = HERE.parent
TEXTS = json.loads((HERE / "data" / "error_texts.json").read_text(encoding="utf-8"))
LIVE_ONLY = {"get-timeout"}  # produced by a real ray.get timeout in test_get_timeout_from_a_live_cluster


def test_every_knowledge_base_entry_has_a_real_text():
    ids = {entry.id for entry in knowledge_base()}
    covered = {item["id"] for item in TEXTS} | LIVE_ONLY
    assert ids - covered == set(), "entries without a real error text"
    assert covered - ids == set(), "texts for entries that do not exist"
    assert len(ids) == len(knowledge_base()), "duplicate ids"
    for entry in knowledge_base():
        assert entry.cause and entry.fix and entry.title and entry.patterns


@pytest.mark.parametrize("item", TEXTS, ids=[f"{item['id']}:{item['source'][-40:]}" for item in TEXTS])
def test_real_error_text_is_explained(item):
    matches = explain(item["text"])
    ids = [match.id for match in matches]
    assert item["id"] in ids, (item["source"], ids)
    found = matches[ids.index(item["id"])]
    plain = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", item["text"])
    quoted = found.evidence.removeprefix("...").removesuffix("...")
    assert quoted and quoted in plain, (found.evidence, item["source"])
    assert found.line >= 1


# Root cause first: Ray's wrappers around the real cause.
@pytest.mark.parametrize(("text_of", "root"), [
    ("actor-killed-by-ray-kill", "actor-killed-by-ray-kill"),
    ("actor-init-failed", "actor-init-failed"),
    ("module-not-found-in-worker", "module-not-found-in-worker"),
    ("node-died", "node-died"),
    ("worker-exited-with-code", "worker-exited-with-code"),
])
def test_root_cause_comes_before_the_wrappers(text_of, root):
    text = next(item["text"] for item in TEXTS if item["id"] == text_of)
    ids = [match.id for match in explain(text)]
    assert ids[0] == root and "actor-died" in ids[1:]


def test_causality_chain_task_error_actor_died_oom_kill():
    """A RayTaskError wrapping an ActorDiedError wrapping a memory-monitor kill: the OOM kill is the root."""
    oom = next(item["text"] for item in TEXTS if item["id"] == "ray-memory-monitor-oom")
    died = next(item["text"] for item in TEXTS if item["id"] == "actor-died")
    boom = next(item["text"] for item in TEXTS if item["id"] == "ray-task-error")
    chained = f"{boom.splitlines()[0]}\n{died}\nThe actor is dead because its worker process has died. {oom}"
    ids = [match.id for match in explain(chained)]
    assert ids[0] == "ray-memory-monitor-oom"
    assert ids.index("actor-died") > 0 and ids[-1] == "ray-task-error"


def test_module_not_found_inside_actor_init_is_the_root():
    text = next(item["text"] for item in TEXTS if item["id"] == "module-not-found-in-worker")
    first = explain(text)[0]
    assert first.id == "module-not-found-in-worker"
    assert "No module named 'not_a_real_module_xyz'" in first.evidence
    assert "working_dir" in first.fix


def test_unknown_text_and_empty_text():
    assert explain("everything is fine, loss 0.31 at step 100") == []
    assert explain("") == []


def test_explain_is_fast_on_a_large_log():
    text = ("2026-01-01 INFO step 17 loss 0.31 grad_norm 1.2 tokens/s 31337\n" * 40_000
            + next(item["text"] for item in TEXTS if item["id"] == "cuda-oom"))
    started = time.perf_counter()
    matches = explain(text)
    elapsed = time.perf_counter() - started
    assert matches[0].id == "cuda-oom" and matches[0].line == 40_001
    assert elapsed < 5.0


def test_ansi_colour_codes_do_not_hide_matches():
    text = "\x1b[36mray::A.f()\x1b[39m\n\x1b[31mRuntimeError: CUDA error: an illegal memory access was encountered\x1b[0m"
    assert explain(text)[0].id == "cuda-illegal-access"


# ------------------------------------------------------------------- CLI


def test_explain_cli_text_file_stdin_and_unknown(tmp_path, capsys):
    from raysleuth.cli import main

    text = next(item["text"] for item in TEXTS if item["id"] == "version-mismatch")
    assert main(["explain", text]) == 0
    out = capsys.readouterr().out
    assert "root cause" in out and "Ray or Python version differs" in out and "fix:" in out

    log = tmp_path / "driver.log"
    log.write_text("INFO start\n" + next(item["text"] for item in TEXTS if item["id"] == "nccl-watchdog-timeout"))
    assert main(["explain", "--file", str(log), "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["verdict"] == "explained" and payload["matches"][0]["id"] == "nccl-watchdog-timeout"
    assert payload["matches"][0]["line"] == 2

    assert main(["explain", "all good here"]) == 1
    assert "no known cause" in capsys.readouterr().out
    assert main(["explain", "--file", str(tmp_path / "missing.log")]) == 2

    done = subprocess.run([str(REPO / ".venv/bin/raysleuth"), "explain", "-"], input="nothing to see",
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "no known cause" in done.stdout
    done = subprocess.run([str(REPO / ".venv/bin/raysleuth"), "explain", "--json", "-"],
                          input=next(item["text"] for item in TEXTS if item["id"] == "gcs-connection-failed"),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and json.loads(done.stdout)["matches"][0]["id"] == "gcs-connection-failed"


# ---------------------------------------------------------------- advise


def test_advise_every_problem_has_ordered_steps():
    for problem in PROBLEMS:
        advice = advise(problem)
        assert advice.steps and [step.order for step in advice.steps] == list(range(1, len(advice.steps) + 1))
        assert all(step.why and step.run and step.kind in {"cli", "code", "env"} for step in advice.steps)


def test_advise_filters_by_nodes_and_reproducibility():
    single = [step.run for step in advise("hang", nodes=1, reproducible=True).steps]
    multi = [step.run for step in advise("hang", nodes=8, reproducible=False).steps]
    assert single[0] == "raysleuth doctor" and "raysleuth stacks" in single
    assert "raysleuth timeline" not in single and "raysleuth timeline" in multi
    assert any("breakpoint_on_rank" in run for run in single) and not any("breakpoint_on_rank" in run for run in multi)
    assert any("heartbeat" in run for run in multi)
    crash = [step.run for step in advise("crash", reproducible=True).steps]
    assert crash[0] == "raysleuth crashes" and "RAYSLEUTH_POST_MORTEM=1" in crash
    with pytest.raises(UsageError):
        advise("sadness")
    with pytest.raises(UsageError):
        advise("hang", nodes=0)


def test_advise_cli(capsys):
    from raysleuth.cli import main

    assert main(["advise", "--problem", "memory", "--nodes", "2", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["problem"] == "memory" and payload["steps"][0]["run"] == "raysleuth crashes"
    assert main(["advise", "--problem", "divergence", "--not-reproducible"]) == 0
    out = capsys.readouterr().out
    assert "check_data_consistency(dataset_path=PATH, sample_indices=[0, 100, 1000])" in out
    assert main(["advise", "--problem", "bogus"]) == 2


# ------------------------------------------------------------ live cluster


def test_get_timeout_from_a_live_cluster(ray_cluster):
    import ray

    @ray.remote(num_cpus=0.01)
    def slow():
        time.sleep(20)

    ref = slow.remote()
    try:
        with pytest.raises(ray.exceptions.GetTimeoutError) as caught:
            ray.get(ref, timeout=0.5)
    finally:
        ray.cancel(ref, force=True)
    text = f"{type(caught.value).__module__}.{type(caught.value).__name__}: {caught.value}"
    assert explain(text)[0].id == "get-timeout"


def test_the_ray_task_error_wrapper_names_its_inner_exception():
    """The demo's crash once said only 'A Ray task raised an exception (RayTaskError wrapper)' (issue 29)."""
    from raysleuth.explain import innermost_exception

    text = ("ray.exceptions.RayTaskError(ValueError): ray::RolloutWorker.update() (pid=4242, ip=10.0.0.2)\n"
            "  File \"job.py\", line 12, in update\n    raise ValueError('corrupt batch at step 2')\n"
            "ValueError: corrupt batch at step 2")
    matches = explain(text)
    assert matches[0].id == "ray-task-error"
    assert "the inner exception is ValueError: corrupt batch at step 2" in matches[0].cause
    assert innermost_exception("RayTaskError(KeyError): x\nKeyError: 'weight'") == "KeyError: 'weight'"
    assert innermost_exception("all good") is None
