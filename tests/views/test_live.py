"""The live view: state from real gate events, final table, throttled redraws, watch()."""

from __future__ import annotations

import os

os.environ.setdefault("MPLBACKEND", "Agg")

import asyncio
import random

import pytest

from vtrm_gate import GateParams, PrefixAdvanced, launch, run_gate
from vtrm_gate.testing import OutcomeTable
from vtrm_gate.views import LiveGateView, outcomes_frame, show_live, watch

WIN, LOSS, TIE, BOTH_WRONG = (False, True), (True, False), (True, True), (False, False)


def _table(seed: int = 0, n_types: int = 5) -> OutcomeTable:
    rng = random.Random(seed)
    outcomes = {f"type-{i}": [rng.choice([WIN, WIN, LOSS, TIE, BOTH_WRONG])
                              if rng.random() > 0.03 else None
                              for _ in range(rng.randint(9, 40))]
                for i in range(n_types)}
    outcomes["type-empty"] = []
    # wrong answers are slower: results arrive out of ladder order
    return OutcomeTable(outcomes, latency=lambda task, res: rng.uniform(0, 0.002)
                        + (0.003 if not res.correct else 0.0))


def test_headless_view_ends_with_the_gate_decision_table():
    table = _table(1)
    view = LiveGateView()
    result = asyncio.run(run_gate(table.plans(), table, GateParams(), concurrency=8,
                                  subscribers=[view]))
    assert view.table().equals(outcomes_frame(result.outcomes))
    assert view.redraws == 0  # never displayed: state only
    assert view.finished and "finished" in view.status()


def test_progress_matches_the_outcomes_and_nothing_is_left_in_flight():
    table = _table(2)
    view = LiveGateView()
    result = asyncio.run(run_gate(table.plans(), table, concurrency=6, subscribers=[view]))
    prog = view.progress()
    for r in prog.iter_rows(named=True):
        o = result.outcomes[r["task_type"]]
        assert (r["consumed"], r["n_ladder"], r["W"], r["L"], r["action"]) == (
            o.n_consumed, o.n_ladder, o.W, o.L, str(o.action))
        assert r["in_flight"] == 0
        assert r["started"] == result.counters[r["task_type"]].started
    assert view.in_flight == 0


def test_figure_on_demand_has_one_trajectory_per_type():
    table = _table(3)
    view = LiveGateView()
    asyncio.run(run_gate(table.plans(), table, subscribers=[view]))
    ax = view.figure(layout="overview").axes[0]
    lines = [ln for ln in ax.get_lines() if (ln.get_gid() or "").startswith("trajectory:")]
    assert len(lines) == len(table.outcomes)
    assert any(ln.get_gid() == "e_confirm" for ln in ax.get_lines())
    panels = view.figure().axes
    visible = [a for a in panels if a.get_visible()]
    assert len(visible) == len(table.outcomes)
    gids = {ln.get_gid() for a in visible for ln in a.get_lines()}
    assert {"e_confirm", "e_provisional"} <= gids
    assert {f"e_minus:{t}" for t in table.outcomes} <= gids


class _FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_redraws_are_throttled_to_min_interval():
    table = _table(4)
    events: list = []
    asyncio.run(run_gate(table.plans(), table, subscribers=[events.append]))
    clock = _FakeClock()
    view = LiveGateView(min_interval=0.5, clock=clock, threaded=False)
    _ = view.widget  # turns live drawing on (works without a kernel)
    span = 2.0  # every event of the gate arrives within 2 s of fake time
    for i, ev in enumerate(events):
        clock.now = span * i / len(events)
        view(ev)
    assert len(events) > 100
    # initial draw + at most one per interval + the final one
    assert view.redraws <= 1 + span / 0.5 + 1
    assert view.redraws >= 3
    assert view.widget.children[2].value[:8] == b"\x89PNG\r\n\x1a\n"
    final = view.widget.children[3].value
    assert "ACCEPT" in final or "INERTIA" in final


def test_threaded_live_redraw_never_exceeds_the_rate_and_lands_the_final_frame():
    table = _table(5)
    view = LiveGateView(min_interval=0.2)
    _ = view.widget

    async def main():
        result = await run_gate(table.plans(), table, concurrency=4, subscribers=[view])
        await view.drain()
        return result

    # The rate itself is asserted on a fake clock (test_redraws_are_throttled_to_min_interval);
    # here: threaded rendering keeps up and the final frame lands.
    result = asyncio.run(main())
    assert view.redraws >= 1
    assert view.widget.children[2].value[:4] == b"\x89PNG"
    assert view.table().equals(outcomes_frame(result.outcomes))
    assert "<table" in view.widget.children[3].value


def test_watch_follows_a_launched_handle():
    table = _table(6)

    async def main():
        handle = launch(table.plans(), table, GateParams(), concurrency=8)
        view = LiveGateView()
        result = await watch(handle, view)
        return result, view

    result, view = asyncio.run(main())
    assert view.source is not None
    assert view.table().equals(outcomes_frame(result.outcomes))


def test_show_live_subscribes_once_even_when_watched():
    table = _table(7)

    async def main():
        handle, view = show_live(table.plans(), table, display=False, concurrency=8)
        result = await watch(handle, view)
        return handle, result, view

    handle, result, view = asyncio.run(main())
    n_prefix = sum(isinstance(ev, PrefixAdvanced) for ev in handle.history)
    assert sum(len(tp.steps) for tp in view.types.values()) == n_prefix
    assert view.events_seen == len(handle.history)
    assert view.table().equals(outcomes_frame(result.outcomes))


def test_show_live_outside_jupyter_runs_headless_and_says_so(capsys):
    """In a script show_live ended in "AttributeError: 'NoneType' object has no attribute
    'update'" when the gate finished (no front end gives a display handle), after IPython's
    display had printed the widget's repr."""
    table = _table(6)

    async def main():
        handle, view = show_live(table.plans(), table, concurrency=8)
        return await watch(handle, view), view

    with pytest.warns(UserWarning, match=r"^show_live: no Jupyter front end here"):
        result, view = asyncio.run(main())
    assert view.table().equals(outcomes_frame(result.outcomes))
    assert capsys.readouterr().out == ""


def test_aborted_gate_is_shown_as_aborted():
    table = OutcomeTable({"flaky": [None] * 12 + [WIN] * 10})
    view = LiveGateView()

    async def main():
        await run_gate(table.plans(), table, subscribers=[view])

    with pytest.raises(RuntimeError, match="INFRA guard"):
        asyncio.run(main())
    assert view.aborted and "aborted" in view.status()
    assert view.in_flight == 0


def test_invalid_interval_is_refused():
    with pytest.raises(ValueError, match="min_interval"):
        LiveGateView(min_interval=-1)


def test_a_second_launch_is_served_from_redis(redis_target):
    """The README's one line (`cached_infer`) puts a launched gate under the response cache."""
    from vtrm_gate.cache import ResponseCache, cached_infer
    from vtrm_gate.sim import sim_step

    # no sleeping, no INFRA (INFRA is never cached, so it would be paid again)
    step = sim_step(2, wall_seconds=None, time_scale=0.0, infra_rate=0.0)
    plans = list(step.plans)[:3]

    async def launch_once():
        paid: set[tuple[str, str, str]] = set()  # (type, unit, arm) that reached the backend
        answered: set[tuple[str, str, str]] = set()  # ... and came back (not cancelled)

        async def backend(task):
            paid.add((task.task_type, task.unit_id, task.arm))
            res = await step.infer(task)
            answered.add((task.task_type, task.unit_id, task.arm))
            return res

        cache = ResponseCache(redis_target.url, prefix=redis_target.prefix)
        infer = cached_infer(cache, backend, model="sim-agent", prompt=step.world.prompt,
                             grade=step.world.grade)
        handle, view = show_live(plans, infer, display=False, concurrency=8)
        result = await watch(handle, view)
        stats = cache.stats()
        await cache.aclose()
        return result, paid, answered, stats

    first, paid1, answered1, _ = asyncio.run(launch_once())
    second, paid2, _, stats2 = asyncio.run(launch_once())
    # every started call reached the backend, but for one cancelled past a stop while it was
    # still in its cache lookup (under load this happens: 216 of 218 once)
    started = first.total("started")
    assert 0 < len(paid1) <= started
    assert started - len(paid1) <= first.total("cancelled_in_flight")
    # Everything the first launch got back is served from Redis. Which calls start past a
    # type's stop depends on completion order (cache hits return sooner than the backend did),
    # so the second launch may start a few the first never did or cancelled past a stop: only
    # those reach the backend.
    assert paid2.isdisjoint(answered1)
    assert len(paid2 & paid1) <= first.total("cancelled_in_flight")
    # every call the second launch started was a hit or reached the backend, but for one
    # cancelled past a stop inside its cache lookup (a clean-clone run: 216 hits of 218)
    unserved = second.total("started") - len(paid2) - stats2.hits
    assert stats2.hits > 0 and 0 <= unserved <= second.total("cancelled_in_flight")
    assert len(paid2) <= 8 * len(plans)  # at most a slot pool of speculation per type
    assert second.decisions() == first.decisions()


def test_status_table_and_figure_of_a_frame_come_from_one_snapshot():
    table = _table(8)
    events: list = []
    asyncio.run(run_gate(table.plans(), table, concurrency=4, subscribers=[events.append]))
    clock = _FakeClock()
    view = LiveGateView(min_interval=20.0, clock=clock, threaded=False)
    _ = view.widget
    glyphs = ("▲", "◆", "●", "✖", "▼")
    frames = 0
    for i, ev in enumerate(events):
        clock.now = 0.1 * i
        view(ev)
        if view.redraws == frames:
            continue  # no new frame: the widgets still show the previous snapshot
        frames = view.redraws
        status = view._widgets["status"].value
        decided = int(status.split(": ")[1].split("/")[0])
        shown = sum(view._widgets["table"].value.count(g) for g in glyphs)
        assert decided == shown, (i, status)
        assert view._widgets["bar"].value == sum(tp.consumed for tp in view.types.values())
    rows = view._widgets["table"].value.count("<tr>") - 1
    assert rows == len(table.outcomes)  # every type listed, none hidden


def test_the_status_line_is_shown_once_and_the_figure_title_states_the_decisions():
    # Was: the status line in the widget, again atop the final table and as the figure's
    # title (three times).
    table = _table(8)
    events: list = []
    asyncio.run(run_gate(table.plans(), table, concurrency=4, subscribers=[events.append]))
    view = LiveGateView(threaded=False)
    _ = view.widget
    for ev in events:
        view(ev)
    status = view.status()
    shown = view._widgets["status"].value + view._widgets["table"].value
    assert shown.count(status.split(" · ")[0]) == 1
    title = view.figure()._suptitle.get_text()
    assert title.startswith(f"All {len(table.outcomes)} types decided") and status not in title
    assert "unit " in view._widgets["table"].value  # stopped at "unit k of n", 1-based
    for o in view.result.outcomes.values():
        if o.stop_rank is not None:
            assert f"unit {o.stop_rank + 1} of {o.n_ladder}" in view._widgets["table"].value


def _half_way() -> tuple[LiveGateView, list]:
    """A view fed the first half of the simulated step of seed 2 (virtual clock), and every
    event of that step."""
    from vtrm_gate.sim import run_virtual, sim_step

    step = sim_step(2, wall_seconds=None)
    events: list = []
    run_virtual(run_gate(list(step.plans), step.world.infer, GateParams(), 32,
                         subscribers=[events.append]))
    view = LiveGateView()
    for ev in events[: len(events) // 2]:
        view.update(ev)
    return view, events


def test_while_running_the_view_forecasts_each_type_and_the_eta():
    view, events = _half_way()
    snap = view.snapshot()
    assert snap.forecast is not None and snap.forecast.eta_s > 0
    assert "ETA ~" in snap.status_line and "(forecast)" in view.status()
    undecided = {r["task_type"] for r in snap.rows if r["action"] == "CONTINUE"}
    assert set(snap.forecast.types) == undecided
    for f in snap.forecast.types.values():
        assert sum(f.oc.probabilities().values()) == pytest.approx(1.0)
    titles = " ".join(ax.get_title(loc="left") for ax in view.figure().axes)
    assert titles.count("→ ") == len(undecided)
    assert "A forecast, not a guarantee" in view.progress_html()
    for ev in events[len(events) // 2:]:
        view.update(ev)
    assert view.snapshot().forecast is None and "ETA" not in view.status()


def test_taking_a_snapshot_computes_no_forecast_on_the_event_loop():
    """The exact recursions (~10-25 ms per type state) run where the snapshot's forecast is
    first read: the render thread, not the loop that takes the snapshot."""
    view, _ = _half_way()
    snap = view.snapshot()
    assert snap.forecast_input is not None and not view.forecaster.memo._table
    assert snap.forecast is not None and len(view.forecaster.memo._table) == len(
        snap.forecast.types)


def test_a_view_without_call_events_shows_the_same_trajectories_and_no_call_counts(
        monkeypatch):
    """``calls=False``: the gate builds no per-call event for the view (it declares none),
    and the view shows what it knows (trajectories, decisions), not zeros for the rest."""
    table = _table(3)
    full, light = LiveGateView(), LiveGateView(calls=False)
    result = asyncio.run(run_gate(table.plans(), table, GateParams(), concurrency=8,
                                  subscribers=[full, light]))
    assert light.series() == full.series()
    assert light.table().equals(outcomes_frame(result.outcomes))
    assert light.events_seen == full.events_seen - 2 * result.total("started") \
        - result.total("cache_hits")
    prog = light.progress()
    assert prog["in_flight"].null_count() == prog["started"].null_count() == prog.height
    assert "calls in flight" in full.status() and "calls in flight" not in light.status()
    assert ">—</td>" in light.progress_html() and ">—</td>" not in full.progress_html()
    # alone, it asks the gate for no per-call event at all
    from vtrm_gate.gate import _events

    built: list[str] = []
    publish = _events._Bus.publish
    monkeypatch.setattr(_events._Bus, "publish", lambda bus, ev: (
        built.append(type(ev).__name__), publish(bus, ev))[1])
    table = _table(3)
    asyncio.run(run_gate(table.plans(), table, GateParams(), concurrency=8,
                         subscribers=[LiveGateView(calls=False)]))
    assert built and not {"TaskStarted", "TaskFinished"} & set(built)
    asyncio.run(run_gate(table.plans(), table, GateParams(), concurrency=8,
                         subscribers=[LiveGateView()]))
    assert built.count("TaskStarted") > 0


def test_the_first_frame_is_the_plan_not_a_broken_image_or_an_empty_figure():
    """Before the gate's first event the widget showed an empty image (a broken-image icon
    in the browser) and then a figure of "0/0 types"; now it shows the plan."""
    table = _table(8)
    plans = table.plans()
    view = LiveGateView(threaded=False).expect(plans)
    box = view.widget
    status, image = box.children[0], box.children[2]
    assert image.layout.display == "none" and image.value == b"" and view.redraws == 0
    n = sum(len(p.units) for p in plans)
    assert f"gate starting: {len(plans)} types, {n} ladder units" in status.value
    assert all(p.task_type in status.value for p in plans)
    events: list = []
    asyncio.run(run_gate(plans, table, subscribers=[events.append]))
    view(events[0])  # GateStarted: the types and their ladders, drawn
    assert image.layout.display is None and image.value[:4] == b"\x89PNG"
    assert f"0/{len(plans)} types decided" in status.value and "0/0" not in status.value


def test_forecast_titles_fit_their_panels_at_1280_px():
    """Each running type's forecast under its panel title ran up to 26 px into the next
    panel ("forecast: PROVISIONAL 44%, ~20 to go")."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    view, _ = _half_way()
    fig = view.figure()
    assert tuple(fig.get_size_inches() * fig.dpi) == (1280, 720)
    FigureCanvasAgg(fig).draw()
    renderer = fig.canvas.get_renderer()
    titled = [ax for ax in fig.axes if ax.get_visible() and "→" in ax.get_title(loc="left")]
    assert len(titled) == len(view.snapshot().forecast.types) == 12
    for ax in titled:
        over = (ax._left_title.get_window_extent(renderer).x1
                - ax.get_window_extent(renderer).x1)
        assert over <= 0, (ax.get_title(loc="left"), over)
    assert "likeliest exit (forecast)" in fig._suptitle.get_text()


def test_the_progress_tables_last_column_wraps_instead_of_being_cut():
    view, _ = _half_way()
    html_text = view.progress_html()
    head = html_text.split("</thead>")[0]
    assert "white-space:normal;min-width:12em'>decision / forecast</th>" in head
    assert "consumed / ladder" not in head  # the widest header, now "units"
