"""Ray's State API field names are read in one place: ``raysleuth/cluster/records.py``.

Read from the source with ``ast``: a string constant naming a State API
field anywhere else in ``src/raysleuth`` fails, unless the allow-list
below says why it must stay. Features read the records' attributes, so a
Ray upgrade that renames a field touches one file.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "raysleuth"
RECORDS = "cluster/records.py"

#: Field names only Ray's State API (and ``ray.nodes()``) use; generic words (``state``, ``pid``, ``name``,
#: ``node_id``...) are also raysleuth's own evidence keys and are not checked.
RAY_FIELDS = frozenset({
    "func_or_class_name", "class_name", "death_cause", "required_resources", "serialized_runtime_env",
    "actor_died_error_context", "creation_task_failure_context", "actor_unschedulable_context",
    "runtime_env_failed_context", "oom_context", "formatted_exception_string", "owner_ip_address",
    "exit_type", "exit_detail", "worker_pid", "worker_type", "ray_namespace", "is_alive", "num_restarts",
    "start_time_ms", "end_time_ms", "creation_time_ms", "attempt_number", "profiling_data", "parent_task_id",
    "placement_group_id", "unit_resources", "scheduling_state", "creation_request_received_ns",
    "NodeID", "NodeManagerAddress", "NodeManagerHostname", "ObjectStoreSocketName",
})

#: (module path under src/raysleuth, field) that may stay, and why.
ALLOWED = {
    ("cluster/state.py", "is_alive"): "a State API filter names the field it filters on",
    ("integrations/verl.py", "worker_pid"): "raysleuth's own verl_call record data, not a State API row",
    ("stacks/clues.py", "worker_pid"): "reads raysleuth's verl_call records (integrations.verl writes them)",
    ("stacks/graph.py", "worker_pid"): "the recorded calls from stacks.clues (raysleuth's own data)",
    ("stall/__init__.py", "worker_pid"): "the unreturned calls from stacks.clues (raysleuth's own data)",
}


def _dunder_all_constants(tree: ast.AST) -> set[int]:
    """ids of the string constants listed in ``__all__`` (a function named like a field is no read)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            found.update(id(item) for item in ast.walk(node.value) if isinstance(item, ast.Constant))
    return found


def _field_reads() -> set[tuple[str, str]]:
    reads = set()
    for path in PACKAGE.rglob("*.py"):
        module = path.relative_to(PACKAGE).as_posix()
        if module == RECORDS:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        listed = _dunder_all_constants(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in RAY_FIELDS and id(node) not in listed:
                reads.add((module, node.value))
    return reads


def test_the_records_module_reads_the_fields():
    """The check looks where the fields are: the records module names them."""
    tree = ast.parse((PACKAGE / RECORDS).read_text(encoding="utf-8"))
    named = {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)}
    assert {"func_or_class_name", "class_name", "death_cause", "required_resources", "worker_pid"} <= named


def test_no_module_outside_the_records_reads_ray_state_fields():
    reads = _field_reads()
    new = sorted(reads - set(ALLOWED))
    stale = sorted(set(ALLOWED) - reads)
    assert not new, f"read these through raysleuth.cluster.records (attributes), not Ray's raw keys: {new}"
    assert not stale, f"these no longer read the field: delete them from ALLOWED: {stale}"
