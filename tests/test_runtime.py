"""Settings from the environment (with the seed aliases) and rank discovery."""

import os
from pathlib import Path

import pytest

from raysleuth import runtime
from raysleuth.runtime import Settings


def test_defaults():
    settings = Settings.from_env({})
    assert settings.debug is False
    assert settings.mode == "light"
    assert settings.debug_host == "127.0.0.1"
    assert settings.debugger == "debugpy"
    assert settings.sources == {}


def test_seed_aliases_and_which_won():
    settings = Settings.from_env({"VERL_DEBUG": "1", "RAY_DEBUG_POST_MORTEM": "true", "VERL_LOG_LEVEL": "debug",
                                  "VERL_MEMORY_PROFILE": "1", "VERL_DEBUG_LOG": "/tmp/x.log"})
    assert settings.debug and settings.post_mortem and settings.memory_profile
    assert settings.log_level == "DEBUG"
    assert settings.log_file == "/tmp/x.log"
    assert settings.sources["RAYSLEUTH_DEBUG"] == "VERL_DEBUG"
    assert settings.sources["RAYSLEUTH_POST_MORTEM"] == "RAY_DEBUG_POST_MORTEM"


def test_raysleuth_name_wins_over_alias():
    settings = Settings.from_env({"RAYSLEUTH_DEBUG": "0", "VERL_DEBUG": "1"})
    assert settings.debug is False
    assert settings.sources["RAYSLEUTH_DEBUG"] == "RAYSLEUTH_DEBUG"


def test_invalid_values_fall_back_with_a_warning():
    settings = Settings.from_env({"RAYSLEUTH_MODE": "loud", "RAYSLEUTH_DEBUG_WAIT": "soon", "RAYSLEUTH_HOME": "~/rs"})
    assert settings.mode == "light"
    assert settings.debug_wait == 600.0
    assert settings.home == Path("~/rs").expanduser()
    assert any("RAYSLEUTH_MODE" in w for w in settings.warnings)
    assert any("RAYSLEUTH_DEBUG_WAIT" in w for w in settings.warnings)


def test_full_mode_turns_memory_profile_on():
    assert Settings.from_env({"RAYSLEUTH_MODE": "full"}).memory_profile is True


@pytest.fixture
def clean_rank(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    saved = runtime._explicit_rank
    runtime._explicit_rank = None
    runtime._rank_cache = None
    runtime._identity = None
    yield monkeypatch
    runtime._explicit_rank = saved
    runtime._rank_cache = None
    runtime._identity = None


def test_rank_from_env_then_explicit(clean_rank):
    assert runtime.get_rank() is None
    clean_rank.setenv("RANK", "5")
    clean_rank.setenv("WORLD_SIZE", "8")
    runtime._rank_cache = None
    assert runtime.get_rank() == 5
    assert runtime.get_world_size() == 8
    assert runtime.whoami().rank_source == "env"
    runtime.set_rank(2, 4)
    assert runtime.get_rank() == 2
    assert runtime.whoami().rank_source == "set_rank"
    with pytest.raises(ValueError):
        runtime.set_rank(-1)


def test_identity_without_ray(clean_rank):
    me = runtime.whoami(refresh=True)
    assert me.pid == os.getpid()
    assert me.role in ("process", "driver")


def test_step_and_phase_context():
    token = runtime.set_step(7)
    assert runtime.current_step() == 7
    runtime._step.reset(token)
    phase = runtime.set_phase("rollout")
    assert runtime.current_phase() == "rollout"
    runtime._phase.reset(phase)
    assert runtime.current_phase() is None
