"""Jupyter's Stop button in a real ipykernel: a blocking cell (`run_gate_sync`, a workspace's
`train_workspace_sync`) stops its work, as Ctrl-C does in a script, and the next cell runs."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from jupyter_client.manager import KernelManager, start_new_kernel


@dataclass
class Cell:
    """What one executed cell printed, and the error it ended with (its ename, or None)."""

    text: str = ""
    error: str | None = None
    lines: list[str] = field(default_factory=list)


@dataclass
class Kernel:
    km: KernelManager
    kc: object

    def run(self, code: str, *, interrupt_on: str | None = None, after_s: float = 0.0,
            timeout: float = 180.0) -> Cell:
        """Execute ``code``; when its output first holds ``interrupt_on``, wait ``after_s``
        and press Stop (SIGINT to the kernel, as Jupyter does)."""
        msg_id = self.kc.execute(code)
        cell, seen_at, pressed, t0 = Cell(), None, False, time.monotonic()
        while time.monotonic() - t0 < timeout:
            if seen_at is not None and not pressed and time.monotonic() - seen_at >= after_s:
                self.km.interrupt_kernel()
                pressed = True
            try:
                msg = self.kc.get_iopub_msg(timeout=0.05)
            except Exception:  # queue.Empty: nothing yet
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                cell.text += content["text"]
                if interrupt_on and seen_at is None and interrupt_on in cell.text:
                    seen_at = time.monotonic()
            elif kind == "error":
                cell.error = content["ename"]
            elif kind == "status" and content["execution_state"] == "idle":
                cell.lines = cell.text.split()
                return cell
        raise AssertionError(f"the cell did not end in {timeout} s: {cell.text[-500:]}")


@pytest.fixture
def kernel() -> Iterator[Kernel]:
    km, kc = start_new_kernel(kernel_name="python3")
    try:
        yield Kernel(km, kc)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


SLOW_GATE = """
import asyncio, random
from vtrm_gate import GateParams, TypePlan, UnitResult, run_gate_sync
calls = [0]
async def infer(task):
    calls[0] += 1
    if calls[0] == 1:
        print("calling", flush=True)
    await asyncio.sleep(0.2)
    return UnitResult(correct=random.random() < (0.8 if task.arm == "cand" else 0.5), tokens=1)
plans = [TypePlan(f"T{i}", [f"u{j}" for j in range(40)], base_skill="b", cand_skill="c")
         for i in range(4)]
"""
BASELINE = "await asyncio.sleep(0)\nbaseline = len(asyncio.all_tasks())"  # an async cell's tasks



@pytest.mark.slow
def test_stop_during_run_gate_sync_stops_the_gate_and_its_calls(kernel):
    """The Stop button raised KeyboardInterrupt in the cell but left the gate running in the
    kernel's loop: 48 calls at the interrupt, 120 two seconds later (every call an LLM bill)."""
    assert kernel.run(SLOW_GATE).error is None
    assert kernel.run(BASELINE).error is None
    stopped = kernel.run("r = run_gate_sync(plans, infer, GateParams(), concurrency=8)",
                         interrupt_on="calling", after_s=0.5)
    assert stopped.error == "KeyboardInterrupt"
    after = kernel.run("n0 = calls[0]\nawait asyncio.sleep(1.0)\n"
                       "print(n0, calls[0], len(asyncio.all_tasks()) - baseline)")
    n0, n1, extra_tasks = map(int, after.lines)
    assert 8 <= n0 < 4 * 2 * 40, after.text  # it had started, and not finished
    assert n1 == n0 and extra_tasks == 0, after.text  # no call and no task left behind
    again = kernel.run("r = run_gate_sync(plans, infer, GateParams(), concurrency=8)\n"
                       "print(len(r.outcomes), r.aborted is None)")
    assert again.lines == ["4", "True"]


@pytest.mark.slow
def test_stop_on_await_handle_stops_the_launched_gate_and_its_calls(kernel):
    """``await handle`` interrupted stops the gate, as a stopped ``run_gate_sync`` does (an
    asyncio task cancelled with its waiter): a hostile pass asked for the wait alone to
    stop, which would leave a gate billing calls behind a cell that looks stopped."""
    assert kernel.run(SLOW_GATE + "from vtrm_gate import launch").error is None
    assert kernel.run(BASELINE).error is None
    assert kernel.run("h = launch(plans, infer, GateParams(), concurrency=8)").error is None
    stopped = kernel.run("print('waiting', flush=True)\nr = await h", interrupt_on="waiting",
                         after_s=0.5)
    assert stopped.error in ("KeyboardInterrupt", "CancelledError"), stopped.text
    after = kernel.run("n0 = calls[0]\nawait asyncio.sleep(1.0)\n"
                       "print(n0, calls[0], len(asyncio.all_tasks()) - baseline, h.done(), "
                       "h.result().aborted is not None)")
    n0, n1, extra_tasks, done, aborted = after.lines
    assert 8 <= int(n0) < 4 * 2 * 40, after.text
    assert (n1, extra_tasks, done, aborted) == (n0, "0", "True", "True"), after.text


SIM_TRAIN = """
import json, os, tempfile
from vtrm_gate.sim import init_simulated
from vtrm_gate.backends import train_workspace_sync
path = os.path.join(tempfile.mkdtemp(), "ws")
init_simulated(path, heldout_fraction=0.2).close()
def steps_done():
    return len([m for m in os.listdir(os.path.join(path, "manifests")) if m.endswith(".json")])
def on_event(ev):
    if steps_done() == 1:
        print("one step", flush=True)
"""


@pytest.mark.slow
def test_stop_during_a_simulated_training_stops_it_at_once_and_it_resumes(kernel):
    """On the virtual clock the run goes on in a worker thread: the Stop button did nothing
    until all 15 steps had run (15 s here), then raised anyway, discarding the result."""
    assert kernel.run(SIM_TRAIN).error is None
    stopped = kernel.run("train_workspace_sync(path, 3, 5, on_event=on_event)",
                         interrupt_on="one step", after_s=0.2)
    assert stopped.error == "KeyboardInterrupt"
    done = int(kernel.run("print(steps_done())").text)
    assert 1 <= done < 15  # stopped where it was, not after the last step
    resumed = kernel.run("from vtrm_gate.harness import workspace_lock\n"
                         "with workspace_lock(path, 'cell'):  # re-entrant in its worker thread\n"
                         "    run = train_workspace_sync(path, 3, 5)\n"
                         "print(steps_done(), run.summary['done_before'])")
    assert resumed.error is None, resumed.text
    total, done_before = resumed.lines
    assert int(total) == 15 and int(done_before) >= done - 1


@pytest.mark.slow
def test_stop_during_a_sweep_ends_its_workers(kernel):
    """An interrupt of a sweep cancels what is queued and kills the running workers."""
    setup = kernel.run("import multiprocessing, threading, time\n"
                       "from vtrm_gate.sim import sweep_executor, sweep_map\n"
                       "def report(ex):\n"
                       "    print('sweeping on', len(ex._processes), flush=True)\n")
    assert setup.error is None
    stopped = kernel.run("with sweep_executor(workers=2) as ex:\n"
                         "    threading.Timer(1.0, report, (ex,)).start()\n"
                         "    sweep_map(time.sleep, [600, 600, 600], ex)",
                         interrupt_on="sweeping", after_s=0.2, timeout=60)
    assert stopped.error == "KeyboardInterrupt"
    assert stopped.lines == ["sweeping", "on", "2"]
    assert kernel.run("print(len(multiprocessing.active_children()))").lines == ["0"]
