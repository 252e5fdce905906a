"""Task functions (cronoq.App, @app.task) as a type checker sees them from user code: `mypy
--strict` rejects each mistake in tests/typing_samples/app_bad.py on the line marked
`# E: <what the error says>` and nothing else, and accepts app_good.py; pyright (strict, by
the samples' `# pyright: strict`) rejects exactly the same lines, whatever its wording, and
accepts app_good.py (where a task function stands for a wider result type too: results are
covariant). app_good.py also runs, in library mode."""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

from test_typing import ROOT, SAMPLES, _mypy

GOOD = SAMPLES / "app_good.py"
BAD = SAMPLES / "app_bad.py"


def _marked(path: Path, marker: str) -> dict[int, str]:
    """The lines of `path` carrying `marker`, by number, with the text after it."""
    return {
        number: text.split(marker, 1)[1].strip()
        for number, text in enumerate(path.read_text().splitlines(), 1)
        if marker in text
    }


MISTAKES = _marked(BAD, "  # E: ")


@functools.cache
def _mypy_errors(path: Path) -> dict[int, list[str]]:
    return _mypy(path)


@functools.cache
def _pyright(path: Path) -> dict[int, list[str]]:
    """pyright's errors and warnings in `path`, by line (its bundled copy run on the system's
    Node.js; --outputjson also keeps it from asking PyPI for a newer version)."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pyright",
            "--pythonpath",
            sys.executable,
            "--outputjson",
            str(path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYRIGHT_PYTHON_IGNORE_WARNINGS": "1"},
    )
    try:
        report = json.loads(done.stdout)
    except json.JSONDecodeError:
        raise AssertionError(done.stdout + done.stderr) from None
    found: dict[int, list[str]] = {}
    for diagnostic in report["generalDiagnostics"]:
        assert diagnostic["file"] == str(path), diagnostic
        if diagnostic["severity"] in ("error", "warning"):
            line = diagnostic["range"]["start"]["line"] + 1
            found.setdefault(line, []).append(f"{diagnostic['severity']}: {diagnostic['message']}")
    errors = report["summary"]["errorCount"]
    assert done.returncode == (1 if errors else 0), done.stdout + done.stderr
    return found


def test_the_sample_marks_every_mistake() -> None:
    assert len(MISTAKES) == 38


def test_mypy_rejects_each_mistake_with_its_error() -> None:
    errors = _mypy_errors(BAD)
    assert sorted(errors) == sorted(MISTAKES), errors
    for number, what in MISTAKES.items():
        assert any(what in error for error in errors[number]), (number, errors[number])


def test_mypy_accepts_correct_use() -> None:
    assert _mypy_errors(GOOD) == {}


def test_pyright_rejects_each_mistake() -> None:
    errors = _pyright(BAD)
    assert sorted(errors) == sorted(MISTAKES), errors
    assert all(e.startswith("error: ") for found in errors.values() for e in found), errors


def test_pyright_accepts_correct_use() -> None:
    assert _pyright(GOOD) == {}


def test_the_correct_use_runs() -> None:
    spec = importlib.util.spec_from_file_location("cronoq_app_good_sample", GOOD)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # the dataclasses resolve their annotations through it
    try:
        spec.loader.exec_module(module)
        asyncio.run(asyncio.wait_for(module.main(), 30))
    finally:
        del sys.modules[spec.name]
