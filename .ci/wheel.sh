#!/usr/bin/env bash
# CI: build a wheel, install it (with its dependencies, from pip's index)
# into a fresh virtualenv outside the source tree, and run the smoke test of
# every collective from a directory outside the tree, so nothing of the
# checkout (sources, in-place extensions, the editable install) can stand in
# for what the wheel lacks.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/shmcoll-wheel.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

# The wheel, built from the tree's files as git sees them (tracked or not
# ignored), so no build/ leftovers of an earlier build can slip into it.
mkdir "$WORK/src" "$WORK/dist" "$WORK/run"
if git -C "$ROOT" rev-parse --git-dir >/dev/null 2>&1; then
  (cd "$ROOT" && git ls-files -z --cached --others --exclude-standard |
     while IFS= read -r -d '' f; do [[ -e $f ]] && printf '%s\0' "$f"; done |
     tar --null -T - -cf - | tar -xf - -C "$WORK/src")
else
  cp -a "$ROOT/." "$WORK/src"
fi
(cd "$WORK/src" && "$PY" -m pip wheel . -w "$WORK/dist" --no-deps -q)
WHEEL=$(ls "$WORK"/dist/shmcoll-*.whl)
echo "built $(basename "$WHEEL")"

"$PY" -m venv "$WORK/venv"
"$WORK/venv/bin/python" -m pip install -q "$WHEEL"

cd "$WORK/run"
env -u PYTHONPATH -u PYTHONHOME "$WORK/venv/bin/python" "$ROOT/.ci/wheel_smoke.py"
