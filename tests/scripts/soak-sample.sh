#!/usr/bin/env bash
# Memory of a soak over time: N `ragtag run` processes of the built-in run on
# loopback for D seconds; every 30 s prints the mean and max resident memory
# of all ragtag processes, their mean anonymous (private) memory, which
# leaves out the binary's shared pages, and the warnings logged so far. Environment is
# passed on (e.g. MALLOC_ARENA_MAX=2 to compare allocator settings).
# With HEAPTRACK_OUT=FILE, the second process runs under heaptrack and its
# profile is written to FILE.zst. BIN=PATH runs another build (A/B runs);
# "conns" is the mean number of established TCP connections per process.
#   cargo build --release -p ragtag-node && N=16 D=240 tests/scripts/soak-sample.sh
set -euo pipefail
R=${BIN:-"$(cd "$(dirname "$0")/../.." && pwd)/target/release/ragtag"}
D=${D:-240}
N=${N:-16}
export RAYON_NUM_THREADS=1 RUST_LOG=warn NO_COLOR=1
work=$(mktemp -d)
# With KEEP=DIR, the processes' logs are copied to DIR at the end.
trap 'pkill -P $$ ragtag 2>/dev/null || true; if [ -n "${KEEP:-}" ]; then mkdir -p "$KEEP" && cp "$work"/[oe]* "$KEEP"/; fi; rm -rf "$work"' EXIT
cd "$work"
"$R" run --json --duration $((D + 10)) --state st0 >o0 2>e0 &
for _ in $(seq 50); do grep -q "listening on" e0 2>/dev/null && break; sleep 0.2; done
addr=$(grep -m1 "listening on" e0 | sed 's/listening on //')
for i in $(seq 1 $((N - 1))); do
    wrap=()
    if [ "$i" = 1 ] && [ -n "${HEAPTRACK_OUT:-}" ]; then wrap=(heaptrack -o "$HEAPTRACK_OUT"); fi
    "${wrap[@]}" "$R" run --json --duration "$D" --state "st$i" --bootstrap "$addr" >"o$i" 2>"e$i" &
done
for t in $(seq 30 30 $((D - 10))); do
    sleep 30
    anon=$(for p in $(pgrep -x ragtag); do grep -s '^Anonymous:' "/proc/$p/smaps_rollup"; done |
        awk '{s += $2; n++} END {if (n) printf "%.1f", s/n/1024}')
    conns=$(ss -tnpH state established | grep -c '"ragtag"' || true)
    ps -o rss= -C ragtag | awk -v t="$t" -v a="$anon" -v c="$conns" -v w="$(cat e* | grep -c WARN || true)" \
        '{s += $1; if ($1 > m) m = $1; n++} END {printf "t=%d mean %.1f MiB max %.1f anon %s conns %.1f n=%d warns=%d\n", t, s/n/1024, m/1024, a, c/n, n, w}'
done
wait
