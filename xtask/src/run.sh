#!/usr/bin/env bash
# symm GPU bundle, built by `cargo xtask gpu-bundle` on a machine with cargo,
# for a machine with GPUs but no cargo.
#
#   ./run.sh tests [test-binary args]   every GPU test executable (SYMM_REQUIRE_GPUS=<GPUs here>: a test
#                                       needing at most that many GPUs fails instead of skipping; on one
#                                       GPU the shared-device suites run, the distinct-GPU ones skip)
#   ./run.sh bench [symm-bench args]    the benchmark (JSON + SVG plot into $OUT when set)
#   ./run.sh tp-layer [args]            the tensor-parallel decoder layer (JSON + SVG plot into $OUT when set)
#   ./run.sh anchors [args]             torchrun --nproc-per-node ${NPROC:-2} anchors_torch.py (PyTorch / NCCL anchors)
#   ./run.sh store-interop [args]       symm-store against PyTorch's TCPStore, both directions, one
#                                       verdict line (args: the Rust side alone, server | client <port>)
#   ./run.sh all                        all of the above, in that order
#   ./run.sh list                       what the bundle holds
#
# Logs go to $OUT/<command>.log when OUT is set.
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="${OUT:-}"
[ -n "$OUT" ] && mkdir -p "$OUT"

# --- environment ---------------------------------------------------------
libdirs="/usr/local/cuda/lib64"
nccl_dir="$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null || true)"
if [ -z "$nccl_dir" ] || [ ! -d "$nccl_dir" ]; then
  nccl_dir=""
  for sp in $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null); do
    for lib in "$sp"/nvidia/*/lib/libnccl.so*; do
      if [ -e "$lib" ]; then nccl_dir="$(dirname "$lib")"; break 2; fi
    done
  done
fi
if [ -n "$nccl_dir" ]; then
  libdirs="$libdirs:$nccl_dir"
  # cudarc looks for libnccl.so (not .so.2): give it a link when pip's wheel has none.
  if [ ! -e "$nccl_dir/libnccl.so" ] && [ -e "$nccl_dir/libnccl.so.2" ]; then
    shim="$(mktemp -d "${TMPDIR:-/tmp}/symm-libshim.XXXXXX")"
    ln -s "$nccl_dir/libnccl.so.2" "$shim/libnccl.so"
    libdirs="$shim:$libdirs"
  fi
fi
for sp in $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null); do
  [ -d "$sp/nvidia/cu13/lib" ] && libdirs="$libdirs:$sp/nvidia/cu13/lib"
done
export LD_LIBRARY_PATH="$libdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=0
# PTX compiled when the bundle was built (`cargo xtask gpu-bundle`, sm_90), so a fresh machine
# skips NVRTC; a different NVRTC version misses the cache and compiles as usual.
if [ -z "${SYMM_KERNEL_CACHE:-}" ] && [ -d "$HERE/kernel-cache" ]; then export SYMM_KERNEL_CACHE="$HERE/kernel-cache"; fi
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1
# How many GPUs the tests must use: those needing more skip and say so.
gpus="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)"
[ "${gpus:-0}" -gt 0 ] || gpus="$(ls /proc/driver/nvidia/gpus 2>/dev/null | wc -l)"
export SYMM_REQUIRE_GPUS="${SYMM_REQUIRE_GPUS:-${gpus:-0}}"

# run NAME CMD...: runs CMD, appending its output to $OUT/NAME.log when OUT is set.
run() {
  local name="$1"; shift
  echo "\$ $*" >&2
  if [ -n "$OUT" ]; then
    "$@" 2>&1 | tee -a "$OUT/$name.log"
    return "${PIPESTATUS[0]}"
  else
    "$@"
  fi
}

has_arg() { local want="$1"; shift; for a in "$@"; do [ "$a" = "$want" ] && return 0; done; return 1; }

cmd_tests() {
  # GPU tests own both GPUs and measure device-memory baselines: one at a time.
  local -x RUST_TEST_THREADS="${RUST_TEST_THREADS:-1}"
  # Rank threads sharing a GPU need every hardware work queue (NOTE [co-residency]).
  # (local: `run.sh all` then times the benchmark with the driver's default, as `xtask bench` does)
  local -x CUDA_DEVICE_MAX_CONNECTIONS="${CUDA_DEVICE_MAX_CONNECTIONS:-32}"
  local passed=0 failed=0 failed_names=""
  for t in "$HERE"/tests/*; do
    [ -x "$t" ] || continue
    if run tests "$t" "$@"; then passed=$((passed + 1)); else failed=$((failed + 1)); failed_names="$failed_names $(basename "$t")"; fi
  done
  [ -n "$failed_names" ] && echo "failed:$failed_names" | { if [ -n "$OUT" ]; then tee -a "$OUT/tests.log"; else cat; fi; }
  echo "tests: $passed passed, $failed failed" | { if [ -n "$OUT" ]; then tee -a "$OUT/tests.log"; else cat; fi; }
  [ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]
}

# run_plotted NAME EXE ARGS...: runs a benchmark executable with --json $OUT/NAME.json (unless
# ARGS has one), then plots that JSON with xtask into NAME.svg beside it.
run_plotted() {
  local name="$1" exe="$2"; shift 2
  [ -x "$exe" ] || { echo "$(basename "$exe") is not in this bundle" >&2; return 1; }
  local extra=()
  local json=""
  if ! has_arg --json "$@"; then
    json="${OUT:-$HERE}/$name.json"
    extra=(--json "$json")
  fi
  run "$name" "$exe" "$@" "${extra[@]}" || return 1
  if [ -n "$json" ] && [ -f "$json" ] && [ -x "$HERE/bin/xtask" ]; then
    run "$name" "$HERE/bin/xtask" plot "$json" --out "${json%.json}.svg"
  fi
}

cmd_bench() { run_plotted bench "$HERE/bin/symm-bench" "$@"; }

cmd_tp_layer() { run_plotted tp-layer "$HERE/bin/tp-layer" "$@"; }

cmd_anchors() {
  [ -f "$HERE/anchors_torch.py" ] || { echo "anchors_torch.py is not in this bundle" >&2; return 1; }
  local extra=()
  if [ -n "$OUT" ] && ! has_arg --out "$@"; then extra=(--out "$OUT/anchors.json"); fi
  run anchors torchrun --nproc-per-node "${NPROC:-2}" "$HERE/anchors_torch.py" "$@" "${extra[@]}"
}

cmd_store_interop() {
  [ -x "$HERE/bin/symm-store-interop" ] || { echo "symm-store-interop is not in this bundle" >&2; return 1; }
  # With arguments: the Rust side alone (server | client <port>). Without: both directions
  # against PyTorch's TCPStore (torch_interop.py drives it) and one verdict line.
  if [ "$#" -gt 0 ]; then
    run store-interop "$HERE/bin/symm-store-interop" "$@"
    return
  fi
  [ -f "$HERE/torch_interop.py" ] || { echo "torch_interop.py is not in this bundle" >&2; return 1; }
  local log rc
  log="$(mktemp "${TMPDIR:-/tmp}/symm-interop.XXXXXX")"
  SYMM_STORE_INTEROP_BIN="$HERE/bin/symm-store-interop" run store-interop python3 "$HERE/torch_interop.py" > "$log" 2>&1
  rc=$?
  cat "$log"
  if [ "$rc" -ne 0 ]; then
    echo "store-interop: FAILED (exit $rc): $(grep -E 'FAIL|INTEROP' "$log" | tail -1)"
  elif grep -q '^skipped' "$log"; then
    echo "store-interop: SKIPPED, NOT CHECKED: $(grep '^skipped' "$log" | head -1)"
  else
    echo "store-interop: PASSED ($(grep -c '^ok ' "$log") checks, torch clients on our server and our client on torch's servers)"
  fi
  rm -f "$log"
  return "$rc"
}

cmd_all() {
  local passed=0 failed=0
  for c in tests bench tp-layer anchors store-interop; do
    echo "==> run.sh $c" >&2
    if "cmd_${c//-/_}"; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "==> $c FAILED" >&2; fi
  done
  echo "all: $passed passed, $failed failed"
  [ "$failed" -eq 0 ]
}

case "${1:-}" in
  tests) shift; cmd_tests "$@" ;;
  bench) shift; cmd_bench "$@" ;;
  tp-layer) shift; cmd_tp_layer "$@" ;;
  anchors) shift; cmd_anchors "$@" ;;
  store-interop) shift; cmd_store_interop "$@" ;;
  all) shift; cmd_all "$@" ;;
  list) cat "$HERE/MANIFEST"; echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH" ;;
  *) sed -n '2,14p' "$0" >&2; exit 2 ;;
esac
