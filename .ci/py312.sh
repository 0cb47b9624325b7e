#!/usr/bin/env bash
# The tests of the C entries that let the GIL go in their waits
# (point-to-point, nonblocking calls, the MPI face, errors, pools) under a
# second CPython, 3.12 or later, when this machine has one: from 3.12 the
# allocator reads the thread state, so a Python object made before the GIL
# is back crashes there, where 3.11 ran on unnoticed (940635a).
set -euo pipefail
cd "$(dirname "$0")/.."
py=""
for c in python3.12 python3.13 python3.14; do     # the oldest first: the likeliest to have every wheel
  if command -v "$c" >/dev/null && "$c" -c 'import sys; assert sys.version_info >= (3, 12)' 2>/dev/null; then
    py=$(command -v "$c"); break
  fi
done
if [ -z "$py" ] && command -v pyenv >/dev/null; then
  v=$(pyenv versions --bare 2>/dev/null | grep -E '^3\.1[2-9](\.[0-9]+)?$' | sort -V | head -1 || true)
  if [ -n "$v" ]; then py="$(pyenv root)/versions/$v/bin/python3"; fi
fi
if [ -z "$py" ]; then
  echo "ci: no CPython 3.12 or later on this machine: the second interpreter's tests are skipped" >&2
  exit 0
fi
venv="$(mktemp -d)/venv"
trap 'rm -rf "$(dirname "$venv")"' EXIT
if ! "$py" -m venv "$venv"; then
  echo "ci: $py cannot make a virtualenv (no venv module): the second interpreter's tests are skipped" >&2
  exit 0
fi
"$venv/bin/python" -m pip install -q -e '.[test]'        # builds the C engine for this interpreter, beside 3.11's
echo "ci: $("$venv/bin/python" --version) on tests of the C entries" >&2
"$venv/bin/python" -m pytest -q -p no:cacheprovider tests/test_p2p.py tests/test_nonblocking.py \
  tests/test_mpi_face.py tests/test_mpi_calls.py tests/test_call_base.py tests/test_errors.py tests/test_pool.py \
  tests/test_fork.py tests/test_launcher.py tests/test_interop.py
