"""Issue 27 row 7: only the library's own errors and I/O errors on files are exit 2 (bad
input, one line); any other exception is a bug: its traceback, a line asking for a report,
exit 1, so a bug that raises ValueError is never reported as bad input."""

from __future__ import annotations

import errno
import json
import os
import sqlite3

import pytest

from vtrm_gate.cli import _main, _options
from vtrm_gate.errors import ConfigError, WorkspaceError, exit_code


@pytest.mark.parametrize("bug", [
    ValueError("an internal invariant broke"),
    OSError("an OSError without an errno"),
    sqlite3.OperationalError("near 'SELEC': syntax error"),
    sqlite3.ProgrammingError("Cannot operate on a closed database."),
    KeyError("missing"),
])
@pytest.mark.parametrize("as_json", [False, True])
def test_an_exception_outside_the_error_families_is_a_bug_exit_1(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        bug: Exception, as_json: bool) -> None:
    def cmd_options(args: object) -> int:
        raise bug

    monkeypatch.setattr(_options, "cmd_options", cmd_options)
    argv = ["options", "--workspace", "ws"] + (["--json"] if as_json else [])
    assert _main.main(argv) == 1
    out, err = capsys.readouterr()
    assert "Traceback (most recent call last)" in err and type(bug).__name__ in err
    report = json.loads(out)["error"] if as_json else err.splitlines()[-1]
    assert "bug in vtrm_gate" in report and "please report it" in report
    if as_json:
        assert json.loads(out)["exit"] == 1


@pytest.mark.parametrize("failure,code", [
    (OSError(errno.ENOSPC, "No space left on device", "/ws/state.json"), 2),
    (PermissionError(errno.EACCES, "Permission denied", "/ws"), 2),
    (OSError(errno.EROFS, "Read-only file system"), 2),
    (sqlite3.DatabaseError("file is not a database"), None),  # no result code: made by hand
    (WorkspaceError("state.json: bad"), 2),
    (ConfigError("concurrency must be an integer"), 2),
])
def test_exit_codes_of_io_errors_and_our_families(failure: BaseException,
                                                  code: int | None) -> None:
    assert exit_code(failure) == code


@pytest.mark.parametrize("number", [errno.ENOSPC, errno.EFBIG, errno.EDQUOT])
def test_a_write_that_found_no_room_says_the_disk_may_be_full(number: int) -> None:
    line = _main._one_line(OSError(number, os.strerror(number), "/ws/state.json"))
    assert line.startswith(f"/ws/state.json: {os.strerror(number)}; the disk may be full")
    assert line.endswith("run the same command again")
    assert "disk may be full" not in _main._one_line(
        OSError(errno.EACCES, "Permission denied", "/ws"))


def test_io_error_of_a_real_file_and_a_damaged_database_exit_2(tmp_path) -> None:
    with pytest.raises(OSError) as missing:
        open(tmp_path / "nope.json")  # noqa: SIM115
    assert exit_code(missing.value) == 2
    db = tmp_path / "harness.sqlite"
    db.write_bytes(b"SQLite format 3\x00" + b"\x07" * 4096)
    with pytest.raises(sqlite3.DatabaseError) as damaged, sqlite3.connect(db) as con:
        con.execute("SELECT * FROM sqlite_master")
    assert exit_code(damaged.value) == 2
    with pytest.raises(sqlite3.OperationalError) as bad_sql, sqlite3.connect(":memory:") as c:
        c.execute("SELEC 1")
    assert exit_code(bad_sql.value) is None


def test_a_redis_url_redis_py_refuses_is_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    # redis-py raises a builtin ValueError for a query value it cannot read: the URL is the
    # user's, so it is exit 2 naming it (not a bug report).
    url = "redis://localhost/0?socket_timeout=abc"
    assert _main.main(["cache", "stats", "--url", url]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "invalid Redis URL" in err and "socket_timeout" in err


@pytest.mark.parametrize(("argv", "resumes"), [
    (["step", "--workspace", "ws", "--epoch", "1", "--step", "1"], True),
    (["train", "--workspace", "ws", "--epochs", "1", "--steps-per-epoch", "1"], True),
    (["settle", "--workspace", "ws", "--epoch", "1"], True),
    (["fit", "--workspace", "ws"], False),
    (["replay", "--workspace", "ws", "--epoch", "1", "--step", "1"], False),
    (["export", "--workspace", "ws", "--out", "x"], False),
])
def test_an_interrupt_promises_a_resume_only_where_finished_work_is_kept(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        argv: list[str], resumes: bool) -> None:
    """``vtrm-gate fit --boot 1000000000`` stopped with Ctrl-C said "run the same command
    again to resume (finished work is kept)": a fit keeps nothing, and starts over."""
    from vtrm_gate.cli import _export, _fit, _step, _train

    def interrupted(args: object) -> int:
        raise KeyboardInterrupt

    for module, name in ((_step, "cmd_step"), (_step, "cmd_replay"), (_train, "cmd_train"),
                         (_train, "cmd_settle"), (_fit, "cmd_fit"), (_export, "cmd_export")):
        monkeypatch.setattr(module, name, interrupted)
    assert _main.main(argv) == 130
    err = capsys.readouterr().err.strip()
    assert err.startswith("vtrm-gate: interrupted") and "Traceback" not in err
    assert ("run the same command again to resume (finished work is kept)" in err) is resumes


@pytest.mark.parametrize("encoding", ["ascii", "latin-1"])
def test_output_the_locale_cannot_encode_is_escaped_not_a_bug(tmp_path, encoding):
    """``PYTHONIOENCODING=ascii vtrm-gate step ...`` applied the step, then printing "→"
    raised UnicodeEncodeError: "this is a bug", exit 1, and an empty stdout; ``status``
    failed the same way on any workspace."""
    import subprocess
    import sys

    env = dict(os.environ, PYTHONIOENCODING=encoding)
    run = lambda *a: subprocess.run([sys.executable, "-m", "vtrm_gate", *a],  # noqa: E731
                                    capture_output=True, cwd=tmp_path, env=env, timeout=300)
    assert run("init", "ws", "--seed", "3").returncode == 0
    for args in (("step", "--workspace", "ws", "--epoch", "1", "--step", "1"),
                 ("status", "--workspace", "ws")):
        r = run(*args)
        assert r.returncode == 0 and b"Traceback" not in r.stderr, r.stderr.decode()
        assert b"\\u2192" in r.stdout + r.stderr  # "→", escaped
        r.stdout.decode(encoding)  # all of it in the locale's encoding


@pytest.mark.parametrize("value, tracebacks", [("0", False), ("false", False), ("", False),
                                               ("1", True), ("yes", True)])
def test_vtrm_debug_0_keeps_errors_to_one_line(monkeypatch, capsys, value, tracebacks):
    """``VTRM_DEBUG=0`` turned tracebacks on: any value did."""
    monkeypatch.setenv("VTRM_DEBUG", value)

    def cmd_options(args: object) -> int:
        raise ConfigError("a bad setting")

    monkeypatch.setattr(_options, "cmd_options", cmd_options)
    if tracebacks:
        with pytest.raises(ConfigError):
            _main.main(["options", "--workspace", "ws"])
    else:
        assert _main.main(["options", "--workspace", "ws"]) == 2
        assert capsys.readouterr().err.strip() == "vtrm-gate: error: a bad setting"
