"""The rough edges of a new user's first hour (issue 28), on the real command: every line of
``init``, ``step``, ``train``, ``replay`` and ``options`` within ``COLUMNS=80``; usage errors
on one line; a re-run step says so; ``cache stop`` and ``init`` name what is wrong."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str, columns: int = 80,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **(env or {}), "COLUMNS": str(columns)}
    env.pop("VTRM_WORKSPACE", None)
    return subprocess.run([sys.executable, "-m", "vtrm_gate", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=240, env=env)


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    """A seed-2 workspace: init, step e1 s1, the same step again, replay, options, then
    train 1 x 2 (step s2, settlement, evaluation); each command's result at COLUMNS=80."""
    ws = str(tmp_path_factory.mktemp("first_hour") / "ws")
    runs = {"init": cli("init", ws, "--seed", "2"),
            "step": cli("step", "--workspace", ws, "--epoch", "1", "--step", "1")}
    runs["step again"] = cli("step", "--workspace", ws, "--epoch", "1", "--step", "1")
    runs["replay"] = cli("replay", "--workspace", ws, "--epoch", "1", "--step", "1")
    runs["options"] = cli("options", "--workspace", ws)
    runs["train"] = cli("train", "--workspace", ws, "--epochs", "1", "--steps-per-epoch", "2")
    return ws, runs


@pytest.mark.parametrize("command", ["init", "step", "step again", "replay", "options",
                                     "train"])
def test_every_line_of_every_command_fits_80_columns(outputs, command):
    # Was: train 112-281 characters, replay 84, options 97.
    out = outputs[1][command]
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines
    assert max(map(len, lines)) <= 80, max(lines, key=len)


@pytest.fixture(scope="module")
def option_names(outputs):
    """Every option `options --json` lists for the workspace (once for the module)."""
    out = cli("options", "--workspace", outputs[0], "--json")
    assert out.returncode == 0, out.stderr
    return set(json.loads(out.stdout)["options"])


@pytest.mark.parametrize("columns", [43, 45, 53, 60, 80])
def test_options_prints_every_option_name_whole_at_any_width(outputs, option_names, columns):
    """At COLUMNS=80 the names were cut to fit ("gate.e_provisio", "max_tokens_answ"): a name
    the user has to type, in a table whose source column had room to wrap. (h20) With the
    names whole, 43-53 columns left the source under 12 columns, and it was not wrapped at
    all (85-column lines): it goes under its row now."""
    out = cli("options", "--workspace", outputs[0], columns=columns)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert max(map(len, lines)) <= columns, max(lines, key=len)
    firsts = {line.split()[0] for line in lines[2:] if line[:1].strip()}
    assert option_names <= firsts, sorted(option_names - firsts)


LONG = {"REDIS_URL": "redis://researcher:s3cret@redis-cache-primary.video-qa-training.internal"
                     ".example.com:6379/3",
        "VTRM_CACHE_PREFIX": "vtrm:experiment-2026-12-third-round-temporal-reasoning-ablation:"}


@pytest.mark.parametrize("columns", [60, 80, 100])
def test_options_wraps_a_long_value_within_the_terminal(outputs, columns):
    """A long Redis URL, cache prefix or backend made every `options` line as wide as the
    longest value (115 columns at 80): the value column now wraps within its share, and the
    value read down that column is the whole value (the URL's password masked)."""
    backend = "my_lab_agents.video_qa.agents_with_tools:make_tool_agent_backend_v2"
    out = cli("options", "--workspace", outputs[0], "--backend", backend, columns=columns,
              env=LONG)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert max(map(len, lines)) <= columns, max(lines, key=len)
    start, end = lines[0].index("value"), lines[0].index("source")

    def value(name: str) -> str:
        """The cells of ``name``'s row in the value column, its lines joined."""
        i = next(k for k, ln in enumerate(lines) if ln.split()[0] == name)
        more = itertools.takewhile(lambda ln: not ln[:start].strip() and ln[start:end].strip(),
                                   lines[i + 1:])
        return "".join(ln[start:end].strip() for ln in [lines[i], *more])

    assert value("redis_url") == LONG["REDIS_URL"].replace("s3cret", "***")
    assert value("cache_prefix") == LONG["VTRM_CACHE_PREFIX"]
    assert value("backend") == backend
    assert value("dispatch") == "expected_need"


def test_train_wraps_its_lines_without_losing_words(outputs):
    text = " ".join(outputs[1]["train"].stdout.split())
    assert "e1 evaluate held-out accuracy" in text and "(95% Newcombe)" in text
    assert "true accuracy (mean over types): initial" in text


def test_a_rerun_step_says_so_and_a_first_run_does_not(outputs):
    _, runs = outputs
    assert "re-run" not in runs["step"].stdout + runs["step"].stderr
    again = " ".join(runs["step again"].stdout.split())
    assert ("re-run: step e1 s1 was recorded and applied before; it ran again from the state "
            "before it (log rows replaced, recorded candidates reused, base arm from "
            "BaselineCache for") in again
    # (h26) the first run's cost went without a word: the re-run's is what is recorded now
    assert "its tokens and time are now this run's, the earlier run's are kept in " \
        "replaced_runs (vtrm-gate compare shows them)" in again


def test_replay_counts_unrun_units_in_the_right_number(outputs):
    text = " ".join(outputs[1]["replay"].stdout.split())
    assert "(needs 1 unrun unit)" in text and "1 unrun units" not in text  # was "1 unrun units"


@pytest.mark.parametrize("args, fragment", [
    (["step", "--workspace", ".", "--epoch", "0", "--step", "1"],
     "vtrm-gate step: --epoch: expected an integer >= 1, got 0"),
    (["step", "--workspace", ".", "--epoch", "1", "--step", "1", "--dispatch", "fastest"],
     "vtrm-gate step: --dispatch: invalid choice: 'fastest' (see --help)"),
    (["init", "x", "--seed", "abc"], "vtrm-gate init: --seed: expected an integer, got 'abc'"),
    (["step", "--workspace", ".", "--epoch", "1", "--step", "1", "--concurrency", "0"],
     "--concurrency: expected an integer >= 1, got 0"),
    (["stpe", "--workspace", "."], "vtrm-gate: command: invalid choice: 'stpe' (see --help)"),
    (["init", "x", "--seed", "x" * 90], "vtrm-gate init: --seed: expected an integer, got "
                                        "'xxx"),
])
def test_usage_errors_print_one_line_within_columns_and_exit_2(args, fragment):
    out = cli(*args)  # was the whole usage block (3-15 lines) before the error
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and fragment in out.stderr, out.stderr
    assert "usage:" not in out.stderr
    assert len(out.stderr.rstrip("\n")) <= 80, out.stderr  # --dispatch's was ~100


def test_a_usage_error_lists_the_choices_when_they_fit_and_cuts_only_as_a_last_resort():
    args = ["step", "--workspace", ".", "--epoch", "1", "--step", "1", "--dispatch", "fastest"]
    wide = cli(*args, columns=120).stderr.rstrip("\n")
    assert wide.endswith("invalid choice: 'fastest' (choose from round_robin, need_aware, "
                         "expected_need)"), wide
    cut = cli("init", "x", "--seed", "x" * 200, columns=80).stderr.rstrip("\n")
    assert len(cut) == 80 and cut.endswith("xxx… (see --help)"), cut


def test_cache_stop_with_nothing_running_says_why(outputs, tmp_path):
    ws, _ = outputs
    out = cli("cache", "stop", "--workspace", ws)
    text = " ".join(out.stdout.split())
    assert out.returncode == 0 and "nothing to stop: simulated runs use no Redis" in text
    out = cli("cache", "stop", "--workspace", str(tmp_path / "typo"))  # was exit 0, "no
    assert out.returncode == 2 and "no such workspace" in out.stderr  # embedded Redis running"
    (tmp_path / "redis").mkdir()
    out = cli("cache", "stop", "--workspace", str(tmp_path))
    assert out.returncode == 0 and "nothing to stop" in " ".join(out.stdout.split())


def _unwritable(tmp_path: Path) -> Path:
    if os.geteuid() != 0:
        d = tmp_path / "read-only"
        d.mkdir(mode=0o555)
        return d / "ws"
    if not Path("/proc/self").is_dir():
        pytest.skip("running as root without /proc: no directory it cannot write")
    return Path("/proc/ws")  # root writes anywhere but into procfs


def test_init_into_a_bad_path_names_the_users_path(tmp_path):
    target = _unwritable(tmp_path)
    out = cli("init", str(target))  # was "/proc/.ws.init-1234: No such file or directory"
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert f"{target}: cannot create the workspace there" in out.stderr
    assert ".init-" not in out.stderr
    (tmp_path / "file").write_text("")
    out = cli("init", str(tmp_path / "file" / "ws"))
    assert out.returncode == 2
    assert f"cannot create the workspace there: {tmp_path / 'file'} is not a directory" in \
        out.stderr


def test_the_demo_is_init_without_held_out_units_plus_step(outputs, tmp_path):
    """The README's "the same in the demo, the CLI and the notebooks" held only with
    ``--heldout-fraction 0`` (init holds out 20%): the demo's numbers are that command's, and
    the demo says why ``init --seed 2`` + ``step`` differs."""
    import json

    ws = str(tmp_path / "ws")
    assert cli("init", ws, "--seed", "2", "--heldout-fraction", "0").returncode == 0
    step = json.loads(cli("step", "--workspace", ws, "--epoch", "1", "--step", "1",
                          "--json").stdout)
    demo = cli("demo", "--workspace", str(tmp_path / "demo"))
    data = json.loads((tmp_path / "demo" / "figures" / "demo_summary.json").read_text())
    key = ("task_type", "action", "W", "L", "stop_rank")
    assert [{k: t[k] for k in key} for t in data["types"]] == [
        {k: t[k] for k in key} for t in step["types"]]
    assert data["makespan_s"] == step["makespan_s"]
    text = " ".join(demo.stdout.split())
    assert "holds out 20% of the units" in text and "--heldout-fraction 0" in text
    long = [ln for ln in demo.stdout.splitlines() if len(ln) > 80]
    assert all(len(ln.split()) == 1 for ln in long), long  # a long path alone stays whole
    default = " ".join(outputs[1]["step"].stdout.split())  # init --seed 2 (20% held out)
    assert "makespan 1.24 h" in default and "makespan 1.28 h" in text  # README's numbers
