#!/usr/bin/env bash
# Idempotent setup: Debian packages when absent, .venv, pinned Python deps.
# Usage: .ci/setup.sh [demo|test]   ("test" adds slurm-wlm, munge and the test tools)
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

[ -x .venv/bin/python ] || { echo "[setup] creating .venv"; "$PY" -m venv .venv; }

# One stamp per requirements file: `make test` after `make demo` installs only the test tools.
stamp_of() { echo ".venv/.installed-$1-$(sha256sum "$2" | cut -c1-16)"; }
# pip's exit code is kept; only the noise about this machine's local package mirrors goes.
pip_install() { .venv/bin/pip install -q "$@" 2> >(grep -v "is ignored: it is neither" >&2); }

if [ ! -f "$(stamp_of run requirements.txt)" ]; then
  echo "[setup] installing Python dependencies (requirements.txt)"
  pip_install --upgrade pip wheel setuptools
  # numpy, cython and pkgconfig first: ffcv's setup.py imports them at build time.
  pip_install "numpy>=2.0,<2.5" cython pkgconfig
  pip_install --no-build-isolation ffcv==1.0.2
  pip_install -r requirements.txt
  pip_install --no-deps -e .
  touch "$(stamp_of run requirements.txt)"
fi
if [ "$what" = test ] && [ ! -f "$(stamp_of test requirements-test.txt)" ]; then
  echo "[setup] installing test dependencies (requirements-test.txt)"
  pip_install -r requirements-test.txt
  touch "$(stamp_of test requirements-test.txt)"
fi
bash .ci/link-profiles.sh
echo "[setup] ready ($what)"
