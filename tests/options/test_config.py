"""One validated config (SPEC §8)."""

from __future__ import annotations

import re

import pytest

from vtrm_gate._env import mask_url
from vtrm_gate.errors import ConfigError
from vtrm_gate.options import RunOptions, options_from_mapping, resolve_options
from vtrm_gate.stats import GateParams


def test_defaults():
    c = resolve_options(env={}, dotenv=None)
    assert c == RunOptions()
    assert (c.slots, c.redis_cache_ttl, c.cache_prefix, c.gate.e_confirm) == (
        32, 604800, "llm_cache", 20.0)


def test_file_then_dotenv_then_environment(tmp_path):
    f = tmp_path / "gate.toml"
    f.write_text('concurrency = 16\nredis_cache_ttl = 100\n[gate]\ne_confirm = 40.0\n'
                 '[guard]\nmax_ratio = 0.2\n')
    env = tmp_path / ".env"
    env.write_text("# comment\nREDIS_CACHE_TTL=200\nREDIS_URL='redis://u:secret@h:6379/0'\n")
    c = resolve_options(config=f, env={"VTRM_CONCURRENCY": "8"}, dotenv=env)
    assert (c.concurrency, c.redis_cache_ttl, c.gate.e_confirm, c.guard.max_ratio) == (
        8, 200, 40.0, 0.2)
    assert c.redis_url == "redis://u:secret@h:6379/0"
    assert "secret" not in repr(c) and "secret" not in str(c.as_dict())


def test_json_file(tmp_path):
    f = tmp_path / "gate.json"
    f.write_text('{"gate": {"n_max": 30}, "cache_enabled": "off"}')
    c = resolve_options(config=f, env={}, dotenv=None)
    assert c.gate.n_max == 30 and c.cache_enabled is False


def test_a_key_twice_is_refused_in_json_as_toml_refuses_it(tmp_path):
    """``{"gate": {"n_max": 40, "n_max": 10}}`` read as 10 (Python's json keeps the last);
    TOML refuses the same file, and so does JSON now, naming the key and its line."""
    f = tmp_path / "gate.json"
    f.write_text('{"gate": {"n_max": 40,\n          "n_max": 10}}')
    with pytest.raises(ConfigError, match=r"malformed.*duplicate key 'n_max'.*line 2"):
        resolve_options(config=f, env={}, dotenv=None)
    f.write_text('{"gate": {},\n "größe": 1,\n "größe": 2}', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"duplicate key 'größe'.*line 3"):
        resolve_options(config=f, env={}, dotenv=None)  # found as written, not as \u00f6
    t = tmp_path / "gate.toml"
    t.write_text("[gate]\nn_max = 40\nn_max = 10\n")
    with pytest.raises(ConfigError, match="malformed"):
        resolve_options(config=t, env={}, dotenv=None)


def test_gate_block_is_refused_saying_why(tmp_path):
    f = tmp_path / "gate.toml"
    f.write_text("gate_block = 8\n")
    with pytest.raises(ConfigError, match=r"gate_block was removed.*ladder prefix"):
        resolve_options(config=f, env={}, dotenv=None)
    f.write_text("[gate]\ngate_block = 8\n")
    with pytest.raises(ConfigError, match="gate_block was removed"):
        resolve_options(config=f, env={}, dotenv=None)


def test_unknown_keys_are_refused_naming_the_file_and_the_valid_ones(tmp_path):
    """The key is named with its file, as a bad value's is ("file gate.toml: ...")."""
    f = tmp_path / "gate.toml"
    f.write_text("concurency = 8\n")
    with pytest.raises(ConfigError, match=rf"^file {re.escape(str(f))}: unknown config key "
                                          r"'concurency'.*valid keys: adaptive, cache, "
                                          r"cache_enabled, cache_prefix, cache_share, "
                                          r"cancel_after_freeze, concurrency, deadline, "
                                          r"decision_rule, dispatch"):
        resolve_options(config=f, env={}, dotenv=None)
    f.write_text("[gate]\ne_confrim = 3\n")
    with pytest.raises(ConfigError, match=rf"^file {re.escape(str(f))}: .*gate\.e_confrim.*"
                                          r"e_confirm"):
        resolve_options(config=f, env={}, dotenv=None)


@pytest.mark.parametrize(("var", "meant"), [
    ("VTRM_CONCURENCY", "VTRM_CONCURRENCY"), ("VTRM_DISPATH", "VTRM_DISPATCH"),
    ("VTRM_MAX_TOKEN_ANSWER", "VTRM_MAX_TOKENS_ANSWER"), ("REDIS_CACHE_TL", "REDIS_CACHE_TTL")])
def test_a_misspelt_setting_in_dotenv_or_the_environment_is_refused_naming_it(
        tmp_path, var, meant):
    """A config file's misspelt key is refused; the same slip in .env or the environment
    was ignored without a word, and the run went on at the default (32 slots, say)."""
    dotenv = tmp_path / ".env"
    dotenv.write_text(f"{var}=8\n")
    with pytest.raises(ConfigError, match=rf"{var} \(\.env\) is no setting; did you mean "
                                          rf"{meant}\?"):
        resolve_options(env={}, dotenv=dotenv)
    with pytest.raises(ConfigError, match=rf"^{var} is no setting; did you mean {meant}\?"):
        resolve_options(env={var: "8"}, dotenv=None)


@pytest.mark.parametrize(("key", "flag"), [("time_scale", "--time-scale"),
                                           ("backend", "--backend")])
def test_a_flag_only_setting_in_a_file_or_the_environment_is_refused_naming_its_flag(
        tmp_path, key, flag):
    """``VTRM_TIME_SCALE=0`` was ignored without a word (the step ran on the virtual clock);
    in a config file it was "unknown config key". Each now names the flag that sets it."""
    var = f"VTRM_{key.upper()}"
    with pytest.raises(ConfigError, match=rf"^{var}: {key} is set by its flag only \({flag}\), "
                                          rf"not the environment or a config file$"):
        resolve_options(env={var: "0"}, dotenv=None)
    dotenv = tmp_path / ".env"
    dotenv.write_text(f"{var}=0\n")
    with pytest.raises(ConfigError, match=rf"^{var} \(\.env\): {key} is set by its flag only"):
        resolve_options(env={}, dotenv=dotenv)
    f = tmp_path / "c.toml"
    f.write_text(f"{key} = 0\n")
    # the key named once (h11: "time_scale: time_scale is set by its flag only"), with its file
    with pytest.raises(ConfigError, match=rf"^file {re.escape(str(f))}: {key}: set by its flag "
                                          rf"only \({flag}\), not the"):
        resolve_options(config=f, env={}, dotenv=None)


def test_other_variables_are_left_alone():
    env = {"VTRM_API_KEY": "k", "VTRM_WORKSPACE": "ws", "VTRM_MODEL": "m", "VTRM_CI": "1",
           "VTRM_FIGURES": "f", "VTRM_BASE_URL": "http://h/v1", "VTRM_DEBUG": "1",
           "VTRM_MAX_TURNS": "6", "VTRM_RECORD_REPLIES": "1", "REDIS_PASSWORD": "x",
           "CONCURRENCY": "8"}
    assert resolve_options(env=env, dotenv=None) == RunOptions()


@pytest.mark.parametrize("env,fragment", [
    ({"VTRM_CONCURRENCY": "0"}, "concurrency"),
    ({"VTRM_CONCURRENCY": "many"}, "concurrency must be an integer"),
    ({"REDIS_CACHE_TTL": "-5"}, "redis_cache_ttl"),
    ({"REDIS_URL": "http://x"}, "redis_url"),
    ({"VTRM_CACHE": "maybe"}, "on/off"),
    ({"VTRM_CACHE_PREFIX": "llm*"}, "cache_prefix"),
])
def test_bad_values_name_the_setting(env, fragment):
    with pytest.raises(ConfigError, match=fragment):
        resolve_options(env=env, dotenv=None)


def test_bad_gate_param_in_file(tmp_path):
    f = tmp_path / "gate.toml"
    f.write_text("[gate]\nlambda_dir = 2.0\n")
    with pytest.raises(ConfigError, match="lambda_dir"):
        resolve_options(config=f, env={}, dotenv=None)


def test_malformed_and_missing_files(tmp_path):
    f = tmp_path / "gate.toml"
    f.write_text("concurrency = = 3\n")
    with pytest.raises(ConfigError, match="malformed"):
        resolve_options(config=f, env={}, dotenv=None)
    with pytest.raises(ConfigError, match="cannot read config file"):
        resolve_options(config=tmp_path / "nope.toml", env={}, dotenv=None)


def test_mask_url():
    assert mask_url("redis://:pw@host:6379/1") == "redis://:***@host:6379/1"
    assert mask_url("unix:///tmp/r.sock") == "unix:///tmp/r.sock"
    assert mask_url(None) == "<embedded>"  # no REDIS_URL: the embedded server
    assert RunOptions().as_dict()["redis_url"] is None


@pytest.mark.parametrize("field", ["max_tokens_think", "max_tokens_answer",
                                   "max_tokens_evolve"])
def test_a_zero_reply_budget_from_python_is_refused_none_sends_none(field):
    # Issue 27 #12: 0 tokens is no budget a server can honour; None says "none sent"
    with pytest.raises(ValueError, match=rf"{field} must be an integer from 1 .* or None"):
        RunOptions(**{field: 0})
    step = field.removeprefix("max_tokens_")
    assert RunOptions(**{field: None}).max_tokens()[step] == 0  # 0: none sent, as before


def test_a_zero_budget_on_the_command_line_or_in_a_file_still_means_none_sent(tmp_path):
    opts = resolve_options({"max_tokens_answer": 0}, env={}, dotenv=None)
    assert opts.max_tokens_answer is None and opts.max_tokens()["answer"] == 0
    (tmp_path / "c.toml").write_text("max_tokens_think = 0\n")
    opts = resolve_options(config=tmp_path / "c.toml", env={"VTRM_MAX_TOKENS_EVOLVE": "0"},
                           dotenv=None)
    assert opts.max_tokens() == {"think": 0, "answer": 64, "evolve": 0}


@pytest.mark.parametrize(("gate", "fragment"), [
    ({"w_net_min": 41}, r"w_net_min = 41,.* n_max = 40 .*raise n_max to at least 41"),
    ({"e_confirm": 1e8}, r"e_confirm = 1e\+08"),
    ({"n_max": 7}, r"n_max = 7 .*raise n_max to at least 8"),  # 1.5**7 = 17.1 < 20
])
def test_parameters_under_which_no_candidate_can_be_accepted_are_refused(gate, fragment):
    """A mistake that would gate every candidate out of a whole training run is refused
    when the options are built, naming the parameters (hostile pass: w_net_min = 41 ran a
    step that could accept nothing)."""
    with pytest.raises(ConfigError, match=f"no candidate can ever be accepted.*{fragment}"):
        options_from_mapping({"gate": gate})
    with pytest.raises(ConfigError, match="no candidate can ever be accepted"):
        RunOptions(gate=GateParams(**gate))
    # the same reach under another rule is that rule's: the check follows decision_rule
    assert options_from_mapping({"gate": {"n_max": 8}}).gate.n_max == 8


@pytest.mark.parametrize("line", ["VTRM_CONCURRENCY: 8", "set VTRM_CONCURRENCY=8",
                                  "VTRM_CONCURRENCY 8", "REDIS_URL redis://h:6379/0"])
def test_a_dotenv_line_naming_our_setting_that_is_no_assignment_is_refused(tmp_path, line):
    """A YAML-style or Windows ``set`` line was skipped without a word: the setting it
    meant to make was not made."""
    dotenv = tmp_path / ".env"
    dotenv.write_text(f"# ours\nOTHER_TOOL=1\n{line}\n")
    with pytest.raises(ConfigError, match=rf"\.env: line 3: {re.escape(repr(line))} is no "
                                          rf"KEY=VALUE line"):
        resolve_options(env={}, dotenv=dotenv)


def test_other_tools_odd_lines_are_left_to_them(tmp_path):
    dotenv = tmp_path / ".env"
    dotenv.write_text("OTHER: 1\nset OTHER=2\n[section]\nVTRM_CONCURRENCY=8\n")
    assert resolve_options(env={}, dotenv=dotenv).concurrency == 8


def test_cache_off_in_a_file_is_pointed_to_cache_enabled(tmp_path):
    """``cache = "off"`` (as ``VTRM_CACHE=off`` reads) said "cache must be a table of share"."""
    f = tmp_path / "gate.toml"
    f.write_text('cache = "off"\n')
    with pytest.raises(ConfigError, match=r"cache must be a table of share, got 'off' \(the "
                                          r"cache is turned off by cache_enabled = false"):
        resolve_options(config=f, env={}, dotenv=None)
    f.write_text("cache_enabled = false\n")
    assert resolve_options(config=f, env={}, dotenv=None).cache_enabled is False


@pytest.mark.parametrize(("line", "value"), [
    ('VTRM_CACHE_PREFIX="team_cache" # shared', "team_cache"),
    ("VTRM_CACHE_PREFIX='team_cache'   # shared", "team_cache"),
    ('VTRM_CACHE_PREFIX="team # one"', "team # one"),
    ('OPENAI_API_KEY="sk-abc123456789" # team key', "sk-abc123456789"),
    ("VTRM_CACHE_PREFIX=team_cache # shared", "team_cache"),
    ('VTRM_CACHE_PREFIX="team_cache"', "team_cache"),
])
def test_a_quoted_dotenv_value_loses_its_quotes_before_a_comment(tmp_path, line, value):
    """``KEY="value" # comment`` kept its quotes: the cache prefix was '"team_cache"' (never
    shared) and an API key went out as ``Bearer "sk-..."``, a 401 on every call."""
    from vtrm_gate._env import read_dotenv

    dotenv = tmp_path / ".env"
    dotenv.write_text(line + "\n")
    assert read_dotenv(dotenv) == {line.split("=", 1)[0]: value}
