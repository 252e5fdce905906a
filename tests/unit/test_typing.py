"""The typed vocabulary (cronoq.core.vocab) and the option TypedDicts, as a type checker sees
them from user code: `mypy --strict` rejects each mistake in tests/typing_samples/bad.py on
the line marked `# E: <what the error says>` and nothing else, and accepts good.py. Also: the
TypedDicts list exactly the options the functions take, and the vocabulary matches the core."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
from pathlib import Path
from typing import get_args

from cronoq._options import TASK_OPTIONS, RecurringOptions, SubmitOptions
from cronoq.client._client import TaskOptions, task
from cronoq.core import model
from cronoq.core.vocab import DEP_CONDITIONS, STATUSES, TERMINAL_STATUSES, DepCondition

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "tests" / "typing_samples"


def _mypy(path: Path) -> dict[int, list[str]]:
    """mypy --strict's errors in `path`, by line (the project's config, so cronoq is typed)."""
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    errors: dict[int, list[str]] = {}
    for line in done.stdout.splitlines():
        m = re.match(rf"{re.escape(str(path.relative_to(ROOT)))}:(\d+): error: (.*)", line)
        if m:
            errors.setdefault(int(m.group(1)), []).append(m.group(2))
    assert done.returncode == (1 if errors else 0), done.stdout + done.stderr
    return errors


def test_mypy_rejects_each_mistake_with_its_error() -> None:
    path = SAMPLES / "bad.py"
    expected = {
        number: text.split("# E: ", 1)[1].strip()
        for number, text in enumerate(path.read_text().splitlines(), 1)
        if "  # E: " in text
    }
    assert len(expected) == 16
    errors = _mypy(path)
    assert sorted(errors) == sorted(expected), errors
    for number, what in expected.items():
        assert any(what in error for error in errors[number]), (number, errors[number])


def test_mypy_accepts_correct_use() -> None:
    assert _mypy(SAMPLES / "good.py") == {}


def test_the_typed_dicts_list_exactly_the_options() -> None:
    assert SubmitOptions.__optional_keys__ == TASK_OPTIONS
    assert RecurringOptions.__optional_keys__ < TASK_OPTIONS
    assert TaskOptions.__optional_keys__ == set(inspect.signature(task).parameters) - {"payload"}


def test_the_vocabulary_matches_the_core() -> None:
    assert tuple(DEP_CONDITIONS) == get_args(DepCondition)
    assert model.STATUS_NAMES is STATUSES
    assert STATUSES[model.SHED] == "shed" and STATUSES[model.BLOCKED] == "blocked"
    assert frozenset(model.TERMINAL_NAMES) == TERMINAL_STATUSES
