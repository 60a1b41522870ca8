"""A hostile pass over every command-line option (session 17): each input that crashed,
hung, lost a file or gave a silent wrong result now exits 2 with one line naming what is
wrong, and nothing already written changes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from test_cli import cli

from vtrm_gate.errors import ConfigError
from vtrm_gate.harness import WorkspaceConfig


def files(root: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}


def refused(r, *said: str) -> None:
    assert r.returncode == 2 and "Traceback" not in r.stderr, (r.returncode, r.stderr)
    assert all(s in r.stderr for s in said), r.stderr


@pytest.fixture(scope="module")
def stepped(tmp_path_factory) -> Path:
    ws = tmp_path_factory.mktemp("fuzz") / "ws"
    assert cli("init", str(ws), "--seed", "1").returncode == 0
    assert cli("step", "--workspace", str(ws), "--epoch", "1", "--step", "1").returncode == 0
    return ws


def test_a_policy_count_too_large_for_the_state_is_refused_at_init(tmp_path):
    """``--cooldown-steps 9223372036854775807``: the step wrote cooldown_until = 2**63 into
    state.json, and no command opened the workspace again."""
    r = cli("init", str(tmp_path / "ws"), "--seed", "1", "--cooldown-steps", str(2**63 - 1))
    refused(r, "cooldown_steps must be an integer from 0 to 1000000")
    assert not (tmp_path / "ws").exists()
    for name in ("cooldown_steps", "rejected_max", "probation_units"):  # workspace.json's
        with pytest.raises(ConfigError, match=f"{name} must be an integer from 0 to 1000000"):
            WorkspaceConfig(**{name: 1_000_001})


def test_settle_with_n_max_below_the_probe_size_probes_n_max_units(tmp_path):
    """``n_max = 20`` with a 40-unit probe: settle and train failed with a ValueError
    traceback (and wrote "aborted" rows); step truncates its ladders to n_max."""
    conf = tmp_path / "n20.toml"
    conf.write_text("[gate]\nn_max = 20\n")
    ws = tmp_path / "ws"
    assert cli("init", str(ws), "--seed", "1").returncode == 0
    r = cli("train", "--workspace", str(ws), "--epochs", "1", "--steps-per-epoch", "2",
            "--config", str(conf), "--json")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    import sqlite3

    con = sqlite3.connect(ws / "harness.sqlite")
    probes = con.execute("SELECT task_type, n_ladder FROM step_report WHERE step = 0").fetchall()
    con.close()
    assert probes and all(n <= 20 for _, n in probes), probes


def test_fit_refuses_to_write_over_its_own_outcomes(stepped, tmp_path):
    assert cli("export", "--workspace", str(stepped), "--out", str(tmp_path / "x"),
               "--format", "csv").returncode == 0
    src = tmp_path / "x" / "outcomes.csv"
    before = src.read_bytes()
    r = cli("fit", "--outcomes", str(src), "--out", str(src), "--boot", "10")
    refused(r, "--out", "the --outcomes file")
    assert src.read_bytes() == before


def test_fit_refuses_gates_without_a_discordant_pair(stepped, tmp_path):
    """Every pair a tie: fit printed "34% harmful (34%-34%)" with zero-width intervals."""
    rows = [{"epoch": 1, "step": 1, "task_type": "Counting Problem", "ladder_rank": r,
             "unit_id": f"u{g}_{r}", "base_correct": True, "cand_correct": True,
             "infra": False, "n_ladder": 40} for r in range(40) for g in (1,)]
    rows += [{**x, "step": 2, "unit_id": x["unit_id"] + "b"} for x in rows]
    src = tmp_path / "ties.jsonl"
    src.write_text("".join(json.dumps(x) + "\n" for x in rows))
    refused(cli("fit", "--outcomes", str(src), "--boot", "10"), "no discordant pair")


@pytest.mark.parametrize(("args", "said"), [
    (["--endpoints", "EP", "--base-url", "http://127.0.0.1:9/v1"], "--endpoints"),
    (["--backend", "vtrm_gate.llm:tool_backend", "--base-url", "http://127.0.0.1:9/v1"],
     "--backend"),
])
def test_init_refuses_options_that_would_be_dropped(tmp_path, args, said):
    units = tmp_path / "u.jsonl"
    units.write_text("".join(json.dumps(
        {"unit_id": f"u{i}", "task_type": "Counting", "question": f"q{i}?",
         "options": ["a", "b"], "answer": "A"}) + "\n" for i in range(8)))
    ep = tmp_path / "ep.txt"
    ep.write_text("http://127.0.0.1:9/v1\n")
    args = [str(ep) if a == "EP" else a for a in args]
    r = cli("init", str(tmp_path / "ws"), "--llm", "--units", str(units), "--model", "m", *args)
    refused(r, said, "--base-url")
    assert not (tmp_path / "ws").exists()


def test_fit_refuses_jobs_with_a_scheduler(stepped):
    r = cli("fit", "--workspace", str(stepped), "--jobs", "2", "--scheduler",
            "tcp://127.0.0.1:9", "--boot", "10")
    refused(r, "--jobs", "--scheduler")


def test_demo_says_when_its_seed_is_not_the_workspaces(tmp_path):
    ws = tmp_path / "dm"
    assert cli("demo", "--workspace", str(ws), "--seed", "2").returncode == 0
    r = cli("demo", "--workspace", str(ws), "--seed", "3")
    refused(r, "seed 2", "--seed 3")


def test_json_output_to_a_full_disk_is_one_error_line(stepped):
    with open("/dev/full", "w") as full:
        import subprocess
        import sys

        r = subprocess.run([sys.executable, "-m", "vtrm_gate", "status", "--workspace",
                            str(stepped), "--json"], stdout=full, stderr=subprocess.PIPE,
                           text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "No space left on device" in r.stderr


def test_a_step_whose_output_fails_after_it_was_applied_says_it_was_applied(stepped, tmp_path):
    """The step was applied, then "No space left on device ... run the same command again":
    doing so re-ran a finished step and replaced its rows."""
    import shutil
    import subprocess
    import sys

    ws = tmp_path / "ws"
    shutil.copytree(stepped, ws)
    with open("/dev/full", "w") as full:
        r = subprocess.run([sys.executable, "-m", "vtrm_gate", "step", "--workspace", str(ws),
                            "--epoch", "1", "--step", "2"], stdout=full,
                           stderr=subprocess.PIPE, text=True, timeout=240)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "run the same command again" not in r.stderr
    assert "step finished and its work is saved (vtrm-gate status shows" in r.stderr, r.stderr
    assert json.loads((ws / "state.json").read_text())["last_step"] == [1, 2]


def test_replay_says_when_the_live_gate_used_another_rule(stepped, tmp_path):
    import shutil

    ws = tmp_path / "ws"
    shutil.copytree(stepped, ws)
    assert cli("step", "--workspace", str(ws), "--epoch", "1", "--step", "2",
               "--decision-rule", "old_blocks").returncode == 0
    r = cli("replay", "--workspace", str(ws), "--epoch", "1", "--step", "2")
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.split())
    assert "the live gate decided with old_blocks" in text, text


def test_non_utf8_bytes_in_a_path_are_refused_naming_the_option(stepped, tmp_path):
    bad = os.fsdecode(bytes(tmp_path) + b"/ex\xff")
    before = files(stepped)
    refused(cli("export", "--workspace", str(stepped), "--out", bad), "--out", "UTF-8")
    refused(cli("init", bad, "--seed", "1"), "UTF-8")
    assert not os.path.exists(bad)
    assert files(stepped) == before


@pytest.mark.parametrize("command", ["step", "train"])
def test_a_simulated_rollout_that_fails_for_infra_is_not_read_as_no_cases(tmp_path, command):
    """``--infra-rate 0.99``: every type was ``no_cases``, the step exit 0 and applied, and
    status said "INFRA: 0 calls": the simulator's rollout dropped its INFRA results."""
    ws = tmp_path / "ws"
    assert cli("init", str(ws), "--seed", "1", "--infra-rate", "0.99").returncode == 0
    args = (["step", "--workspace", str(ws), "--epoch", "1", "--step", "1"]
            if command == "step" else
            ["train", "--workspace", str(ws), "--epochs", "1", "--steps-per-epoch", "1"])
    r = cli(*args)
    assert r.returncode == 3 and "Traceback" not in r.stderr, (r.returncode, r.stderr)
    assert "rollout INFRA" in r.stderr, r.stderr
    assert json.loads((ws / "state.json").read_text())["last_step"] is None


def _special(tmp_path: Path, kind: str) -> str:
    """A FIFO (opening it blocks for ever), /dev/zero (endless) or a deep JSON file."""
    if kind == "fifo":
        p = tmp_path / "f.json"
        os.mkfifo(p)
        return str(p)
    if kind == "zero":
        p = tmp_path / "z.json"
        p.symlink_to("/dev/zero")
        return str(p)
    p = tmp_path / "deep.json"
    p.write_text("[" * 100_000 + "]" * 100_000)
    return str(p)


@pytest.mark.parametrize("kind", ["fifo", "zero", "deep"])
@pytest.mark.parametrize("option", ["--world", "--endpoints", "--units", "--config"])
def test_a_settings_file_that_is_no_regular_file_or_too_deep_is_refused(tmp_path, kind, option):
    """``--world`` on a FIFO hung, on /dev/zero took all memory, and 100,000 nested brackets
    raised RecursionError; so did ``--endpoints``, ``--units`` and ``--config``."""
    path = _special(tmp_path, kind)
    ws = tmp_path / "ws"
    if option == "--config":
        assert cli("init", str(ws), "--seed", "1").returncode == 0
        args = ["step", "--workspace", str(ws), "--epoch", "1", "--step", "1", option, path]
    elif option == "--world":
        args = ["init", str(ws), "--seed", "1", option, path]
    else:
        units = tmp_path / "u.jsonl"
        units.write_text(json.dumps({"unit_id": "u1", "task_type": "Counting",
                                     "question": "q?", "options": ["a", "b"],
                                     "answer": "A"}) + "\n")
        args = ["init", str(ws), "--llm", "--model", "m", "--units", str(units), option, path]
        if option == "--units":
            args += ["--base-url", "http://127.0.0.1:9/v1"]
            args.remove(str(units))
            args.remove("--units")
    before = files(tmp_path) if ws.exists() else {}
    r = cli(*args)
    said = {"fifo": "not a regular file", "zero": "not a regular file",
            "deep": "nested too deeply"}[kind]
    refused(r, said)
    if before:
        assert files(ws) == {p: b for p, b in before.items() if p.is_relative_to(ws)}
    else:
        assert not ws.exists()


@pytest.mark.parametrize("kind", ["fifo", "zero"])
def test_a_dotenv_that_is_no_regular_file_is_refused(tmp_path, kind):
    """A ``.env`` in the working directory that is a FIFO hung every command reading it."""
    p = tmp_path / ".env"
    if kind == "fifo":
        os.mkfifo(p)
    else:
        p.symlink_to("/dev/zero")
    assert cli("init", str(tmp_path / "ws"), "--seed", "1").returncode == 0
    r = cli("step", "--workspace", str(tmp_path / "ws"), "--epoch", "1", "--step", "1",
            cwd=tmp_path)
    refused(r, ".env", "not a regular file")


def test_fit_refuses_to_write_into_a_fifo(stepped, tmp_path):
    out = tmp_path / "w.json"
    os.mkfifo(out)
    refused(cli("fit", "--workspace", str(stepped), "--out", str(out), "--boot", "10"),
            "--out", "not a regular file")


def test_a_config_file_named_in_capitals_is_read_by_its_suffix(stepped, tmp_path):
    """``cfg.JSON`` was parsed as TOML: "Invalid statement"."""
    conf = tmp_path / "cfg.JSON"
    conf.write_text('{"gate": {"n_max": 30}}')
    r = cli("options", "--workspace", str(stepped), "--config", str(conf), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["options"]["gate.n_max"]["value"] == 30


@pytest.mark.parametrize("args", [["compare", "WS", ""], ["options", "--workspace", "WS",
                                                         "--config", ""]])
def test_an_empty_path_is_refused_not_read_as_the_working_directory(stepped, args):
    r = cli(*[str(stepped) if a == "WS" else a for a in args])
    refused(r, "expected a path")


def test_init_on_a_file_says_it_is_not_a_directory(tmp_path):
    (tmp_path / "empty").write_text("")
    refused(cli("init", str(tmp_path / "empty"), "--seed", "1"), "is not a directory")


def test_a_seed_record_that_is_a_fifo_is_named_not_missing(tmp_path):
    units = tmp_path / "u.jsonl"
    units.write_text(json.dumps({"unit_id": "u1", "task_type": "Counting", "question": "q?",
                                 "options": ["a", "b"], "answer": "A"}) + "\n")
    fifo = tmp_path / "seed.json"
    os.mkfifo(fifo)
    r = cli("init", str(tmp_path / "ws"), "--llm", "--units", str(units), "--model", "m",
            "--base-url", "http://127.0.0.1:9/v1", "--seed-record", str(fifo))
    refused(r, "not a regular file")


@pytest.mark.parametrize(("args", "said"), [
    (["step", "--epoch", "1", "--step", "2", "--time-scale", "1e300"], "--time-scale"),
    (["fit", "--boot", "10", "--jobs", str(10**9)], "--jobs"),
])
def test_a_clock_or_a_pool_too_large_to_mean_anything_is_refused(stepped, args, said):
    """``--time-scale 1e300`` slept until killed; ``fit --jobs 10**9`` started processes until
    its pool's limit. Both are refused before anything runs."""
    before = files(stepped)
    r = cli(*args, "--workspace", str(stepped))
    refused(r, said)
    assert files(stepped) == before


@pytest.mark.parametrize("make", [
    lambda: __import__("vtrm_gate").RunOptions(time_scale=1e300),
    lambda: __import__("vtrm_gate.sim", fromlist=["SimConfig"]).SimConfig(time_scale=11.0),
])
def test_the_library_refuses_a_time_scale_that_sleeps_for_ever(make):
    with pytest.raises(ConfigError, match="time_scale must be a number from 0 to 10 "):
        make()

