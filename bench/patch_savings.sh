#!/usr/bin/env bash
# What each of the package's patches of other libraries saves, side by side on real runs of the
# workflow: each round runs it from an empty results folder once as it is and once with each
# patch switched off (bench/unpatch/sitecustomize.py, by $MOCO_UNPATCH), in an order that rotates
# from round to round; the whole Snakemake process and its jobs timed (/usr/bin/time: wall, user,
# system). docs/performance.md lists the patches and what this measured.
#
#   bash bench/patch_savings.sh [ROUNDS]                       # the tiny workflow (the suite's)
#   ROUNDS=1 VARIANTS="none typed_dict,ffcv_cache,lean_torchvision" \
#     SNAKEMAKE_ARGS="" bash bench/patch_savings.sh            # the demo (config.yaml), all off
#
# Output: bench/out/patch_savings/runs.tsv (one line a run) and summary.md (medians; the ratio
# to "none" paired by round). Numba's on-disk cache is warm from earlier runs on both sides, as
# for every job after a machine's first.
set -euo pipefail
rounds=${1:-${ROUNDS:-3}}
repo=$(git rev-parse --show-toplevel)
out=$(realpath -m "${OUT:-$repo/bench/out/patch_savings}")
read -r -a variants <<< "${VARIANTS:-none typed_dict ffcv_cache lean_torchvision}"
args=${SNAKEMAKE_ARGS-"--configfile workflow/config/presets/tiny.yaml"}
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$repo"
{ lscpu | grep -E '^Model name'; grep -o -w -E 'avx512f|avx512_bf16|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' '; echo; } > "$out/cpu.txt"
printf 'round\tvariant\twall_s\tuser_s\tsys_s\n' > "$out/runs.tsv"
n=${#variants[@]}
for ((r = 0; r < rounds; r++)); do
  for ((i = 0; i < n; i++)); do
    v=${variants[$(((i + r) % n))]}
    rm -rf "$work/results"
    unpatch=${v#none}
    # shellcheck disable=SC2086  # the Snakemake arguments are words
    MOCO_UNPATCH=$unpatch PYTHONPATH="$repo/bench/unpatch${PYTHONPATH:+:$PYTHONPATH}" \
      /usr/bin/time -f '%e %U %S' -o "$work/time" \
      snakemake $args --config results="$work/results" --cores 2 -q > "$out/$v.log" 2>&1
    read -r wall user sys < "$work/time"
    printf '%s\t%s\t%s\t%s\t%s\n' "$r" "$v" "$wall" "$user" "$sys" >> "$out/runs.tsv"
    echo "[patch_savings] round $r $v: wall $wall s, cpu $(echo "$user + $sys" | bc) s"
  done
done
python - "$out" <<'PY'
import csv, statistics, sys
from pathlib import Path
out = Path(sys.argv[1])
rows = list(csv.DictReader((out / "runs.tsv").open(), delimiter="\t"))
cpu = {(r["round"], r["variant"]): float(r["user_s"]) + float(r["sys_s"]) for r in rows}
wall = {(r["round"], r["variant"]): float(r["wall_s"]) for r in rows}
variants = list(dict.fromkeys(r["variant"] for r in rows))
rounds = sorted({r["round"] for r in rows})
lines = [f"CPU: {(out / 'cpu.txt').read_text().strip()}", "",
         "| switched off | CPU s (median) | wall s (median) | CPU as it is / off, paired (median) | wall ratio |",
         "|---|---:|---:|---:|---:|"]
for v in variants:
    med = lambda d: statistics.median(d[(r, v)] for r in rounds)
    ratio = lambda d: statistics.median(d[(r, "none")] / d[(r, v)] for r in rounds)
    lines.append(f"| {v} | {med(cpu):.1f} | {med(wall):.1f} | {ratio(cpu):.3f} | {ratio(wall):.3f} |")
(out / "summary.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
PY
