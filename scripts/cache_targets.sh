#!/bin/sh
# The row cache's and auto's targets (issue 13), one run, figures to OUTDIR:
#   scripts/cache_targets.sh PLEIO TABLE TOKENS OUTDIR
# TABLE: a 4 GiB table (`pleio synth --rows 48000000 -o big.gguf`); TOKENS:
# the corpus as token ids (`pleio rows TABLE --corpus --json | jq -c .tokens`),
# so the capped child needs no tokenizer. Needs root and a memory cgroup
# controller for --mem-cap. Prints `uptime` before each step.
set -eu
pleio=$1 table=$2 tokens=$3 out=$4
mkdir -p "$out"
step() { echo "== $1 (load $(cut -d' ' -f1-3 /proc/loadavg))" | tee -a "$out/steps.txt"; }
# 1. Cold corpus replays (prefill + 64 decode steps), uncapped, every strategy.
for s in advise uring uring-direct pool auto cached fault pread; do
  step "uncapped cold $s"
  "$pleio" replay "$table" --tokens "$tokens" --strategy "$s" --budget 256M --cold --json > "$out/cold-$s.json"
done
# 2. The cached strategy in a 320 MiB memory cgroup, two passes.
step "capped cached"
"$pleio" replay "$table" --tokens "$tokens" --strategy cached --budget 256M --passes 2 --cold \
  --mem-cap 320M --json > "$out/capped-cached.json"
# 3. First warm pass after a cold one, fault and auto (prefill only).
for s in fault auto; do
  step "passes $s"
  "$pleio" replay "$table" --tokens "$tokens" --strategy "$s" --passes 2 --cold --decode 0 --json > "$out/passes-$s.json"
done
# 4. Cold 1792 rows against advise and the device floor.
step "bench 1792"
"$pleio" bench "$table" --rows 1792 --strategies fault,advise,auto --json "$out/bench-1792.json" --force > "$out/bench-1792.txt"
step done
