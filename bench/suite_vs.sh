#!/usr/bin/env bash
# The test suite's time at another commit beside this checkout's HEAD, on this machine, one after
# the other (the SLURM tests share one local cluster, so the two cannot run at once): issue 50's
# "make test at most half of its time at 912cab9 on the same CPU".
#
#   bash bench/suite_vs.sh 912cab9                      # the whole suite on both sides
#   bash bench/suite_vs.sh 912cab9 tests/test_stats.py  # pytest arguments: a part of it
#
# Each side is a fresh clone of its commit, run as its own `make test` runs it (its Makefile's
# pytest line, CI=true, --durations=25) with this checkout's .venv (make setup-test) and the clone
# first on PYTHONPATH, so each side imports its own pipeline/; refused when the other commit locks a
# package version HEAD's lock does not (then each side needs its own environment). A package only
# HEAD locks (pytest-xdist) is installed but idle on a side whose pytest line does not use it.
# Logs and the summary: bench/out/suite_vs/.
set -euo pipefail
other=${1:?usage: bash bench/suite_vs.sh COMMIT [pytest arguments]}
shift
repo=$(git rev-parse --show-toplevel)
venv=$(realpath -m "${VENV:-$repo/.venv}")  # VENV: another environment of the same lock (each side runs in its clone)
[ -x "$venv/bin/python" ] || { echo "[suite_vs] no $venv: run make setup-test first" >&2; exit 1; }
# one environment runs both: HEAD's, when it holds every package version the other commit locks
pins() { git -C "$repo" show "$1:requirements.lock" | grep -E '^[A-Za-z0-9_.-]+==' | sort -u; }
if [ -n "$(comm -23 <(pins "$other") <(pins HEAD))" ]; then
  echo "[suite_vs] $other locks package versions HEAD does not: one environment cannot run both" >&2
  comm -23 <(pins "$other") <(pins HEAD) >&2
  exit 1
fi
out=$(realpath -m "${OUT:-$repo/bench/out/suite_vs}")  # absolute: each side runs in its clone
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"
summary=$out/summary.txt
{
  echo "CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, flags: $(grep -o -w -E 'avx2|avx512f|avx512_bf16|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')"
  echo "pytest arguments: ${*:-(the whole suite)}"
} > "$summary"
walls=()
for side in "$other" HEAD; do
  commit=$(git -C "$repo" rev-parse --short "$side")
  name=${#walls[@]}-$commit  # (both sides may be one commit: a check of this script)
  clone=$work/$name
  git clone -q "$repo" "$clone" && git -C "$clone" checkout -q "$commit"
  log=$out/$name.log
  imported=$(cd "$clone" && PYTHONPATH="$clone" "$venv/bin/python" -c "import pipeline; print(pipeline.__file__)")
  [[ $imported == "$clone"/* ]] || { echo "[suite_vs] $commit would import $imported, not its own" >&2; exit 1; }
  # the side's own make-test line: its pytest options without $(PYTEST_ARGS)
  make_test=$(awk '/^test:/ {t = 1; next} t && /python -m pytest/ {sub(/.*python -m pytest /, ""); sub(/ *\$\(PYTEST_ARGS\)/, ""); print; exit}' "$clone/Makefile")
  [ -n "$make_test" ] || { echo "[suite_vs] no pytest line under test: in $commit's Makefile" >&2; exit 1; }
  echo "[suite_vs] $commit: pytest $make_test in $clone -> $log"
  start=$(date +%s)
  set +e
  # (a coverage run around this script must not measure the sides: each measures itself)
  (cd "$clone" && env $(env | grep -o '^COV[A-Z_]*' | sed 's/^/-u /') CI=true PATH="$venv/bin:$PATH" \
    PYTHONPATH="$clone" python -m pytest $make_test --durations=25 "$@" > "$log" 2>&1)
  rc=$?
  set -e
  walls+=($(( $(date +%s) - start )))
  echo "$commit: ${walls[-1]} s, exit $rc: $(tail -n 1 "$log")" | tee -a "$summary"
done
echo "HEAD / $other: $(python3 -c "print(round(${walls[1]} / max(1, ${walls[0]}), 3))")" | tee -a "$summary"
