"""Hostile pass (h8): ``dispatch``, ``cancel_after_freeze`` and ``past_stop`` can be set where
a user looks for them (the config file/object, the environment and ``vtrm-gate step`` flags),
validated like other keys."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vtrm_gate.errors import ConfigError
from vtrm_gate.options import RunOptions, options_from_mapping, resolve_options

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str):
    return subprocess.run([sys.executable, "-m", "vtrm_gate", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=240, env=dict(os.environ))


def test_config_defaults_and_keys():
    cfg = RunOptions()
    assert (cfg.dispatch, cfg.cancel_after_freeze, cfg.past_stop) == ("expected_need", True,
                                                                       "cancel")
    cfg = options_from_mapping({"dispatch": "need_aware", "cancel_after_freeze": "on"})
    assert (cfg.dispatch, cfg.cancel_after_freeze) == ("need_aware", True)
    assert cfg.as_dict()["dispatch"] == "need_aware"
    assert cfg.as_dict()["cancel_after_freeze"] is True


@pytest.mark.parametrize("data, fragment", [
    ({"dispatch": "fastest"}, "dispatch must be one of"),
    ({"dispatch": 3}, "dispatch must be one of"),
    ({"cancel_after_freeze": "maybe"}, "cancel_after_freeze must be on/off"),
    ({"past_stop": "later"}, "past_stop must be one of cancel, wait"),
])
def test_bad_dispatch_values_are_refused(data, fragment):
    with pytest.raises(ConfigError, match=fragment):
        options_from_mapping(data)


def test_env_sets_dispatch(tmp_path):
    cfg = resolve_options(env={"VTRM_DISPATCH": "need_aware", "VTRM_CANCEL_AFTER_FREEZE": "1"},
                      dotenv=None)
    assert (cfg.dispatch, cfg.cancel_after_freeze) == ("need_aware", True)


def test_past_stop_from_file_env_and_flag(tmp_path):
    conf = tmp_path / "c.toml"
    conf.write_text('past_stop = "wait"\n')
    cfg = resolve_options(config=conf, env={}, dotenv=None)
    assert (cfg.past_stop, cfg.sources["past_stop"]) == ("wait", f"file {conf}")
    cfg = resolve_options(config=conf, env={"VTRM_PAST_STOP": "cancel"}, dotenv=None)
    assert (cfg.past_stop, cfg.sources["past_stop"]) == ("cancel", "env VTRM_PAST_STOP")
    cfg = resolve_options({"past_stop": "wait"}, env={"VTRM_PAST_STOP": "cancel"}, dotenv=None)
    assert (cfg.past_stop, cfg.sources["past_stop"]) == ("wait", "flag --past-stop")
    assert cfg.execution()["past_stop"] == "wait"
    with pytest.raises(ConfigError, match="env VTRM_PAST_STOP: past_stop must be one of"):
        resolve_options(env={"VTRM_PAST_STOP": "never"}, dotenv=None)


def test_step_flags_and_config_file_reach_the_gate(tmp_path):
    ws = tmp_path / "ws"
    assert cli("init", str(ws), "--seed", "5").returncode == 0
    conf = tmp_path / "c.toml"
    conf.write_text('dispatch = "need_aware"\n')
    r = cli("step", "--workspace", str(ws), "--epoch", "1", "--step", "1", "--json",
            "--config", str(conf), "--cancel-after-freeze", "--past-stop", "wait")
    assert r.returncode == 0, r.stderr
    mans = {json.loads(p.read_text())["step"]: json.loads(p.read_text())
            for p in (ws / "manifests").glob("*.json")}
    assert mans[1]["dispatch"] == "need_aware" and mans[1]["cancel_after_freeze"] is True
    assert mans[1]["past_stop"] == "wait"
    # a flag beats the file
    r = cli("step", "--workspace", str(ws), "--epoch", "1", "--step", "2", "--json",
            "--config", str(conf), "--dispatch", "round_robin")
    assert r.returncode == 0, r.stderr
    mans = {json.loads(p.read_text())["step"]: json.loads(p.read_text())
            for p in (ws / "manifests").glob("*.json")}
    assert mans[2]["dispatch"] == "round_robin" and mans[2]["cancel_after_freeze"] is True
    assert mans[2]["past_stop"] == "cancel"


def test_bad_dispatch_flag_exits_2(tmp_path):
    ws = tmp_path / "ws"
    assert cli("init", str(ws)).returncode == 0
    r = cli("step", "--workspace", str(ws), "--epoch", "1", "--step", "1",
            "--dispatch", "fastest")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "dispatch" in r.stderr
    r = cli("step", "--workspace", str(ws), "--epoch", "1", "--step", "1",
            "--past-stop", "later")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "past-stop" in r.stderr
