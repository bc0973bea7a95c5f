#!/usr/bin/env bash
# tuner_resume.sh <mha-tune> <scratch dir>: a tuning run killed halfway leaves its records, and
# a second run with the same arguments resumes from them instead of measuring them again, and
# plots the whole search beside the records.
set -euo pipefail
tune=$1
dir=$2
rm -rf "$dir" && mkdir -p "$dir"
db="$dir/sse41.records.jsonl"
args=(--isa sse41 --bucket small --tuning-shape 1,4,4,16,2 --max-candidates 5 --rounds 2
      --tuning-shape-only --seed 11 --db "$db" --out "$dir/sse41.json")
searched() { grep -c '"role":"search"' "$db" 2>/dev/null || true; }

"$tune" "${args[@]}" >"$dir/first.log" 2>&1 &
pid=$!
for _ in $(seq 600); do
    [ "$(searched)" -ge 2 ] && break
    kill -0 "$pid" 2>/dev/null || { cat "$dir/first.log"; echo "the first run ended early"; exit 1; }
    sleep 0.1
done
kill -9 "$pid"
wait "$pid" 2>/dev/null || true
kept=$(searched)
echo "killed the first run after $kept search records"
[ "$kept" -ge 2 ] || { echo "expected at least 2 records"; exit 1; }
[ "$kept" -lt 5 ] || { echo "the first run finished before it was killed"; exit 1; }

"$tune" "${args[@]}" >"$dir/second.log" 2>&1
cat "$dir/second.log"
grep -q "resumed $kept candidates" "$dir/second.log" || { echo "did not resume $kept"; exit 1; }
[ "$(searched)" -eq 5 ] || { echo "expected 5 search records in all, not $(searched)"; exit 1; }
[ -s "$dir/sse41.json" ] || { echo "no tuned file"; exit 1; }
# The tuned file names the CPU it was tuned on, with x86's family and model numbers, per bucket
# and as the identity that dispatch matches.
grep -Eq '"machine": ".*family [0-9]+ model [0-9]+.*, [0-9]+ cores"' "$dir/sse41.json" ||
    { echo "$dir/sse41.json does not name the CPU's family and model"; exit 1; }
grep -Eq '"vendor": "(GenuineIntel|AuthenticAMD)"' "$dir/sse41.json" ||
    { echo "$dir/sse41.json does not give its CPU's vendor"; exit 1; }
plot="$dir/sse41.search.svg"
[ "$(grep -c '<circle' "$plot")" -ge 5 ] || { echo "$plot does not show the 5 candidates"; exit 1; }
grep -q "defaults" "$plot" || { echo "$plot does not mark the defaults"; exit 1; }
echo "resumed: $kept records reused, $((5 - kept)) measured"
