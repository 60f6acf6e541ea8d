#!/usr/bin/env bash
# Idempotent setup: Debian packages when absent, .venv, the locked Python environment.
# Usage: .ci/setup.sh [demo|test]   ("test" adds slurm-wlm, munge and LaTeX;
# the Python packages are the same for both: requirements.lock)
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-demo}
PY=${PYTHON:-python3}

debs="pkg-config libopencv-dev libturbojpeg0-dev g++"
[ "$what" = test ] && debs="$debs slurm-wlm munge texlive-latex-base texlive-latex-recommended"
missing=""
for p in $debs; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  echo "[setup] installing Debian packages:$missing"
  if [ "$(id -u)" != 0 ]; then echo "[setup] need root for apt-get install$missing" >&2; exit 1; fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi

# VENV: where to build it (default .venv; e.g. VENV=/tmp/env to try the lock in a fresh one)
VENV=${VENV:-.venv}
[ -x "$VENV/bin/python" ] || { echo "[setup] creating $VENV"; "$PY" -m venv "$VENV"; }

# One environment, locked: requirements.lock pins every package (transitive ones too) with its
# sha256 hashes, for the runtime (requirements.txt) and the test tools (requirements-test.txt).
LOCK=requirements.lock
stamp="$VENV/.installed-$(sha256sum "$LOCK" | cut -c1-16)"
# pip's exit code is kept; only the noise about this machine's local package mirrors goes.
pip_install() { "$VENV/bin/pip" install -q "$@" 2> >(grep -v "is ignored: it is neither" >&2); }

if [ ! -f "$stamp" ]; then
  echo "[setup] installing the locked environment ($LOCK)"
  # First pip and ffcv's build requirements (its setup.py imports numpy, cython and pkgconfig),
  # from the lock: then ffcv builds from source without build isolation, against them.
  first="$VENV/.lock-first.txt"
  "$VENV/bin/python" -m pipeline.environment --subset pip setuptools wheel numpy cython pkgconfig > "$first"
  pip_install --require-hashes --no-deps -r "$first"
  pip_install --require-hashes --no-build-isolation -r "$LOCK"
  pip_install --no-deps --no-build-isolation -e .
  "$VENV/bin/python" -m pipeline.environment --check  # every installed version is the lock's
  touch "$stamp"
fi
bash .ci/link-profiles.sh
echo "[setup] ready ($what)"
