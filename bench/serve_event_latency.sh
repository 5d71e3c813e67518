#!/bin/bash
# How soon a live page hears that a long history's index is whole: a fresh
# `chorus serve` (no kept indexes) opens the run (GET /api/run starts the
# index's building in the background); then, side by side, the API is asked
# every 10 ms until it says the index is whole ("whole"), and the run's event
# stream is read until its history event says so ("event"). Seconds from the
# first GET /api/run; the history file is read once first (a warm page cache).
#
#   bench/serve_event_latency.sh CHORUS DATA RUN [TRIES]
#   e.g. bench/serve_event_latency.sh build-release/bin/chorus /tmp/serve-bench/big bench/g/big 3
# (DATA/big is what `bench_serve --write DATA` writes.)
set -u
chorus=$1 data=$2 run=$3 tries=${4:-3}
port=$((20000 + RANDOM % 20000))
for ((t = 0; t < tries; ++t)); do
  "$chorus" serve "$data" --port "$port" --no-token --no-index-dir > /dev/null 2>&1 &
  server=$!
  until curl -s -o /dev/null "http://127.0.0.1:$port/api/runs"; do sleep 0.1; done
  cat "$data/$run/history.jsonl" > /dev/null
  sleep 1
  t0=$(date +%s.%N)
  curl -s -o /dev/null "http://127.0.0.1:$port/api/run?run=$run"
  (
    while curl -s "http://127.0.0.1:$port/api/run?run=$run" | grep -q '"indexing":true'; do sleep 0.01; done
    echo "whole $(echo "$(date +%s.%N) - $t0" | bc) s"
  ) &
  curl -s -N "http://127.0.0.1:$port/api/events?run=$run" | while read -r line; do
    case "$line" in "event: "*) ev="$line" ;; esac
    case "${ev:-}|$line" in "event: history|"*'"indexing":false'*)
      echo "event $(echo "$(date +%s.%N) - $t0" | bc) s"
      break ;;
    esac
  done
  wait %2 2> /dev/null
  kill "$server"
  wait "$server" 2> /dev/null
done
