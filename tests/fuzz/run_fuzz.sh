#!/usr/bin/env bash
# run_fuzz.sh FUZZER SEEDS CORPUS SECONDS: a bounded libFuzzer run over a scratch corpus.
set -euo pipefail
fuzzer=$1 seeds=$2 corpus=$3 seconds=$4
rm -rf "$corpus"
mkdir -p "$corpus"
cp "$seeds"/* "$corpus"/
exec "$fuzzer" -max_total_time="$seconds" -rss_limit_mb=1024 -max_len=4096 \
  -artifact_prefix="$corpus/" "$corpus"
