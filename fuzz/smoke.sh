#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan) in build-fuzz/ and
# runs each for a short, bounded time from seeds made here: a smoke run for
# CI, not a fuzzing campaign.
#
#   fuzz/smoke.sh [SECONDS_EACH]     (default 20; JOBS sets the build's -j)
#
# A finding stops the script with the fuzzer's report; the input that caused
# it is kept as build-fuzz/run/TARGET-crash-*, and `build-fuzz/fuzz/fuzz_TARGET
# FILE` replays it.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-20}
build=build-fuzz
targets=(wal wire json_lines run_files options tfevents histograms link_framing kept_index history_lines)

cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang \
  -DCMAKE_CXX_COMPILER=clang++ -DCHORUS_BUILD_FUZZ=ON -DCHORUS_SANITIZE=address,undefined \
  -DCHORUS_BUILD_TESTS=OFF -DCHORUS_BUILD_BENCH=OFF -DCHORUS_BUILD_SAMPLES=OFF >/dev/null
cmake --build "$build" -j"${JOBS:-2}" --target "${targets[@]/#/fuzz_}"

run="$build/run"
rm -rf "$run"
mkdir -p "$run/tmp"
for t in "${targets[@]}"; do mkdir -p "$run/$t-corpus"; done
seed() { printf '%b' "$3" >"$run/$1-corpus/$2"; } # TARGET NAME TEXT (printf escapes)

# The WAL and the wire frames: written by the real encoders.
for t in wal wire tfevents histograms kept_index history_lines; do CHORUS_FUZZ_SEEDS="$run/$t-corpus" TMPDIR="$run/tmp" "$build/fuzz/fuzz_$t" -runs=0 >/dev/null; done
seed json_lines rows '{"_step":0,"_timestamp":1.7e9,"loss":0.5,"acc/rank-0":1}\n{"_step":1,"loss":"NaN"}\n{"_step":2.5,"x":"Infinity"}\n'
seed json_lines odd '\n  \n{"_step":1e300}\n[1,2]\n{"_step":-3,"a":{"b":1}}\r\n{"_step":4'
seed run_files run '\x00{"id":"r1","state":"running","pid":4242,"host":"h","start_time":1.7e9,"world_size":2,"ranks":[{"rank":0,"state":"finished","last_step":9},{"rank":1,"state":"crashed"}],"exit_codes":{"0":0,"1":137}}'
seed run_files group '\x01{"group":"g","project":"p","size":2,"mode":"per_rank","members":[{"id":"r1","state":"finished","index":0,"ranks":[{"rank":0,"state":"finished","last_step":1}],"summary":{"loss":1}}],"exit_codes":{"0":0}}'
seed options torchrun 'RANK=1\nWORLD_SIZE=4\nLOCAL_RANK=1\nLOCAL_WORLD_SIZE=2\nGROUP_RANK=0\nMASTER_ADDR=10.0.0.1\nMASTER_PORT=29500\nCHORUS_MODE=per_rank\n'
seed options slurm 'SLURM_PROCID=3\nSLURM_NTASKS=8\nSLURM_LOCALID=1\nSLURM_NTASKS_PER_NODE=4\nSLURM_NODEID=0\nCHORUS_SCOPE=node\nCHORUS_FLUSH_INTERVAL=0.5\nCHORUS_PROJECT=p\n'
seed options mpi 'OMPI_COMM_WORLD_RANK=2\nOMPI_COMM_WORLD_SIZE=4\nOMPI_COMM_WORLD_LOCAL_RANK=0\nOMPI_COMM_WORLD_LOCAL_SIZE=2\nCHORUS_RUN_ID=a.b-c\n'

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1
export LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp"
for t in "${targets[@]}"; do
  echo "== fuzz_$t: ${secs}s"
  TMPDIR="$run/tmp" "$build/fuzz/fuzz_$t" "$run/$t-corpus" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
    -max_len=65536 -artifact_prefix="$run/$t-" -print_final_stats=1 2>"$run/$t.log" ||
    { tail -n 60 "$run/$t.log"; exit 1; }
  grep -E '^stat::number_of_executed_units|^Done' "$run/$t.log" || true
done
echo "fuzz smoke: all ${#targets[@]} targets ran ${secs}s each without a finding"
