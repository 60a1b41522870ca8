"""kill -9 in the middle of a step on a real model: `ToolAgent` (every turn a cached call)
against SmolLM2-135M-Instruct behind llama.cpp's server (one request at a time), through
the CLI, with a recording proxy in front of the server.

Per run: an uninterrupted step in one workspace; the same step in a second workspace,
killed with SIGKILL once half as many requests as the uninterrupted run made have been
answered, then run again. Reported: the re-run's calls and the share served from the
cache, its requests, crash + re-run against the uninterrupted run, and whether the
re-run decided exactly as the uninterrupted run (status, action, W, L, stop rank).

Run: ``python -m benchmarks.bench_real_kill [--quick] [--runs N]`` (needs ``make model``;
not part of ``make bench``, which needs no model).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._common import machine, parser, print_table
from vtrm_gate.testing.llama import MODEL_ALIAS, LlamaServer, RecordingProxy, smollm2_gguf

PLACES = [("France", "Paris"), ("Japan", "Tokyo"), ("Italy", "Rome"), ("Egypt", "Cairo"),
          ("Spain", "Madrid"), ("Kenya", "Nairobi"), ("Peru", "Lima"), ("Chile", "Santiago"),
          ("Norway", "Oslo"), ("Greece", "Athens"), ("Cuba", "Havana"), ("Ghana", "Accra")]


def units() -> list[dict[str, Any]]:
    """One type of 12 capital-city questions, the context in two parts."""
    cities = [c for _, c in PLACES]
    out = []
    for i, (country, city) in enumerate(PLACES):
        others = [c for c in cities if c != city]
        opts = [city, *others[i % 8:i % 8 + 3]]
        opts = opts[i % 4:] + opts[:i % 4]
        out.append({"unit_id": f"capital-{i}", "task_type": "Capital Cities",
                    "question": f"{country} is a country.\n\nWhat is the capital of {country}?",
                    "options": opts, "answer": "ABCD"[opts.index(city)]})
    return out


def cli(args: list[str], cwd: Path, proxy: RecordingProxy) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REDIS_", "VTRM_"))}
    env.update(OPENAI_API_KEY="x", VTRM_BASE_URL=proxy.url, VTRM_MODEL=MODEL_ALIAS,
               VTRM_MAX_TURNS="3", VTRM_TIMEOUT="300")
    return subprocess.Popen([sys.executable, "-m", "vtrm_gate", *args], cwd=cwd, env=env,
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def finish(p: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = p.communicate(timeout=1800)
    if p.returncode != 0:
        raise SystemExit(f"step exited {p.returncode}: {err[-1500:]}")
    return json.loads(out)


def prepare(tmp: Path, name: str, proxy: RecordingProxy) -> list[str]:
    src = tmp / "units.jsonl"
    src.write_text("".join(json.dumps(u) + "\n" for u in units()))
    p = cli(["init", name, "--llm", "--units", str(src), "--backend",
             "vtrm_gate.llm:tool_backend"], tmp, proxy)
    p.communicate(timeout=120)
    return ["step", "--workspace", name, "--epoch", "1", "--step", "1", "--json",
            "--concurrency", "4"]


def decisions(doc: dict[str, Any]) -> dict[str, Any]:
    return {t["task_type"]: (t["status"], t["action"], t.get("W"), t.get("L"),
                             t.get("stop_rank")) for t in doc["types"]}


def one_run(proxy: RecordingProxy) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        start = proxy.mark()
        whole = finish(cli(prepare(tmp, "whole", proxy), tmp, proxy))
        total = proxy.mark() - start
        step = prepare(tmp, "crashed", proxy)
        start = proxy.mark()
        p = cli(step, tmp, proxy)
        while proxy.mark() - start < total // 2 and p.poll() is None:
            time.sleep(0.05)
        p.send_signal(signal.SIGKILL)
        p.wait(30)
        before = proxy.mark() - start
        mid = proxy.mark()
        rerun = finish(cli(step, tmp, proxy))
        sent = proxy.mark() - mid
        runs = rerun["llm_cache"]["runs"].values()
        made = sum(r["calls"] for r in runs)
        served = sum(r["hits"] + r["coalesced"] for r in runs)
        return {"uninterrupted requests": total, "answered before the kill": before,
                "re-run calls": made, "from the cache": f"{served} ({served / made:.0%})",
                "re-run requests": sent,
                "crash + re-run": f"{before + sent} ({(before + sent) / total:.2f}x)",
                "same decisions": decisions(rerun) == decisions(whole)}


def main(quick: bool = False, runs: int | None = None) -> None:
    n = runs or (1 if quick else 3)
    model = smollm2_gguf()
    if model is None:
        raise SystemExit("the model is not installed: make model")
    with tempfile.TemporaryDirectory() as d:
        server = LlamaServer(model, Path(d) / "server.log").start()
        proxy = RecordingProxy(server.url)
        try:
            rows = [{"run": i + 1, **one_run(proxy)} for i in range(n)]
        finally:
            proxy.close()
            server.stop()
    print_table(f"kill -9 mid-step, ToolAgent on SmolLM2-135M ({machine()})", rows)
    print(f"command: python -m benchmarks.bench_real_kill --runs {n}")


if __name__ == "__main__":
    ap = parser()
    ap.add_argument("--runs", type=int, default=None, help="runs (default 3; --quick: 1)")
    a = ap.parse_args()
    main(quick=a.quick, runs=a.runs)
