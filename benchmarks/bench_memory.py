"""Memory of a simulated `vtrm-gate train` run, epoch by epoch (issue 29: it grew 11-16 MiB an
epoch): the process's RSS after each epoch's settlement and the dispatch memo's entries.

Run: ``python -m benchmarks.bench_memory [--quick]`` (``init --seed 2``, then ``train --epochs
6 --steps-per-epoch 5`` in this process; ``--quick``: 3 epochs of 2 steps).
"""

from __future__ import annotations

import gc
import tempfile
from pathlib import Path
from typing import Any

from ._common import machine, print_table, run_quick


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    return float("nan")


def train_memory(quick: bool = False) -> list[dict]:
    """RSS (MiB) and dispatch-memo entries after each epoch of one simulated run."""
    from vtrm_gate.cli._main import main as cli
    from vtrm_gate.gate import _dispatch
    from vtrm_gate.harness import _train

    epochs, steps = (3, 2) if quick else (6, 5)
    rows: list[dict[str, Any]] = []
    settle = _train._Run.settle

    async def measured(run: Any, e: int) -> None:
        await settle(run, e)
        gc.collect()
        policy = _dispatch.resolve_dispatch("expected_need")
        tables = {id(t): len(t) for _, _, t in policy._memo.values()}  # type: ignore[attr-defined]
        rows.append({"epoch": e, "rss_mib": _rss_mib(), "memo_tables": len(tables),
                     "memo_entries": sum(tables.values())})

    with tempfile.TemporaryDirectory() as tmp:
        ws = str(Path(tmp) / "ws")
        if cli(["init", "--seed", "2", ws]) != 0:
            raise RuntimeError("vtrm-gate init failed")
        _train._Run.settle = measured  # type: ignore[method-assign]
        try:
            code = cli(["train", "--workspace", ws, "--epochs", str(epochs),
                        "--steps-per-epoch", str(steps), "--json"])
        finally:
            _train._Run.settle = settle  # type: ignore[method-assign]
        if code != 0:
            raise RuntimeError(f"vtrm-gate train exited {code}")
    first = rows[min(1, len(rows) - 1)]["rss_mib"]  # epoch 2 (the first is warm-up)
    for r in rows:
        r["vs epoch 2"] = r["rss_mib"] / first
    return rows


def main(quick: bool = False) -> list[dict]:
    print(f"machine: {machine()}")
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):  # the CLI's JSON lines
        rows = train_memory(quick)
    print_table("vtrm-gate train on a simulated workspace (init --seed 2): RSS after each "
                "epoch's settlement, and the dispatch memo", rows)
    return rows


if __name__ == "__main__":
    run_quick(main)
