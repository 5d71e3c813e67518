#!/usr/bin/env bash
# chorus: set-up, build, demo and tests on Debian 12.
#
#   ./build.sh demo    install what is missing, build, run the 4-rank training
#                      sample into one shared run, and show the run
#   ./build.sh test    install what is missing, build, run every test, a short
#                      run of every fuzz target; then the same suite again
#                      under AddressSanitizer + UBSan
#   ./build.sh tsan    the suite under ThreadSanitizer (build-tsan/)
#   ./build.sh bench   build in Release and run the benchmarks (bench/)
set -euo pipefail
cd "$(dirname "$0")"

PACKAGES=(build-essential cmake ninja-build pkg-config git
          libcaf-dev libasio-dev libsimdjson-dev libcurl4-openssl-dev libssl-dev libpng-dev
          libboost-test-dev libspdlog-dev libgloo-dev iproute2 procps e2fsprogs mount
          clang libclang-rt-14-dev openmpi-bin python3
          libcpp-httplib-dev libbrotli-dev zlib1g-dev libjs-dygraphs chromium chromium-driver python3-selenium
          python3-dev pybind11-dev python3-numpy python3-pandas python3-pytest python3-torch)
JOBS=${JOBS:-$(nproc)}

install_packages() {
  local missing=()
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "== installing: ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
}

configure_build() { # dir, extra cmake args...
  local dir=$1; shift
  # The Python package is built for Debian's interpreter, where numpy,
  # pandas and torch are installed (not a python3 earlier on PATH).
  cmake -S . -B "$dir" -G Ninja -DCHORUS_WERROR=ON -DPython3_EXECUTABLE=/usr/bin/python3 "$@" >/dev/null
  cmake --build "$dir" -j "$JOBS"
}

run_tests() { # dir
  ctest --test-dir "$1" --output-on-failure --timeout 600 -j "$JOBS"
}

case "${1:-}" in
  demo)
    install_packages
    configure_build build -DCMAKE_BUILD_TYPE=Release -DCHORUS_BUILD_TESTS=OFF
    export CHORUS_DIR="$PWD/chorus-runs"
    # A sample a second (default 10 s), so that the short demo shows its machines.
    export CHORUS_SYSTEM_INTERVAL="${CHORUS_SYSTEM_INTERVAL:-1}"
    echo "== training: 4 ranks, one shared run"
    ./build/bin/chorus launch -n 4 -- ./build/bin/ddp_train
    run=$(ls -td "$CHORUS_DIR"/chorus-demo/*/*/ | head -n 1)
    echo "== the run is in ${run%/}"
    ./build/bin/chorus show "${run%/}"
    echo "== in a browser: ./build/bin/chorus serve $CHORUS_DIR   (then open the address it prints)"
    echo "== from Python: PYTHONPATH=build/python /usr/bin/python3 -c 'import chorus; print(chorus.open(\"${run%/}\").history())'"
    ;;
  test)
    install_packages
    echo "== build and test (RelWithDebInfo, warnings are errors)"
    configure_build build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCHORUS_BUILD_BENCH=OFF
    run_tests build
    echo "== fuzz smoke: every target in fuzz/ for 10 s (clang, libFuzzer)"
    JOBS="$JOBS" fuzz/smoke.sh 10
    echo "== build and test under AddressSanitizer + UndefinedBehaviorSanitizer"
    configure_build build-asan -DCMAKE_BUILD_TYPE=Debug -DCHORUS_SANITIZE=address,undefined \
      -DCHORUS_BUILD_BENCH=OFF -DCHORUS_BUILD_SAMPLES=OFF -DCMAKE_CXX_FLAGS=-O1
    # CAF's own shutdown leaks (a peer gone) are named in tests/lsan.supp. A
    # leak under OpenSSL is seen through libcrypto only by the slow unwinder
    # (libcrypto keeps no frame pointers): the tests whose processes make TLS
    # links add it (TLS_LINKS in tests/CMakeLists.txt), the others keep the
    # fast one.
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
      LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp" \
      UBSAN_OPTIONS=print_stacktrace=1 run_tests build-asan
    ;;
  tsan)
    install_packages
    configure_build build-tsan -DCMAKE_BUILD_TYPE=Debug -DCHORUS_SANITIZE=thread \
      -DCHORUS_BUILD_BENCH=OFF -DCHORUS_BUILD_SAMPLES=OFF -DCMAKE_CXX_FLAGS=-O1
    # Debian's CAF is not built with TSan: its own memory accesses are left out
    # (ignore_noninstrumented_modules), and tests/tsan.supp names its hand-offs.
    TSAN_OPTIONS="halt_on_error=1 ignore_noninstrumented_modules=1 suppressions=$PWD/tests/tsan.supp" \
      run_tests build-tsan
    ;;
  bench)
    install_packages
    configure_build build-release -DCMAKE_BUILD_TYPE=Release -DCHORUS_BUILD_TESTS=OFF
    for b in build-release/bin/bench_*; do echo "== $b"; "$b"; done
    echo "== bench/python_log_bench.py"
    PYTHONPATH=build-release/python /usr/bin/python3 bench/python_log_bench.py
    ;;
  *)
    sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
