"""`World`: the distribution candidate effects are drawn from. The preset ``default`` is the
simulator's original world bit for bit; the other worlds draw every candidate's class from
their shares; a world file is validated like the workspace files."""

from __future__ import annotations

import hashlib
import json
import pickle
import re
from pathlib import Path

import pytest

from vtrm_gate.cli._main import main
from vtrm_gate.errors import ConfigError
from vtrm_gate.harness import Workspace
from vtrm_gate.sim import (
    EFFECT_SIZE,
    PRESETS,
    SimConfig,
    SimEvolver,
    SimWorld,
    World,
    simulated_backend,
)


def _digest(cfg: SimConfig) -> str:
    """Every candidate a 3x5 run could propose (two retries a step), and the fixed effects."""
    w = SimWorld(cfg)
    ev, h = SimEvolver(w), hashlib.sha256()
    for t in w.task_types:
        s = w.initial_skill(t)
        for e in range(3):
            for step in range(5):
                for r in range(2):
                    h.update(ev.propose(t, s, ["x"] * r, e, step).encode())
        h.update(repr(sorted(w.effects.items())).encode())
    return h.hexdigest()[:16]


# Computed on main before worlds existed (commit 7c3e7d9), seeds 0, 2 and 10.
BEFORE_WORLDS = ["0731063ad058ee7d", "89dbc7815080daee", "642d42c5474c80c3"]


@pytest.mark.parametrize("world", [None, "default", World(scope="type")])
def test_the_default_preset_proposes_exactly_the_candidates_of_before(world: object) -> None:
    assert [_digest(SimConfig(seed=s, world=world)) for s in (0, 2, 10)] == BEFORE_WORLDS
    assert (PRESETS["default"].size_min, PRESETS["default"].size_max) == EFFECT_SIZE


def _classes(world: World, n_steps: int = 120) -> list[str]:
    w = SimWorld(SimConfig(seed=4, world=world, no_change_rate=0.0))
    ev = SimEvolver(w)
    out = []
    for t in w.task_types:
        for step in range(n_steps):
            text = ev.propose(t, w.initial_skill(t), [], 1, step)
            out.append(re.search(r"effect=(\w+)", text).group(1))  # type: ignore[union-attr]
    return out


@pytest.mark.parametrize("name", ["mostly_harmful", "mostly_neutral", "mostly_helpful"])
def test_a_per_candidate_world_draws_each_candidates_class_from_its_shares(name: str) -> None:
    """1,440 candidates (12 types x 120): a share's binomial sd is at most 0.013, so 0.04 is
    3 sd; every type mixes classes (a per-type world would give each type one class)."""
    world = PRESETS[name]
    classes = _classes(world)
    for cls, p in zip(("harmful", "neutral", "helpful"), world.shares(), strict=True):
        assert abs(classes.count(cls) / len(classes) - p) < 0.04, (cls, p)
    per_type = [set(classes[i:i + 120]) for i in range(0, len(classes), 120)]
    assert all(len(s) == 3 for s in per_type)


def test_sizes_come_from_the_world_and_per_type_shares_override() -> None:
    world = World(p_harmful=0.0, p_neutral=0.0, p_helpful=1.0, size_min=1.5, size_max=2.0,
                  types={"OCR Problems": {"p_harmful": 1.0, "p_neutral": 0.0,
                                          "p_helpful": 0.0}})
    w = SimWorld(SimConfig(seed=1, world=world, no_change_rate=0.0))
    ev = SimEvolver(w)
    for t in ("OCR Problems", "Counting Problem"):
        for step in range(20):
            a = w.skill_ability(ev.propose(t, w.initial_skill(t), [], 1, step))
            assert 1.5 <= abs(a) <= 2.0 and (a < 0) == (t == "OCR Problems")


def test_a_world_pickles_for_other_processes() -> None:
    """Sweeps send worlds to worker processes (a process pool, a Dask cluster)."""
    for world in (*PRESETS.values(), World(types={"A": {"p_harmful": 1.0, "p_neutral": 0.0,
                                                        "p_helpful": 0.0}})):
        assert pickle.loads(pickle.dumps(world)) == world
        cfg = SimConfig(world=world, pool_sizes={"A": 3})
        assert pickle.loads(pickle.dumps(cfg)) == cfg


def test_a_world_round_trips_through_json(tmp_path: Path) -> None:
    world = World(p_harmful=0.5, p_neutral=0.3, p_helpful=0.2, size_min=0.1, size_max=0.4,
                  types={"OCR Problems": {"p_harmful": 0.1, "p_neutral": 0.1,
                                          "p_helpful": 0.8}})
    path = tmp_path / "w.json"
    world.to_json(path)
    assert json.loads(path.read_text())["effect_scale"] == "logit"
    assert World.from_json(path) == world
    path.write_text('{"p_harmful": 0.6, "p_neutral": 0.3, "p_helpful": 0.1}')
    assert World.from_json(path) == World(p_harmful=0.6, p_neutral=0.3, p_helpful=0.1)
    assert World.from_json(path).size_max == 0.9 and World.from_json(path).scope == "candidate"


@pytest.mark.parametrize(("text", "field"), [
    ('{"p_harmful": 0.6, "p_neutral": 0.3, "p_helpful": 0.2}', "sum to 1"),
    ('{"p_harmful": -0.1, "p_neutral": 0.9, "p_helpful": 0.2}', "p_harmful"),
    ('{"p_harmful": 0.5, "p_neutral": 0.5}', "p_helpful"),
    ('{"size_min": -0.2}', "size_min"),
    ('{"size_min": 0.9, "size_max": 0.3}', "size_min"),
    ('{"size_max": "big"}', "size_max"),
    ('{"scope": "epoch"}', "scope"),
    ('{"p_harmfull": 0.2}', "p_harmfull"),
    ('{"effect_scale": "accuracy"}', "effect_scale"),
    ('{"types": {"OCR Problems": {"p_harmful": 1}}}', "types['OCR Problems']"),
    ('[0.2, 0.3, 0.5]', "JSON object"),
    ('{"p_harmful": 0.2,', "not JSON"),
    ('{"p_harmful": 0.6, "p_neutral": 0.3, "p_helpful": 0.1, "p_harmful": 0.1}',
     "duplicate key 'p_harmful', line 1"),
])
def test_a_bad_world_file_names_the_file_and_the_field(tmp_path: Path, text: str,
                                                       field: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match=re.escape(field)) as err:
        World.from_json(path)
    assert str(path) in str(err.value)


def test_init_world_builds_a_workspace_in_that_world(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "w.json"
    path.write_text('{"p_harmful": 0.7, "p_neutral": 0.2, "p_helpful": 0.1}')
    assert main(["init", str(tmp_path / "ws"), "--seed", "5", "--world", str(path),
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["world"]["p_harmful"] == 0.7
    backend = simulated_backend(tmp_path / "ws")
    assert backend.world.world == World(p_harmful=0.7, p_neutral=0.2, p_helpful=0.1)
    assert backend.world.config.seed == 5 and dict(backend.world.effects) == {}
    assert main(["init", str(tmp_path / "ws2"), "--world", "mostly_helpful"]) == 0
    assert simulated_backend(tmp_path / "ws2").world.world == PRESETS["mostly_helpful"]
    assert main(["init", str(tmp_path / "ws3")]) == 0  # no world: the file is as before
    ws = Workspace.open(tmp_path / "ws3")
    try:
        assert "world" not in ws.config.sim  # type: ignore[operator]
    finally:
        ws.close()


@pytest.mark.parametrize("text", ['{"p_harmful": 0.7, "p_neutral": 0.2, "p_helpful": 0.2}',
                                  '{"size_min": -1}', "nonsense",
                                  '{"types": {"Cooking": {"p_harmful": 1, "p_neutral": 0, '
                                  '"p_helpful": 0}}}'])
def test_init_refuses_a_bad_world_file_and_writes_nothing(
        tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "w.json"
    path.write_text(text)
    assert main(["init", str(tmp_path / "ws"), "--world", str(path)]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "ws").exists()
    assert main(["init", str(tmp_path / "ws"), "--world", str(tmp_path / "none.json")]) == 2
    assert "none.json" in capsys.readouterr().err


def test_a_preset_named_by_a_list_is_refused_naming_the_presets():
    """``World.preset(["x"])`` was "TypeError: unhashable type: 'list'"."""
    from vtrm_gate.errors import ConfigError
    from vtrm_gate.sim import World

    with pytest.raises(ConfigError, match=r"a world preset is named by text, got list; "
                                          r"presets are \['default'"):
        World.preset(["x"])  # type: ignore[arg-type]
