"""What the terminal shows: tables that fit COLUMNS without losing a row's reason, one
1-based counting convention for display (0-based ranks in the data), unique short type
names, --json errors as one JSON object, the demo leaving the clone clean."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vtrm_gate.cli._table import Column, render, short_names, terminal_width, text_width, wrap

ROOT = Path(__file__).resolve().parents[2]
TYPES = ["Action Reasoning", "Action Recognition", "Attribute Perception", "Counting Problem",
         "Information Synopsis", "OCR Problems", "Object Reasoning", "Object Recognition",
         "Spatial Perception", "Spatial Reasoning", "Temporal Perception", "Temporal Reasoning"]


def cli(*args: str, cwd: Path | None = None, columns: int | None = None):
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    if columns is not None:
        env["COLUMNS"] = str(columns)
    return subprocess.run([sys.executable, "-m", "vtrm_gate", *args], capture_output=True,
                          text=True, cwd=cwd or ROOT, timeout=240, env=env)


@pytest.fixture(scope="module")
def two_steps(tmp_path_factory):
    """A simulated workspace after steps e1 s1 and e1 s2 (s2 has skipped and cooling types,
    whose reason is in ``note``), with the text output of s2 at three widths and its JSON."""
    ws = tmp_path_factory.mktemp("term") / "ws"
    # the former default INFRA rate, so some types skip INFRA units (n_used vs stopped at)
    assert cli("init", str(ws), "--seed", "2", "--infra-rate", "0.003").returncode == 0
    first = cli("step", "--workspace", str(ws), "--epoch", "1", "--step", "1", columns=100)
    assert first.returncode == 0, first.stderr
    data = cli("step", "--workspace", str(ws), "--epoch", "1", "--step", "2", "--json")
    assert data.returncode == 0, data.stderr
    texts = {w: cli("step", "--workspace", str(ws), "--epoch", "1", "--step", "2", "--force",
                    columns=w) for w in (60, 100, 160)}
    return ws, first, json.loads(data.stdout), texts


@pytest.mark.parametrize("width", [60, 100, 160])
def test_the_step_table_fits_columns_and_keeps_every_reason(two_steps, width):
    # Was 167-190 columns whatever COLUMNS said, with `applied` cut ("rolled ba…") and
    # `note` (why a type was skipped or cooling down) dropped.
    _, _, data, texts = two_steps
    out = texts[width]
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert max(map(len, lines)) <= width
    flat = " ".join(" ".join(ln.split()) for ln in lines)
    reasons = [t["applied"] or t["note"] for t in data["types"]]
    assert any(t["note"] for t in data["types"]) and any(t["applied"] for t in data["types"])
    for reason in reasons:
        assert " ".join(reason.split()) in flat.replace("→ ", ""), reason


def test_default_width_is_100_when_not_a_terminal(two_steps):
    ws, _, _, _ = two_steps
    out = cli("replay", "--workspace", str(ws), "--epoch", "1", "--step", "1")
    assert out.returncode == 0 and max(map(len, out.stdout.splitlines())) <= 100


def test_display_counts_from_one_and_the_data_from_zero(two_steps):
    """The event line, the table and the JSON agree: "stopped at unit k of n" is
    stop_rank + 1; n_used is told apart from it when INFRA units were skipped."""
    ws, first, _, _ = two_steps
    data = json.loads(cli("replay", "--workspace", str(ws), "--epoch", "1", "--step", "1",
                          "--json").stdout)
    events = {ln.split("] ", 1)[1][:20].strip(): ln for ln in first.stderr.splitlines()
              if "stopped at unit" in ln}
    for row in data["types"]:
        if row["live_stop_rank"] is None:
            continue
        k, n = row["live_stop_rank"] + 1, row["n_ladder"]
        line = events[row["task_type"]]
        assert f"stopped at unit {k} of {n}" in line
        assert f"{k} of {n}" in first.stdout  # the table's "stopped at" column
    infra = [ln for ln in first.stderr.splitlines() if "INFRA" in ln]
    assert infra, "seed 2 at INFRA rate 0.003 has types with skipped INFRA units"
    for ln in infra:
        k = int(ln.split("stopped at unit ")[1].split()[0])
        used, skipped = (int(x.split()[0]) for x in ln.split("n_used ")[1].split(", "))
        assert used + skipped == k


def test_short_type_names_are_unique_and_readable():
    short = short_names(TYPES, 8)
    assert len(set(short.values())) == len(TYPES)
    assert short["Action Reasoning"] == "Act Rea" and short["Action Recognition"] == "Act Rec"
    assert len(set(short_names(["type-1", "type-2", "type-10"]).values())) == 3


def test_the_progress_line_names_types_unambiguously(two_steps):
    _, first, _, _ = two_steps
    status = [ln for ln in first.stderr.splitlines() if "in flight" in ln]
    assert status and all(len(ln) <= 100 for ln in first.stderr.splitlines())
    for ln in status:
        names = [item.rsplit(" ", 1)[0] for item in ln.split(" | ")[-1].split(" +")[0]
                 .split(", ")]
        assert len(names) == len(set(names)), ln  # was "Action 0/40, Action 0/40"


def test_a_narrow_table_abbreviates_names_and_wraps_the_reason():
    cols = [Column("type", tuple(TYPES)), Column("status", ("gated",) * 12),
            Column("tokens", ("1,000,000",) * 12, True, drop_rank=1)]
    text = render(cols, 24, {0: "probation: v1 -> v2 (rolled back to v1 if it fails at the "
                                "end of epoch 1)"})
    assert max(map(len, text.splitlines())) <= 24
    assert "tokens" not in text and "Act Rea" in text
    assert "the end of epoch 1)" in " ".join(text.split())


def test_columns_is_read_from_the_environment(monkeypatch):
    monkeypatch.setenv("COLUMNS", "72")
    assert terminal_width() == 72
    monkeypatch.setenv("COLUMNS", "12")
    assert terminal_width() == 40  # the least honoured
    monkeypatch.setenv("COLUMNS", "junk")
    assert terminal_width() == 100  # pytest's stdout is not a terminal
    for digit_but_not_a_number in ("\u00b2", "1\u00b2", "\u2460"):  # "²", "1²", "①"
        monkeypatch.setenv("COLUMNS", digit_but_not_a_number)
        assert terminal_width() == 100  # was a ValueError: str.isdigit() but not int()


def test_a_superscript_columns_is_not_a_traceback(tmp_path):
    out = subprocess.run([sys.executable, "-m", "vtrm_gate", "init", str(tmp_path / "ws")],
                         capture_output=True, text=True, cwd=ROOT, timeout=60,
                         env={**os.environ, "COLUMNS": "\u00b2"})
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert max(map(len, out.stdout.splitlines())) <= 100  # the fallback width


@pytest.mark.parametrize("args, fragment", [
    (["step", "--workspace", "/nonexistent/ws", "--epoch", "1", "--step", "1", "--json"],
     "no such workspace"),
    (["step", "--workspace", ".", "--epoch", "x", "--step", "1", "--json"], "--epoch"),
    (["train", "--workspace", "/nonexistent/ws", "--epochs", "1", "--steps-per-epoch", "1",
      "--json"], "no such workspace"),
    (["cache", "stats", "--url", "redis://127.0.0.1:1", "--json"], "cannot reach Redis"),
    (["init", "/nonexistent/dir/ws", "--seed", "-1", "--json"], "--seed"),
])
def test_json_errors_are_one_json_object(args, fragment):
    out = cli(*args)
    assert out.returncode == 2
    err = json.loads(out.stdout)  # the whole of stdout is one object
    assert set(err) == {"error", "exit"} and err["exit"] == 2 and fragment in err["error"]
    assert "Traceback" not in out.stderr


def test_cache_stats_on_a_simulated_workspace_says_it_uses_no_redis(two_steps):
    ws, _, _, _ = two_steps
    out = cli("cache", "stats", "--workspace", str(ws))
    assert out.returncode == 0, out.stderr  # was exit 2: "no embedded cache"
    text = " ".join(out.stdout.split())
    assert "simulated runs use no Redis" in text and "04_redis_reuse" in text
    data = json.loads(cli("cache", "stats", "--workspace", str(ws), "--json").stdout)
    assert data["kind"] == "simulated" and data["redis"] is None


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_the_demo_leaves_git_status_clean_and_says_when_it_reruns(tmp_path):
    """As `make demo` in a fresh clone: the repository's .gitignore, the default paths."""
    shutil.copy(ROOT / ".gitignore", tmp_path / ".gitignore")
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", ".gitignore"], check=True)
    subprocess.run([*git, "commit", "-qm", "init"], check=True)
    first = cli("demo", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    from PIL import Image

    png = tmp_path / "workspace-demo" / "figures" / "demo_trajectories.png"
    assert Image.open(png).size == (1280, 720)  # was 1320x840
    status = subprocess.run([*git, "status", "--porcelain", "--untracked-files=all"],
                            capture_output=True, text=True, check=True).stdout
    assert status == ""  # was: figures/demo_trajectories.png and demo_summary.json
    assert "re-run" not in first.stderr + first.stdout
    second = cli("demo", cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert "re-run: workspace-demo already ran step e1 s1" in " ".join(second.stderr.split())
    assert "base arm from BaselineCache" in second.stdout


def test_a_status_line_redraws_in_place_on_a_terminal_and_waits_before_the_first(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import vtrm_gate.cli._progress as progress

    master, slave = os.openpty()
    with open(slave, "w") as tty:
        show, done = progress.status_line(tty)
        show("quick")  # work shorter than STATUS_EVERY_S shows nothing
        monkeypatch.setattr(progress, "STATUS_EVERY_S", 0.0)
        show("one")
        show("two")
        done()
    chunks = []
    while True:  # a pty hands the bytes over in pieces; EIO once the closed side is drained
        try:
            chunk = os.read(master, 1000)
        except OSError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    text = b"".join(chunks).decode()
    assert text.replace("\r\n", "\n") == "\rone\rtwo\n"  # the pty maps "\n" to "\r\n"


WIDE = ("时间推理", "空间感知与推理", "OCR Problems", "Подсчёт объектов")


def test_a_table_of_wide_names_lines_up_on_the_terminal():
    """Hostile pass (h13): a CJK character fills two terminal columns, but the table padded
    by characters, so "时间推理" pushed its row's cells 4 columns right of the header."""
    from vtrm_gate.cli._table import text_width

    assert [text_width(n) for n in WIDE] == [8, 14, 12, 16]
    assert text_width("e\u0301") == 1  # a combining accent takes no column
    cols = [Column("type", WIDE), Column("status", ("gated",) * 4),
            Column("tokens", ("1,000",) * 4, True)]
    lines = render(cols, 100).splitlines()
    cells = [lines[0], *lines[2:]]
    heads = ("status", *("gated",) * 4)
    starts = {text_width(ln[:ln.index(w)]) for ln, w in zip(cells, heads, strict=True)}
    assert starts == {18}, lines  # every "status" cell starts where its header does
    assert len({text_width(ln) for ln in lines}) == 1
    narrow = render(cols, 30).splitlines()
    assert max(text_width(ln) for ln in narrow) <= 30, narrow
    short = short_names(WIDE, 8)
    assert max(map(text_width, short.values())) <= 8 and len(set(short.values())) == 4


def test_a_long_table_measures_each_cell_a_bounded_number_of_times(monkeypatch):
    """Hostile pass (h11): ``replay --outcomes`` of a 50,000-gate table ran for hours: every
    cell of every row asked its column's width, which measured the whole column again
    (rows² measurements; 200,000 rows took 136 s, with --json 7 s)."""
    import vtrm_gate.cli._table as table

    calls = 0
    real = table.text_width

    def counted(text: str) -> int:
        nonlocal calls
        calls += 1
        return real(text)

    monkeypatch.setattr(table, "text_width", counted)
    rows = 2000
    cols = [table.Column("type", tuple(f"T{i}" for i in range(rows))),
            table.Column("units", tuple(str(i) for i in range(rows)), right=True)]
    out = table.render(cols, 80)
    assert out.count("\n") == rows + 1
    assert calls <= 10 * 2 * (rows + 1), calls  # a few times per cell, never per row²


@pytest.mark.parametrize("width", [60, 80])
def test_a_wrapped_last_column_of_wide_characters_fits_the_terminal(width: int) -> None:
    """(h20) The last column wrapped by characters, not terminal columns: a config path in
    Japanese made `options` 107 columns wide at 80."""
    source = "file /tmp/設定ファイル設定ファイル設定ファイル/構成構成構成構成構成.toml"
    cols = [Column("option", ("concurrency", "gate.w_net_min_provisional"), whole=True),
            Column("value", ("7", "2")), Column("source", (source, "default"))]
    text = render(cols, width)
    assert max(map(text_width, text.splitlines())) <= width, text
    assert "".join(text.split()).count("構成") == 5  # nothing lost in the wrap


@given(st.lists(st.sampled_from(["a", "bb", "path/to/x", "--flag", "x" * 30, " ", "  ", "\t",
                                 "\n", "a-b", "é", "\u00a0", "\r"]), max_size=40).map("".join),
       st.integers(1, 60), st.sampled_from(["", "  ", "    ", "      "]))
def test_wrap_of_narrow_characters_is_textwraps_fill(text: str, width: int, indent: str) -> None:
    """`wrap` measures terminal columns; where each character is one column its lines are
    `textwrap.fill`'s, as before (long words whole, no hyphen breaks)."""
    old = "\n".join(textwrap.fill(p, width, subsequent_indent=indent, break_long_words=False,
                                  break_on_hyphens=False) for p in text.split("\n"))
    assert wrap(text, width, indent) == old


@pytest.mark.parametrize("width", [40, 60, 80])
def test_a_prose_line_of_chinese_names_fits_the_terminal(width: int) -> None:
    """The lines under a table wrapped by characters: a line naming the team's types in
    Chinese (two columns each) ran past the terminal's edge."""
    line = ("cooldown: 时间推理 动作识别 属性感知 计数问题 信息概括 空间推理 物体识别 "
            "skip this step; next: vtrm-gate step --workspace /data/视频问答/第三轮训练")
    text = wrap(line, width, "    ")
    assert max(map(text_width, text.splitlines())) <= width, text
    assert text.split() == line.split()  # every word, whole and in order
    note = render([Column("type", ("a",)), Column("W", ("1",), right=True)], width,
                  notes={0: line})
    assert max(map(text_width, note.splitlines())) <= width, note


def test_init_into_a_chinese_directory_fits_60_columns(tmp_path: Path) -> None:
    """What the team sees first: ``init`` of a workspace under a Chinese path (its 16
    characters take 31 columns)."""
    r = cli("init", "视频问答实验/第三轮训练的工作区", "--seed", "1", cwd=tmp_path, columns=60)
    assert r.returncode == 0, r.stderr
    assert max(map(text_width, r.stdout.splitlines())) <= 60, r.stdout


def test_a_rows_note_of_one_column_characters_breaks_as_textwrap_did() -> None:
    """(h21) Row notes went through the prose fill, which keeps long words whole: a candidate
    name of 40 characters made a 48-column line at 40. A note of one-column characters
    breaks long and hyphenated words as before."""
    note = "rolled back: candidate-2026-12-07-temporal-reasoning-v3 failed probation"
    text = render([Column("type", ("Counting Problem",)), Column("W", ("1",), right=True)], 40,
                  notes={0: note})
    assert text.splitlines()[3:] == textwrap.wrap(note, 40, initial_indent="    → ",
                                                  subsequent_indent="      ")
    wide = render([Column("type", ("计数",)), Column("W", ("1",), right=True)], 40,
                  notes={0: note.replace("Counting", "计数问题") + " 计数问题" * 8})
    assert max(map(text_width, wide.splitlines())) <= 40, wide


def test_a_wrapped_cells_tabs_and_runs_of_spaces_are_one_space() -> None:
    """(h21) A wrapped cell kept a tab (expanded from its place in the whole cell) and runs
    of spaces, where it had read as single spaces."""
    text = render([Column("type", ("Counting",), whole=True),
                   Column("why", ("one\ttwo  three four\u00a0five six seven eight nine",))], 40)
    assert text.splitlines()[2:] == ["Counting one two three four five six",
                                     "         seven eight nine"]
