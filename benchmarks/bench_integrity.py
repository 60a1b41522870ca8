"""What ``PRAGMA quick_check`` costs: `train` runs it on ``harness.sqlite`` before its first
step, and every writer after an unclean stop (docs/training.md). A log of ~1 GB (predictions
and traces rows of ~1.6 kB, as an LLM run writes them) is built once in a temporary
directory, then checked: cold (first read after the file was written and synced) and warm
(medians of 3), next to a plain sequential read of the file. Run:
``python -m benchmarks.bench_integrity [--quick]`` (--quick: ~100 MB).
"""

from __future__ import annotations

import os
import random
import tempfile
import time
from pathlib import Path

from vtrm_gate.harness import HarnessLog

from ._common import machine, median_time, print_table, run_quick

TRACE = 1500  # bytes of trace JSON per call


def build(path: Path, target_bytes: int) -> int:
    """Fill a HarnessLog with prediction and trace rows until the file reaches the size."""
    rng = random.Random(7)
    log = HarnessLog(path)
    rows = 0
    try:
        while path.stat().st_size < target_bytes:
            preds, traces = [], []
            for _ in range(5000):
                run, unit = f"e{rows // 50000 + 1}_s1_gate_t{rows % 12}_base", f"u{rows:08d}"
                preds.append((run, unit, f"type {rows % 12}", "base", 1, 1, rows % 40,
                              "h" * 64, "B", rows % 2, 0, 0, 0, 1.5, 900, None))
                traces.append((run, unit, f"type {rows % 12}", "base", 1, 1,
                               '{"steps": "' + rng.randbytes(TRACE // 2).hex() + '"}'))
                rows += 1
            with log.transaction() as cur:
                log.upsert("predictions", preds, cur)
                log.upsert("traces", traces, cur)
        log.query("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        log.close()
    return rows


def read_file(path: Path) -> int:
    n = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            n += len(chunk)
    return n


def main(quick: bool = False) -> list[dict]:
    print(f"machine: {machine()}")
    target = (100 if quick else 1024) << 20
    with tempfile.TemporaryDirectory(prefix="bench-integrity-") as tmp:
        db = Path(tmp) / "harness.sqlite"
        t0 = time.perf_counter()
        rows = build(db, target)
        built = time.perf_counter() - t0
        size = db.stat().st_size
        os.sync()
        log = HarnessLog(db)
        try:
            t = time.perf_counter()
            log.quick_check()
            cold = time.perf_counter() - t
            warm, _ = median_time(log.quick_check, 3)
        finally:
            log.close()
        plain, _ = median_time(lambda: read_file(db), 3)
    out = [{"log_MB": size / 2**20, "rows": rows, "build_s": built,
            "quick_check_cold_s": cold, "quick_check_warm_s": warm,
            "read_file_s": plain, "s_per_GB_warm": warm / (size / 2**30)}]
    print_table("PRAGMA quick_check on a HarnessLog", out)
    return out


if __name__ == "__main__":
    run_quick(main)
