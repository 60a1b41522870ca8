"""One home for each default: the slot count, the reply budgets and the LLM call's timeouts
are written once (in `vtrm_gate._env`) and every signature imports them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from vtrm_gate import _env
from vtrm_gate.cli import main
from vtrm_gate.llm import DEFAULT_MAX_TOKENS, LLMAgent, RetryPolicy
from vtrm_gate.options import EXECUTION_FIELDS, MAX_TOKENS_FIELDS, RunOptions

PKG = Path(__file__).resolve().parents[2] / "vtrm_gate"
GUARDED = {  # a parameter or field of this name may not spell the default as a literal
    "concurrency": {32}, "max_concurrency": {32}, "timeout": {60.0}, "deadline": {180.0},
    "max_total_s": {180.0}, "max_retries": {5}, "max_attempts": {6},
    "socket_timeout": {0.5}, "max_tokens": {512, 64, 2048},
}


def _literal_defaults(tree: ast.Module) -> list[tuple[str, object, int]]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            a = node.args
            pos = a.posonlyargs + a.args
            pairs = list(zip(pos[len(pos) - len(a.defaults):], a.defaults, strict=True))
            pairs += [(p, d) for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True) if d]
            out += [(p.arg, d.value, d.lineno) for p, d in pairs if isinstance(d, ast.Constant)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) \
                and isinstance(node.value, ast.Constant):
            out.append((node.target.id, node.value.value, node.lineno))
    return out


def test_no_signature_writes_a_default_again() -> None:
    """The slot count was a literal ``32`` in 11 signatures: one change had to find them all."""
    found = [f"{path.relative_to(PKG)}:{line} {name}={value!r}"
             for path in sorted(PKG.rglob("*.py")) if "testing" not in path.parts
             for name, value, line in _literal_defaults(ast.parse(path.read_text()))
             if value in GUARDED.get(name, ())]
    assert not found, found


def test_the_defaults_reach_options_agent_and_cli(capsys) -> None:
    assert RunOptions().slots == _env.DEFAULT_CONCURRENCY == 32
    assert RunOptions().max_tokens() == {"think": 512, "answer": 64, "evolve": 2048}
    assert MAX_TOKENS_FIELDS == {"max_tokens_think": 512, "max_tokens_answer": 64,
                                 "max_tokens_evolve": 2048}
    assert DEFAULT_MAX_TOKENS == {"think": 512, "answer": 64}
    o = RunOptions()
    assert (o.timeout, o.deadline, o.max_retries) == (60.0, 180.0, 5)
    assert (RetryPolicy().max_attempts, RetryPolicy().max_total_s) == (6, 180.0)
    assert LLMAgent({}, base_url="http://127.0.0.1:9/v1", model="m").timeout == 60.0
    with pytest.raises(SystemExit):
        main(["step", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for text in ("else 32", "(default 60)", "(default 180)", "(default 5)", "(default 512;",
                 "(default 64;", "(default 2048;"):
        assert text in out, text


def test_execution_is_the_execution_fields_of_the_options() -> None:
    """`EXECUTION_FIELDS` had drifted from `RunOptions.execution` (it listed time_scale)."""
    o = RunOptions(concurrency=4, dispatch="round_robin", timeout=9.0)
    assert tuple(o.execution()) == EXECUTION_FIELDS
    assert o.execution() == {"concurrency": 4, "dispatch": "round_robin",
                             "cancel_after_freeze": True, "past_stop": "cancel",
                             "adaptive": True, "timeout": 9.0, "deadline": 180.0,
                             "max_retries": 5}
    assert RunOptions().execution()["concurrency"] == 32
