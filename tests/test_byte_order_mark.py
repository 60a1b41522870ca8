"""Every file a researcher hands the toolkit may open with a UTF-8 byte order mark: Windows
editors (Notepad before 2019, Excel's "CSV UTF-8", PowerShell 5's ``Out-File``) save one.
Each was refused with "Unexpected UTF-8 BOM" or "Invalid statement (at line 1, column 1)";
now the mark is skipped and the file reads as it does without one."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from vtrm_gate._env import read_dotenv
from vtrm_gate.harness._files import read_json, read_text
from vtrm_gate.llm import read_endpoints_file
from vtrm_gate.options import resolve_options
from vtrm_gate.sim import World

BOM = b"\xef\xbb\xbf"


def _options(name: str) -> Callable[[Path], Any]:
    return lambda p: resolve_options(config=p.rename(p.with_name(name)), env={},
                                     dotenv=None).concurrency


READERS: dict[str, tuple[str, Callable[[Path], Any]]] = {
    "config TOML": ("concurrency = 7\n", _options("c.toml")),
    "config JSON": ('{"concurrency": 7}', _options("c.json")),
    ".env": ("VTRM_CONCURRENCY=7\n", read_dotenv),
    "endpoints lines": ("http://127.0.0.1:9/v1 4\n", read_endpoints_file),
    "endpoints JSON": ('[{"url": "http://127.0.0.1:9/v1", "max_concurrency": 4}]',
                       read_endpoints_file),
    "world JSON": (json.dumps({"p_helpful": 0.2, "p_neutral": 0.5, "p_harmful": 0.3}),
                   lambda p: World.from_json(p)),
    "seed record / JSON file": ('{"u1": true}', read_json),
    "skill file": ("Read the sign first.\n", read_text),
}


@pytest.mark.parametrize("reader", READERS, ids=str)
def test_a_file_that_opens_with_a_byte_order_mark_reads_as_without_one(
        tmp_path: Path, reader: str) -> None:
    text, read = READERS[reader]
    plain, marked = tmp_path / "plain", tmp_path / "marked"
    plain.mkdir()
    marked.mkdir()
    (plain / "f").write_bytes(text.encode())
    (marked / "f").write_bytes(BOM + text.encode())
    assert read(marked / "f") == read(plain / "f")
