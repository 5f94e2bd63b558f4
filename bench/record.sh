# shellcheck shell=bash
# Sourced by the bench scripts: what a run prints also goes to a file in
# bench/results/ (BENCH_RESULTS chooses another directory), named after the
# script and the time it started, e.g. bench/results/run-20261203T1400Z.txt.
# bench/results/ is ignored by git: raw output stays on the machine that
# made it; docs/ keeps the summary tables and the command that regenerates
# them. Expects $repo set.

record_output() { # name
  local dir=${BENCH_RESULTS:-$repo/bench/results}
  mkdir -p "$dir"
  bench_output=$dir/$1-$(date -u +%Y%m%dT%H%M%SZ).txt
  echo "bench: output also in $bench_output" >&2
  exec > >(tee -a "$bench_output") 2> >(tee -a "$bench_output" >&2)
}
