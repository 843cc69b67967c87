#!/usr/bin/env bash
# The cross-device comparison (issue 39) on a CUDA GPU, time-boxed (~5 min in all): pflbench and
# PFLlib side by side on 1,000 CIFAR-shaped clients, 50 per round, batch 10, one local epoch,
# PFLlib's FedAvgCNN, FedAvg and FedPer, both with --device cuda (PFLlib -dev cuda), plus the
# host→device copies of one pflbench round. For a lent machine whose Python has torch but not
# necessarily this project's install (pflbench is imported from the checkout):
#   bash benchmarks/gpu_cross_device.sh [--pfllib DIR] [OUTDIR]
# PFLlib: --pfllib DIR, else $PFLLIB_DIR, else the checkout's ignored .pfllib/PFLlib (its missing
# dependencies from .pfllib/site, else stand-ins: see bench_cross_device.py); without one,
# pflbench alone. A dry run on a CPU at a tiny size:
#   DEVICE=cpu CLIENTS=20 BENCH_OPTIONS="--train-samples 400 --test-samples 80" bash benchmarks/gpu_cross_device.sh Results: OUTDIR (default $OUT if set, else /tmp/pflbench_xdev)/cross_device/
# results.json + results.txt, written after each case, and the logs of every step.
set -uo pipefail
pfllib=${PFLLIB_DIR:-}
[[ -z $pfllib && -f .pfllib/PFLlib/system/main.py ]] && pfllib=.pfllib/PFLlib
if [[ ${1:-} == --pfllib ]]; then pfllib=$2; shift 2; fi
out=${1:-${OUT:-/tmp/pflbench_xdev}}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
export PFLBENCH_CACHE=${PFLBENCH_CACHE:-$out/cache}
py=${PYTHON:-python3}
device=${DEVICE:-cuda} # DEVICE=cpu: a dry run of the plumbing
clients=${CLIENTS:-1000}
work=${WORK:-$(mktemp -d /tmp/xdev_gpu.XXXXXX)}
step() { # NAME SECONDS COMMAND...: run with a time limit, log to OUTDIR/NAME.log
  local name=$1 limit=$2
  shift 2
  echo "== $name (limit ${limit}s)"
  local started=$SECONDS
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  tail -n "${TAIL:-16}" "$out/$name.log"
  echo "== $name: rc $rc, $((SECONDS - started)) s"
}
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv | tee "$out/gpu.txt" || true
$py -c 'import torch; print("torch", torch.__version__, torch.cuda.is_available() and torch.cuda.get_device_name())' |
  tee -a "$out/gpu.txt"
# the built-in algorithms are entry points: registered only once the package is installed
$py -c 'from pflbench.registry import ALGORITHMS; assert ALGORITHMS.names()' 2>/dev/null ||
  $py -m pip install -q --no-deps --no-build-isolation --no-index -e . >"$out/install.log" 2>&1
bench=($py benchmarks/bench_cross_device.py --device "$device" --clients "$clients" --work "$work" ${BENCH_OPTIONS:-})
[[ -n $pfllib ]] && bench+=(--pfllib "$pfllib")
# the data folder first (16 writer processes on the lent machine), then the alternated runs:
# PFLlib ~1-2 min per algorithm at 1,000 clients (its round 0 evaluates every client), pflbench
# well under one; the copies count runs one round in-process after each pair
step data "${LIMIT_DATA:-45}" "${bench[@]}" --data-only
step cross_device "${LIMIT_BENCH:-250}" "${bench[@]}" --rounds "${ROUNDS:-3}" --repeats "${REPEATS:-1}" \
  --algos "${ALGOS:-fedavg,fedper}" --count-copies --out "$out/cross_device"
echo "all logs in $out"
