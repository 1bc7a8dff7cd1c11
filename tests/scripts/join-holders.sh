#!/usr/bin/env bash
# Joins on loopback as a run's holders come and go: node a, then b
# bootstrapping a 4 s later, then (8 s on) three joiners one after another,
# each bootstrapping a and training 4 s. For each joiner, prints how many
# holders the DHT named, the seconds from its first log line to "joined
# with", and what its state was checked against. BIN=PATH runs another
# build (A/B runs).
#   cargo build -p ragtag-node && tests/scripts/join-holders.sh
set -euo pipefail
B=${BIN:-"$(cd "$(dirname "$0")/../.." && pwd)/target/debug/ragtag"}
export NO_COLOR=1 RUST_LOG=info
work=$(mktemp -d)
trap 'pkill -P $$ ragtag 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT
cd "$work"
"$B" run --state a --duration 60 >a.log 2>&1 &
sleep 4
A=$(grep -o "/ip4/127.0.0.1/tcp/[0-9]*/p2p/[A-Za-z0-9]*" a.log | head -1)
"$B" run --state b --bootstrap "$A" --duration 55 >b.log 2>&1 &
sleep 8
for i in 1 2 3; do
  "$B" run --state "j$i" --bootstrap "$A" --duration 4 >"j$i.log" 2>&1
  start=$(head -1 "j$i.log" | cut -c1-27)
  joined=$(grep -m1 "joined with\|Fresh at" "j$i.log" | cut -c1-27)
  holders=$(grep -o "names [0-9]* holder" "j$i.log" | grep -o "[0-9]*" || echo "no lookup")
  dt=$(python3 -c "from datetime import datetime as d; f=lambda x: d.fromisoformat(x.rstrip('Z')); print(round((f('$joined')-f('$start')).total_seconds(), 2))")
  how=$(grep -o "checked against [0-9]* other peers\|the only peer that served one\|Fresh at" "j$i.log" | head -1)
  echo "joiner $i: holders named $holders, first log line to joined: $dt s, $how"
done
