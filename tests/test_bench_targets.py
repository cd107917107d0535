"""Every benchmark exits non-zero when it misses a target (a green ``make bench`` means every target met)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
BENCHES = sorted(BENCH.glob("bench_*.py"))


def test_there_are_benchmarks():
    assert len(BENCHES) >= 8, BENCHES


@pytest.mark.parametrize("path", BENCHES, ids=lambda p: p.name)
def test_each_benchmark_states_targets_and_exits_with_them(path):
    tree = ast.parse(path.read_text())
    calls = {node.func.id for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}
    assert {"target", "exit_code"} <= calls, f"{path.name}: targets must go through bench/_targets.py"
    main_guard = [node for node in tree.body if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)]
    assert main_guard and "main()" in ast.unparse(main_guard[0]) and (
        "SystemExit" in ast.unparse(main_guard[0]) or "sys.exit" in ast.unparse(main_guard[0])), path.name
    returns = [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and node.name == "main"]
    assert returns and "exit_code()" in ast.unparse(returns[0]), f"{path.name}: main() must return exit_code()"


@pytest.mark.parametrize(("script", "args"), [("bench_fingerprint.py", ["--size", "4M", "--repeat", "1"]),
                                              ("bench_breakpoint.py", [])])
def test_a_missed_target_exits_1(script, args):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "RAYSLEUTH_BENCH_FORCE_MISS": "1"}
    done = subprocess.run([sys.executable, str(BENCH / script), *args], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert "-> MISS" in done.stdout and "missed" in done.stdout
