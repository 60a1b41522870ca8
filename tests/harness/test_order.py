"""Step order (issue 16): an epoch's steps run in order, a settled epoch takes no more steps,
a settlement waits for the epoch's last declared step, and `train` never calls a step that
never ran "done before" nor finishes with a bet on probation."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from vtrm_gate.harness import (
    StepRefusedError,
    TrainRefusedError,
    Workspace,
    run_step,
    settle_probation,
    train,
)
from vtrm_gate.options import RunOptions
from vtrm_gate.sim import SimConfig, init_simulated, run_virtual, simulated_backend

ROOT = Path(__file__).resolve().parents[2]
CONFIG = SimConfig(seed=5, pool_sizes={"Action Reasoning": 90, "OCR Problems": 60},
                   infra_rate=0.0, no_change_rate=0.0,
                   effects={"Action Reasoning": "helpful", "OCR Problems": "neutral"})


@pytest.fixture
def ws(tmp_path):
    return init_simulated(tmp_path / "ws", CONFIG)


def _step(ws: Workspace, epoch: int, step: int):
    be = simulated_backend(ws)
    return run_virtual(run_step(ws, epoch, step, infer=be.infer, evolver=be.evolver,
                                cases=be.cases))


def _settle(ws: Workspace, epoch: int):
    return run_virtual(settle_probation(ws, epoch, infer=simulated_backend(ws).infer))


def _train(ws: Workspace, epochs: int, steps: int, **kw):
    be = simulated_backend(ws)
    return run_virtual(train(ws, epochs, steps, infer=be.infer, evolver=be.evolver,
                             rollout=be.rollout(ws), options=RunOptions(concurrency=8), **kw))


def _untouched(ws: Workspace) -> tuple[str, list[str]]:
    return ((ws.root / "state.json").read_text(),
            sorted(p.name for p in (ws.root / "manifests").glob("*")))


def test_a_step_that_skips_an_unapplied_step_of_its_epoch_is_refused(ws):
    before = _untouched(ws)
    with pytest.raises(StepRefusedError, match=r"^step e1 s3 skips e1 s2, which was not "
                                               r"applied \(the last applied step is none\)"):
        _step(ws, 1, 3)
    assert _untouched(ws) == before  # nothing written: no manifest, no state
    _step(ws, 1, 1)
    _step(ws, 1, 2)
    with pytest.raises(StepRefusedError, match="step e1 s4 skips e1 s3"):
        _step(ws, 1, 4)
    with pytest.raises(StepRefusedError, match=r"step e3 s1 skips a step of epoch 2"):
        _step(ws, 3, 1)
    _step(ws, 1, 3)  # in order: fine
    _step(ws, 1, 3)  # a re-run of the last applied step stays allowed


def test_a_step_after_its_epoch_was_settled_is_refused(ws):
    _step(ws, 1, 1)
    _settle(ws, 1)
    before = _untouched(ws)
    with pytest.raises(StepRefusedError, match="step e1 s2: epoch 1 was settled"):
        _step(ws, 1, 2)
    assert _untouched(ws) == before
    _step(ws, 2, 1)


def test_a_settlement_before_the_epochs_last_declared_step_is_refused(ws):
    _train(ws, 1, 3)  # train.json now declares 3 steps per epoch; e1 is settled
    _step(ws, 2, 1)
    with pytest.raises(StepRefusedError, match=r"settle e2: its last step e2 s3 \(train\.json "
                                               r"declares 3 per epoch\) is not applied"):
        _settle(ws, 2)
    with pytest.raises(StepRefusedError, match="step e3 s1 skips e2 s3"):
        _step(ws, 3, 1)
    with pytest.raises(StepRefusedError, match="declares 3 steps per epoch"):
        _step(ws, 2, 4)
    with pytest.raises(StepRefusedError, match="settle e5: epoch 5 has no applied step"):
        _settle(ws, 5)


def test_train_refuses_steps_that_never_ran_instead_of_calling_them_done(ws):
    _step(ws, 1, 1)
    state = json.loads((ws.root / "state.json").read_text())
    state["last_step"] = [1, 3]  # a workspace whose e1 s2-s3 were skipped (older versions)
    (ws.root / "state.json").write_text(json.dumps(state))
    w = Workspace.open(ws.root)
    lines = []
    with pytest.raises(TrainRefusedError, match=r"step e1 s2 never ran \(no manifest\)"):
        _train(w, 1, 3, on_event=lines.append)
    assert not [ev for ev in lines if "done before" in ev.line and ev.step == 2]


def test_train_refuses_to_stop_short_of_applied_epochs(ws):
    _train(ws, 2, 1)
    with pytest.raises(TrainRefusedError, match="--epochs must be at least 2"):
        _train(ws, 1, 1)


def test_cli_step_out_of_order_exits_2_with_one_line_naming_the_step(ws):
    ws.close()
    r = subprocess.run([sys.executable, "-m", "vtrm_gate", "step", "--workspace", str(ws.root),
                        "--epoch", "1", "--step", "3"], capture_output=True, text=True,
                       cwd=ROOT, timeout=120)
    assert r.returncode == 2, r.stderr
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and "step e1 s3 skips e1 s2" in err[0] and not r.stdout
    assert not list((ws.root / "manifests").glob("*"))
