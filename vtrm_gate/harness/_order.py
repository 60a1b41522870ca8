"""Step order (SPEC amendment): the steps of an epoch run in order, a settled epoch takes no
more steps, and a settlement waits for its epoch's last declared step.

``train.json`` (written by the first `train`) declares the steps per epoch; without it an
epoch's length is open and only gaps and steps after a settlement are refused. Every refusal
is a `StepRefusedError` (CLI exit 2) whose one line names the step and what it skips.
"""

from __future__ import annotations

from typing import Any

from ..errors import StepRefusedError, WorkspaceError, shown
from ._files import _whole, read_json
from ._state import TrainingState
from ._workspace import Workspace

TRAIN_FILE = "train.json"


def train_record(ws: Workspace) -> dict[str, Any] | None:
    """The recorded training configuration (``train.json``), validated: ``{format: 1,
    epochs: integer >= 1, config: {...}}``, else a `WorkspaceError` naming the file and the
    field; None before the first `train`."""
    path = ws.root / TRAIN_FILE
    if not path.is_file():
        return None
    data = read_json(path, ws.root)
    fault = None
    if not isinstance(data, dict):
        fault = f"must be an object {{format, epochs, config}}, got {type(data).__name__}"
    elif data.get("format") != 1:
        fault = f"format must be 1, got {shown(data.get('format'))}"
    elif not _whole(data.get("epochs")) or data["epochs"] < 1:
        fault = f"epochs must be an integer >= 1, got {shown(data.get('epochs'))}"
    elif not isinstance(data.get("config"), dict):
        fault = f"config must be an object, got {type(data.get('config')).__name__}"
    else:
        fault = _config_fault(data["config"])
    if fault:
        raise WorkspaceError(f"{TRAIN_FILE}: {fault}; restore it or start a new workspace")
    return data


def _config_fault(config: dict[str, Any]) -> str | None:
    """What is wrong with the fields of ``config`` a command reads (the others are only
    compared with a new run's, so a damaged one is refused as a change)."""
    n = config.get("steps_per_epoch")
    if "steps_per_epoch" in config and not (isinstance(n, int) and _whole(n) and n >= 1):
        return f"config.steps_per_epoch must be an integer >= 1, got {shown(n)}"
    if "evaluate" in config and not isinstance(config["evaluate"], bool):
        return f"config.evaluate must be true or false, got {shown(config['evaluate'])}"
    return None


def declared_steps(ws: Workspace) -> int | None:
    """Steps per epoch as ``train.json`` declares them (None: not declared)."""
    n = (train_record(ws) or {"config": {}})["config"].get("steps_per_epoch")
    return int(n) if n is not None else None


def _named(last: tuple[int, int] | None) -> str:
    return "none" if last is None else f"e{last[0]} s{last[1]}"


def check_step_order(ws: Workspace, state: TrainingState, epoch: int, step: int) -> None:
    """Refuse a new step (not a re-run of the last applied one) that would skip an unapplied
    earlier step, run in a settled epoch, or pass the declared steps per epoch."""
    here, last = f"step e{epoch} s{step}", state.last_step
    if epoch in state.settled_epochs:
        raise StepRefusedError(f"{here}: epoch {epoch} was settled; its steps can no longer "
                               f"run (the next step is e{epoch + 1} s1)")
    declared = declared_steps(ws)
    if declared is not None and step > declared:
        raise StepRefusedError(f"{here}: {TRAIN_FILE} declares {declared} steps per epoch; "
                               f"the next step after e{epoch} s{declared} is e{epoch + 1} s1")
    if step > 1:
        need, ok = f"e{epoch} s{step - 1}", last == (epoch, step - 1)
    elif epoch == 1:
        need, ok = "nothing", True  # a re-run or an older step was refused before
    elif declared is not None:
        need, ok = f"e{epoch - 1} s{declared}", last == (epoch - 1, declared)
    else:
        need, ok = f"a step of epoch {epoch - 1}", last is not None and last[0] == epoch - 1
    if not ok:
        raise StepRefusedError(f"{here} skips {need}, which was not applied (the last applied "
                               f"step is {_named(last)}); run the steps in order")


def check_settle_order(ws: Workspace, state: TrainingState, epoch: int) -> None:
    """Refuse settling an epoch that has no applied step yet or, when ``train.json`` declares
    the steps per epoch, whose last step is not applied."""
    last, declared = state.last_step, declared_steps(ws)
    if last is None or last[0] < epoch:
        raise StepRefusedError(f"settle e{epoch}: epoch {epoch} has no applied step (the last "
                               f"applied step is {_named(last)})")
    if declared is not None and last < (epoch, declared):
        raise StepRefusedError(f"settle e{epoch}: its last step e{epoch} s{declared} "
                               f"({TRAIN_FILE} declares {declared} per epoch) is not applied "
                               f"(the last applied step is {_named(last)}); settling now "
                               f"would leave that step's bets unsettled")
