"""``vtrm-gate init --llm`` honours every flag its ``--help`` lists: each one either lands in
the new workspace or is refused (exit 2, one line naming it) when it does not apply; a new
flag without a row here fails `test_every_init_flag_has_a_check`."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.llm.test_backends import write_units
from vtrm_gate.cli._main import build_parser, main
from vtrm_gate.harness import Workspace, read_heldout

Check = Callable[[Workspace, Path], None]


def _skills(tmp: Path) -> str:
    d = tmp / "skills"
    d.mkdir(exist_ok=True)
    for slug in ("action-reasoning", "counting-problem", "ocr-problems", "object-recognition"):
        (d / f"{slug}.md").write_text(f"# {slug} from the skills directory\n")
    return str(d)


def _seed_record(tmp: Path) -> str:
    p = tmp / "seed.json"
    p.write_text(json.dumps({"action-00": False, "action-01": True}))
    return str(p)


def _endpoints(tmp: Path) -> str:
    p = tmp / "endpoints.txt"
    p.write_text("http://127.0.0.1:9/v1 4\nhttp://127.0.0.1:10/v1 2\n")
    return str(p)


def factory(ctx: Any) -> Any:
    """A factory ``--backend`` can name (init imports it; nothing here calls it)."""
    raise NotImplementedError


def _agent(ws: Workspace) -> dict[str, Any]:
    return dict(ws.config.agent)


# flag -> (its value, given the tmp dir; what the workspace shows), or "refused" for a flag
# that does not apply to an llm workspace.
APPLIED: dict[str, tuple[Callable[[Path], str | None], Check]] = {
    "--seed": (lambda t: "7", lambda ws, t: _check(ws.config.seed == 7)),
    "--heldout-fraction": (lambda t: "0.3", lambda ws, t: _check(
        {k: len(v) for k, v in read_heldout(ws).items()}
        == {"Action Reasoning": 9, "Counting Problem": 3, "OCR Problems": 2,
            "Object Recognition": 3}
        and all(not set(v) & set(ws.pool[k]) for k, v in read_heldout(ws).items()))),
    "--probation-rule": (lambda t: "e_harm",
                         lambda ws, t: _check(ws.config.probation_rule == "e_harm")),
    "--probation-order": (lambda t: "seed_wrong_first", lambda ws, t: _check(
        ws.config.probation_order == "seed_wrong_first")),
    "--cooldown-steps": (lambda t: "3", lambda ws, t: _check(ws.config.cooldown_steps == 3)),
    "--futile-cooldown": (lambda t: None, lambda ws, t: _check(ws.config.futile_cooldown)),
    "--no-futile-cooldown": (lambda t: None,
                             lambda ws, t: _check(ws.config.futile_cooldown is False)),
    "--llm": (lambda t: None, lambda ws, t: _check(ws.config.kind == "llm")),
    "--units": (lambda t: "", lambda ws, t: _check(len(ws.units) == 61)),
    "--base-url": (lambda t: "", lambda ws, t: _check(
        _agent(ws)["base_url"] == "http://127.0.0.1:9/v1")),
    "--endpoints": (_endpoints, lambda ws, t: _check(
        _agent(ws)["endpoints_file"] == str((t / "endpoints.txt").resolve()))),
    "--model": (lambda t: "", lambda ws, t: _check(_agent(ws)["model"] == "m1")),
    "--skills": (_skills, lambda ws, t: _check(
        ws.skill_text("OCR Problems") == "# ocr-problems from the skills directory\n")),
    "--seed-record": (_seed_record, lambda ws, t: _check(
        ws.seed_record == {"Action Reasoning": {"action-00": False, "action-01": True}})),
    "--max-frames": (lambda t: "3", lambda ws, t: _check(
        _agent(ws).get("media", {}).get("max_frames") == 3)),
    "--max-side": (lambda t: "256", lambda ws, t: _check(
        _agent(ws).get("media", {}).get("max_side") == 256)),
    "--task-description": (lambda t: "multiple-choice questions about a chest X-ray",
                           lambda ws, t: _check(
        _agent(ws)["task_description"] == "multiple-choice questions about a chest X-ray"
        and "about a chest X-ray; this skill" in ws.skill_text("OCR Problems"))),
    "--backend": (lambda t: "tests.cli.test_init_flags:factory", lambda ws, t: _check(
        _agent(ws)["backend"] == "tests.cli.test_init_flags:factory")),
    "--json": (lambda t: None, lambda ws, t: None),
}
REFUSED = {"--infra-rate": "0.1", "--world": "mostly_harmful"}
NOT_FLAGS = {"-h", "--help"}


def _check(ok: bool) -> None:
    assert ok


def _init_actions() -> list[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    init = sub.choices["init"]  # type: ignore[attr-defined]
    return [s for a in init._actions for s in a.option_strings if s.startswith("--")]


def _init_helps() -> dict[str, str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    init = sub.choices["init"]  # type: ignore[attr-defined]
    return {s: a.help or "" for a in init._actions for s in a.option_strings}


def test_every_init_flag_has_a_check() -> None:
    flags = set(_init_actions()) - NOT_FLAGS
    assert flags == set(APPLIED) | set(REFUSED)


BASE = ("--units", "--base-url", "--model", "--llm")


@pytest.mark.parametrize("flag", sorted(set(APPLIED) - set(BASE)))
def test_init_llm_honours_the_flag(tmp_path: Path, flag: str,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    units = write_units(tmp_path / "units.jsonl")
    value, check = APPLIED[flag]
    args = ["init", str(tmp_path / "ws"), "--llm", "--units", str(units)]
    if flag in ("--backend", "--endpoints"):
        args += ["--model", "m1"]
    else:
        args += ["--base-url", "http://127.0.0.1:9/v1", "--model", "m1"]
    v = value(tmp_path)
    args += [flag] if v is None else [flag, v]
    if flag in ("--max-frames", "--max-side"):
        units.write_text(units.read_text().replace(
            '"video_id": "v0"}', '"video_id": "v0", "media": {"video": "https://x/v.mp4"}}',
            1))
    assert main(args) == 0, capsys.readouterr().err
    ws = Workspace.open(tmp_path / "ws")
    try:
        check(ws, tmp_path)
        for base in BASE:  # the flags every llm workspace is made with
            if base != "--base-url" or flag not in ("--backend", "--endpoints"):
                APPLIED[base][1](ws, tmp_path)
    finally:
        ws.close()


@pytest.mark.parametrize("flag", sorted(REFUSED))
def test_init_llm_refuses_a_flag_that_does_not_apply(tmp_path: Path, flag: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    units = write_units(tmp_path / "units.jsonl")
    code = main(["init", str(tmp_path / "ws"), "--llm", "--units", str(units), "--base-url",
                 "http://127.0.0.1:9/v1", "--model", "m1", flag, REFUSED[flag]])
    err = capsys.readouterr().err
    assert code == 2 and flag in err and err.count("\n") == 1
    assert not (tmp_path / "ws").exists()


def test_init_llm_defaults_follow_the_help(tmp_path: Path) -> None:
    units = write_units(tmp_path / "units.jsonl")
    assert main(["init", str(tmp_path / "ws"), "--llm", "--units", str(units), "--base-url",
                 "http://127.0.0.1:9/v1", "--model", "m1"]) == 0
    helps = _init_helps()
    assert "default e_continue" in helps["--probation-rule"]
    assert "0 with --llm" in helps["--heldout-fraction"]
    ws = Workspace.open(tmp_path / "ws")
    try:
        assert ws.config.probation_rule == "e_continue"  # --help: default e_continue
        assert read_heldout(ws) == {}  # --help: default 0 for --llm
    finally:
        ws.close()


def test_the_dispatch_flag_offers_the_gates_policies_and_names_its_default() -> None:
    """The CLI spells the names out (its --help imports no numpy); they must stay the gate's."""
    from vtrm_gate.gate import DEFAULT_DISPATCH, DISPATCH_NAMES

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for command in ("step", "train"):
        flag = next(a for a in sub.choices[command]._actions  # type: ignore[attr-defined]
                    if "--dispatch" in a.option_strings)
        assert tuple(flag.choices) == DISPATCH_NAMES
        assert f"default: config, {DEFAULT_DISPATCH};" in flag.help


def test_a_simulated_workspace_takes_the_cooldown_flags_and_refuses_a_negative_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["init", str(tmp_path / "ws"), "--no-futile-cooldown",
                 "--cooldown-steps", "1"]) == 0
    ws = Workspace.open(tmp_path / "ws")
    assert (ws.config.futile_cooldown, ws.config.cooldown_steps) == (False, 1)
    ws.close()
    assert main(["init", str(tmp_path / "ws2")]) == 0  # the SPEC's defaults
    ws = Workspace.open(tmp_path / "ws2")
    assert (ws.config.futile_cooldown, ws.config.cooldown_steps) == (True, 2)
    ws.close()
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(["init", str(tmp_path / "ws3"), "--cooldown-steps", "-1"])
    assert exc.value.code == 2 and "--cooldown-steps" in capsys.readouterr().err
    assert not (tmp_path / "ws3").exists()
