#!/usr/bin/env bash
# `snakemake --profile slurm`, typed from the repository: Snakemake looks a bare profile name up
# in the working directory and in the user's Snakemake folder (~/.config/snakemake), never in
# ./profiles. Link the repository's profile there (a link, so it cannot drift from
# profiles/slurm), never over a different one.
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${XDG_CONFIG_HOME:-$HOME/.config}/snakemake"
for name in slurm; do
  target="$PWD/profiles/$name" link="$dir/$name"
  if [ -L "$link" ] && [ "$(readlink -f "$link")" = "$(readlink -f "$target")" ]; then
    continue
  fi
  if [ -e "$link" ] || [ -L "$link" ]; then
    echo "[setup] $link exists and is not this repository's profiles/$name: left as it is." \
         "Use --profile profiles/$name, or replace it: ln -sfn $target $link"
    continue
  fi
  mkdir -p "$dir"
  ln -s "$target" "$link"
  echo "[setup] linked $link -> profiles/$name: snakemake --profile $name works from this repository"
done
