"""The redaction corpus: secret shapes that must never reach evidence, look-alikes that must stay.

Runs without Ray. Every case goes through the public entry points the
writers of evidence use: ``redact_text`` (messages, tracebacks, source
lines), ``redacted_repr`` (arguments, locals), ``redact_value`` (structures)
and ``redact_record`` (every record the recorder stores). The same corpus
is written as records of every kind through the real recorder and store in
``tests/test_redact_records.py``.
"""

from __future__ import annotations

import importlib
import json

import pytest

from raysleuth.redaction import (
    REDACTED,
    redact,
    redact_record,
    redact_text,
    redact_value,
    redacted_repr,
    relevant_environment,
)

HEX40 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b"
HEX32 = "5d41402abc4b2a76b9719d911017c592"
B64 = "dXNlcm5hbWU6c3VwZXJzZWNyZXRwYXNzd29yZA=="  # base64("username:supersecretpassword")
OPENAI = "sk-proj-" + "Ab3dEf6hIj9kLm2nOp5qRs8t"
HF = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz012345"
GHP = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
AWS_ID = "AKIA" + "IOSFODNN7EXAMPLE"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
GCP = "AIza" + "SyA1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q"
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dBjftJeZ4CVPmB92K27uhbUJU1p1r_wW1gFWFOEjXk"
PW = "Tr0ub4dor&3"
JWT_NONE = "eyJhbGciOiJub25lIn0.eyJzdWIiOiIxIn0."
SLACK_HOOK = "https://hooks.slack.com/services/T0ABCDEF1/B0ABCDEF2/" + "slackhooksecretXyZ0123"
JOB_CONFIG = json.dumps({"runtime_env": {"env_vars": {"DB_PASS": "jobcfgsecret1", "RANK": "0"}},
                         "serialized_runtime_env": json.dumps({"env_vars": {"WANDB_API_KEY": "jobcfgsecret2",
                                                                            "NOTE": JWT}})})
DEEP = {"a": {"b": {"c": {"d": {"e": {"f": {"g": {"api_key": "deepsecret8"}}}}}}}}
BIG_BYTES = b"x" * 5000 + b" password=bigbytessecret"

# (entry point, input, the secret text that must be gone)
SECRETS: list[tuple[str, object, str]] = [
    # Authorization headers
    ("text", f"Authorization: Basic {B64}", B64),
    ("text", f"Authorization: Bearer {HEX40}", HEX40),
    ("text", "Authorization: Bearer abc.def-ghi_jkl", "abc.def-ghi_jkl"),
    ("text", f"headers={{'Authorization': 'Bearer {HEX32}'}}", HEX32),
    ("text", f"Proxy-Authorization: Basic {B64}", B64),
    ("text", "curl -H 'Authorization: Token 0123abcd0123abcd' http://x", "0123abcd0123abcd"),
    ("text", "sent Bearer Zm9vYmFyYmF6cXV4 to the server", "Zm9vYmFyYmF6cXV4"),
    ("text", f"authorization={PW}", PW),
    # URL credentials
    ("text", "postgresql://user:hunter2pass@db.example.com:5432/x", "hunter2pass"),
    ("text", "connecting to mysql://root:S3cr3t!@10.0.0.5/db failed", "S3cr3t!"),
    ("text", "redis://:redispass123@localhost:6379/0", "redispass123"),
    ("text", f"git clone https://{GHP}@github.com/o/r.git", GHP),
    ("text", "https://oauth2:glpat-ABCDEFGHIJKLMNOPQRST@gitlab.com/x.git", "glpat-ABCDEFGHIJKLMNOPQRST"),
    ("text", "amqp://guest:guestpassword@rabbit:5672//", "guestpassword"),
    ("text", f"https://{HEX32}@o123.ingest.sentry.io/42", HEX32),
    ("text", "mongodb+srv://admin:m0ng0pw@cluster0.example.net/test", "m0ng0pw"),
    # argv flags
    ("text", f"python train.py --hf-token {HF[3:]} --lr 1e-4", HF[3:]),
    ("text", "python train.py --api-key=abc123def456 --epochs 3", "abc123def456"),
    ("text", f"--password {PW}", PW),
    ("text", "--wandb-api-key=0123456789abcdef", "0123456789abcdef"),
    ("text", "--secret 'two words'", "two words"),
    ("text", "--access-token=opaque-value-1", "opaque-value-1"),
    ("repr", ("argv", ["train.py", "--hf-token", "plainvalue", "--lr", "3"]), "plainvalue"),
    ("repr", ("argv", ["--api-key=plainvalue2"]), "plainvalue2"),
    ("repr", ("cmd", ("--password", "pw-in-tuple")), "pw-in-tuple"),
    ("repr", ("args", ["-p", "1", "--db-password", "dbpw"]), "dbpw"),
    # (name, value) pairs
    ("repr", ("pair", ("api_key", "pairsecret1")), "pairsecret1"),
    ("repr", ("headers", [("Authorization", "Basic Zm9vOmJhcg=="), ("Accept", "json")]), "Zm9vOmJhcg=="),
    ("repr", ("env", [("HF_TOKEN", "pairsecret2"), ("RANK", "0")]), "pairsecret2"),
    ("text", "[('password', 'pairsecret3'), ('user', 'bob')]", "pairsecret3"),
    ("text", "('client_secret', 'pairsecret4')", "pairsecret4"),
    # long hex tokens inside text
    ("text", f"using key {HEX40} for upload", HEX40),
    ("text", f"server said {HEX32}", HEX32),
    ("text", f"retrying with {HEX40.upper()[:34]}9a", HEX40.upper()[:34] + "9a"),
    ("text", f"X-Api-Key={HEX32}", HEX32),
    # nested dicts / lists
    ("repr", ("config", {"api_key": "nestedsecret1", "lr": 0.1}), "nestedsecret1"),
    ("repr", ("config", {"wandb": {"key": "x", "api_key": "nestedsecret2"}}), "nestedsecret2"),
    ("repr", ("cfg", {"db": [{"password": "nestedsecret3"}]}), "nestedsecret3"),
    ("repr", ("headers", {"Authorization": f"Bearer {HEX32}"}), HEX32),
    ("repr", ("opts", {"clientSecret": "nestedsecret4"}), "nestedsecret4"),
    ("repr", ("opts", {"accessToken": "nestedsecret5"}), "nestedsecret5"),
    ("repr", ("items", [1, 2, {"private_key": "nestedsecret6"}]), "nestedsecret6"),
    ("repr", ("blob", {"url": "postgres://u:nestedpw7@h/db"}), "nestedpw7"),
    ("repr", ("cookies", {"session": "abc"}), "abc"),
    # env-style KEY=VALUE
    ("text", "HF_TOKEN=envsecret1 python x.py", "envsecret1"),
    ("text", "export OPENAI_API_KEY=envsecret2", "envsecret2"),
    ("text", f"AWS_SECRET_ACCESS_KEY={AWS_SECRET}", AWS_SECRET),
    ("text", "DB_PASSWORD='env secret 3'", "env secret 3"),
    ("text", "GITHUB_TOKEN: envsecret4", "envsecret4"),
    ("text", "RAY_AUTH_TOKEN=envsecret5", "envsecret5"),
    ("env", {"HF_TOKEN": "envsecret6", "RANK": "0"}, "envsecret6"),
    ("env", {"NCCL_SOCKET_IFNAME": "eth0", "RAY_REDIS_PASSWORD": "envsecret7"}, "envsecret7"),
    # token shapes anywhere
    ("text", f"OpenAI rejected {OPENAI}", OPENAI),
    ("text", "anthropic sk-ant-api03-AbCdEfGhIjKlMnOpQrStUv", "sk-ant-api03-AbCdEfGhIjKlMnOpQrStUv"),
    ("text", f"hub login {HF}", HF),
    ("text", f"push with {GHP}", GHP),
    ("text", "pat github_pat_11ABCDEFG0123456789_abcdefghijklmnop", "github_pat_11ABCDEFG0123456789_abcdefghijklmnop"),
    ("text", f"aws id {AWS_ID}", AWS_ID),
    ("text", "ASIA" + "Y34FZKBOKMUTVV7A in use", "ASIA" + "Y34FZKBOKMUTVV7A"),
    ("text", f"maps key {GCP}", GCP),
    ("text", "gcloud token ya29.a0AfH6SMBx1234567890abcdefGHIJ", "ya29.a0AfH6SMBx1234567890abcdefGHIJ"),
    ("text", f"jwt {JWT}", JWT),
    ("text", "slack xoxb-1234567890-abcdefghij", "xoxb-1234567890-abcdefghij"),
    ("text", "stripe sk_live_4eC39HqLyjWDarjtT1zdp7dc", "sk_live_4eC39HqLyjWDarjtT1zdp7dc"),
    ("text", "npm_" + "abcdefghijklmnopqrstuvwxyz0123456789", "npm_" + "abcdefghijklmnopqrstuvwxyz0123456789"),
    ("text", "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA\n-----END RSA PRIVATE KEY-----", "MIIEowIBAAKCAQEA"),
    # whole values by name or shape
    ("repr", ("hf_token", "whatever"), "whatever"),
    ("repr", ("password", 1234), "1234"),
    ("repr", ("note", HEX40), HEX40),
    ("repr", ("x", "Zk9vQmFyQmF6UXV4MTIzNDU2Nzg5MGFiY2RlZg"), "Zk9vQmFyQmF6UXV4MTIzNDU2Nzg5MGFiY2RlZg"),
    ("repr", ("apiKey", "camel"), "camel"),
    ("repr", ("passphrase", "pp"), "pp"),
    ("text", "Config(api_key='objsecret', lr=0.1)", "objsecret"),
    ("text", "{\"password\": \"jsonsecret\"}", "jsonsecret"),
    ("repr", ("b", b"Authorization: Bearer bytessecret99"), "bytessecret99"),
    # issue 24: names, shapes and places the redactor missed
    ("repr", ("DB_PASS", "dbpasssecret1"), "dbpasssecret1"),
    ("text", "DB_PASS=dbpasssecret2 REDIS_PASS=dbpasssecret3", "dbpasssecret2"),
    ("repr", ("AZURE_STORAGE_CONNECTION_STRING", "Endpoint=sb://x/;SharedAccessSignature=connsecret1"),
     "connsecret1"),
    ("text", "MONGO_CONNECTION_STRING=mongodb://h/db?x=connsecret2", "connsecret2"),
    ("repr", ("SLACK_WEBHOOK_URL", "https://example.org/hook/whsecret1"), "whsecret1"),
    ("text", "posting to " + SLACK_HOOK, SLACK_HOOK.rsplit("/", 1)[1]),
    ("text", "https://discord.com/api/webhooks/123456789/discordhooksecret_AbC", "discordhooksecret_AbC"),
    ("repr", ("DATABASE_URL", "postgres://db.internal/prod?sslmode=require&sec=dburlsecret1"), "dburlsecret1"),
    ("repr", ("SQLALCHEMY_DATABASE_URI", "sqlite:////srv/dburlsecret2.db"), "dburlsecret2"),
    ("text", "GET /?auth=Bearer%20" + JWT, JWT),
    ("text", "unsigned " + JWT_NONE, JWT_NONE),
    ("env", {"RAY_JOB_CONFIG_JSON_ENV_VAR": JOB_CONFIG}, "jobcfgsecret1"),
    ("env", {"RAY_JOB_CONFIG_JSON_ENV_VAR": JOB_CONFIG}, "jobcfgsecret2"),
    ("env", {"RAY_JOB_CONFIG_JSON_ENV_VAR": JOB_CONFIG}, JWT),
    ("text", JOB_CONFIG, "jobcfgsecret2"),
    ("record", ("deep", DEEP), "deepsecret8"),
    ("record", ("deep_list", [[[[[[[["--password", "deepsecret9"]]]]]]]]), "deepsecret9"),
    ("record", ("big", BIG_BYTES), "bigbytessecret"),
    ("repr", ("big", BIG_BYTES), "bigbytessecret"),
    ("text", "ray::Trainer.train --hf-token titlesecret1 --lr 3", "titlesecret1"),
    ("text", "pid 4242 4.1GB (python train.py --api-key=memmonsecret1)", "memmonsecret1"),
]

# Look-alikes: (entry point, input) that must come back unchanged.
TENSOR = "tensor([[0.1234, -1.5000],\n        [2.0000, 3.1416]], dtype=torch.bfloat16)"
LOOKALIKES: list[tuple[str, object]] = [
    ("text", TENSOR),
    ("text", "array([1., 2., 3.], dtype=float32)"),
    ("text", "Tensor(shape=(4, 1024), dtype=torch.float32, device=cpu)"),
    ("text", "/home/user/.cache/huggingface/hub/models--gpt2/snapshots/" + HEX40 + "/config.json"),
    ("text", "/tmp/ray/session_2026-11-30_11-40-00_123456_789/logs/worker-" + HEX40 + HEX32[:16] + "-01000000-4242.out"),
    ("text", "commit " + HEX40),
    ("text", "HEAD is now at " + HEX40[:7] + " fix the loader"),
    ("text", "sha256: " + HEX40 + HEX32[:24]),
    ("text", "git+https://github.com/org/repo.git@" + HEX40),
    ("text", "ObjectRef(" + HEX40 + HEX32[:16] + ")"),
    ("text", "ActorID(" + HEX32 + ")"),
    ("text", "TaskID(" + HEX40 + "01000000)"),
    ("text", "actor_id=" + HEX32),
    ("text", "node_id: " + HEX40 + HEX32[:16]),
    ("text", "run_id=" + HEX32),
    ("text", "job 01000000 task id " + HEX40 + "01000000"),
    ("text", "550e8400-e29b-41d4-a716-446655440000"),
    ("text", "run 2f1c6a3e-9c7b-4d9e-8f00-1b2c3d4e5f60 finished"),
    ("text", "loss=0.3412 step=1200 lr=3e-4 grad_norm=1.25"),
    ("text", "pad_token=<pad> eos_token=</s> max_tokens=512"),
    ("text", "num_key_value_heads=8 key_states.shape=(2, 8, 128)"),
    ("text", "sort_key=len cache_key=abc"),
    ("text", "RAY_AUTH_MODE=token"),
    ("text", "Traceback (most recent call last):\n  File \"/app/train.py\", line 10, in step\n    loss.backward()"),
    ("text", "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"),
    ("text", "https://huggingface.co/meta-llama/Llama-3-8B/resolve/main/config.json"),
    ("text", "http://127.0.0.1:8265/api/jobs/raysubmit_AbCdEf1234567890"),
    ("text", "digest xxh3:" + HEX32[:16] + " blake2b:" + HEX32),
    ("text", "fingerprint " + HEX32),
    ("text", "the tokenizer has 32000 tokens"),
    ("text", "author: Jane Doe"),
    ("text", "checkpoint-step-1200/model_00001-of-00004.safetensors"),
    ("text", "my_very_long_python_module_name_for_the_tests"),
    ("repr", ("commit", HEX40)),
    ("repr", ("actor_id", HEX32)),
    ("repr", ("key", "layers.0.attn.q_proj.weight")),
    ("repr", ("tokens", [1, 2, 3])),
    ("repr", ("path", "/data/shards/part-00001.parquet")),
    ("repr", ("config", {"lr": 0.1, "batch_size": 32, "pad_token_id": 0})),
    ("repr", ("PWD", "/home/user/project")),
    ("repr", ("forward_pass", "fused")),
    ("repr", ("dead_actor", HEX32)),
    ("repr", ("owner", HEX40 + HEX32[:16])),
    ("record", ("actor_ids", [HEX32, HEX32[::-1]])),
    ("record", ("config", json.dumps({"lr": 0.1, "layers": [1, 2]}))),
]


def _apply(kind: str, value: object) -> str:
    if kind == "text":
        return redact_text(value)
    if kind == "repr":
        name, inner = value
        return redacted_repr(name, inner, 2000)
    if kind == "env":
        return repr(relevant_environment(value))
    if kind == "record":  # what the recorder stores: redact_record, then JSON
        name, inner = value
        return json.dumps(redact_record({name: inner}))
    raise AssertionError(kind)


def test_corpus_sizes():
    assert len(SECRETS) >= 95 and len(LOOKALIKES) >= 45


@pytest.mark.parametrize(("kind", "value", "secret"), SECRETS, ids=[f"s{i}" for i in range(len(SECRETS))])
def test_secret_is_redacted(kind, value, secret):
    out = _apply(kind, value)
    assert secret not in out, out
    assert REDACTED in out, out


@pytest.mark.parametrize(("kind", "value"), LOOKALIKES, ids=[f"l{i}" for i in range(len(LOOKALIKES))])
def test_lookalike_is_kept(kind, value):
    out = _apply(kind, value)
    if kind == "text":
        assert out == value
    else:
        assert REDACTED not in out, out


def test_structure_keeps_shape_and_non_secrets():
    config = {"api_key": "s", "lr": 0.1, "nested": {"password": "p", "layers": [1, 2]}}
    out = redact_value(config)
    assert out == {"api_key": REDACTED, "lr": 0.1, "nested": {"password": REDACTED, "layers": [1, 2]}}
    assert config["api_key"] == "s"  # the caller's object is not touched
    assert redact("x", ["--hf-token", "t", "--lr", "1"]) == ["--hf-token", REDACTED, "--lr", "1"]


# ------------------------------------------------------------------ the writers of evidence use it

SECRET_CONFIG = {"api_key": "cfgsecret1", "nested": {"Authorization": "Bearer cfgsecret2xyz"}}


def _train(config, argv, headers, token_pair, lr=0.1):
    return lr


def test_debug_decorator_arguments_are_redacted_inside_structures():
    from raysleuth.logs import capture_arguments

    args = capture_arguments(_train, (SECRET_CONFIG, ["--password", "argvsecret3"],
                                      {"Authorization": "Basic YWxhZGRpbjpvcGVuc2VzYW1l"},
                                      ("hf_token", "pairsecret4")), {"lr": 0.5}, limit=400)
    text = repr(args)
    for secret in ("cfgsecret1", "cfgsecret2xyz", "argvsecret3", "YWxhZGRpbjpvcGVuc2VzYW1l", "pairsecret4"):
        assert secret not in text, text
    assert args["lr"] == "0.5"


def test_shipped_log_messages_are_redacted():
    import logging

    from raysleuth.logs.loggers import record_data

    record = logging.LogRecord("x", logging.INFO, __file__, 1, "connect %s with Authorization: Bearer %s",
                               ("postgresql://u:logpw1@db/x", "logsecret2abc"), None)
    record.api_key = "logsecret3"
    data = record_data(record)
    text = repr(data)
    for secret in ("logpw1", "logsecret2abc", "logsecret3"):
        assert secret not in text, text
    assert "connect postgresql://u:<redacted>@db/x" in data["message"]


def test_failed_task_error_texts_are_redacted():
    from raysleuth.cluster import RayTask
    from raysleuth.tasks.find import _failed

    task = {"state": "FAILED", "task_id": "t1", "name": "f", "error_type": "TASK_EXECUTION_EXCEPTION",
            "error_message": "ValueError: bad login for https://bob:taskpw9@host/ with --api-key=tasksecret8"}
    failed = _failed([RayTask.from_state(task)], {}, lambda *a: None, explain=False)
    assert "taskpw9" not in failed[0].error_message and "tasksecret8" not in failed[0].error_message


def test_memory_capsule_source_lines_are_redacted():
    import sys

    from raysleuth.memory.triggers import _frames

    hf_token = "hf_" + "MemorySecretTokenValue0123456789"; frames = _frames(sys._getframe())  # noqa: E702
    text = repr(frames)
    assert hf_token not in text and "<redacted>" in text and hf_token


def test_crash_capsule_redacts_argv_pairs_and_urls():
    from raysleuth.postmortem import build_capsule

    def job():
        argv = ["train.py", "--hf-token", "capsecret1"]  # noqa: F841
        pair = ("password", "capsecret2")  # noqa: F841
        raise RuntimeError("cannot reach postgresql://user:capsecret3@db:5432/x, Authorization: Basic capsecret4==")

    try:
        job()
    except RuntimeError as error:
        capsule = build_capsule(error)
    text = repr(capsule.to_dict())
    for secret in ("capsecret1", "capsecret2", "capsecret3", "capsecret4"):
        assert secret not in text, secret
