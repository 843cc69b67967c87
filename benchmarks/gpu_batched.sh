#!/usr/bin/env bash
# Batched clients on the cross-device shape (issue 39) on a CUDA GPU, time-boxed (~3-4 min, at
# most LIMIT + ~20 s): benchmarks/bench_batched.py on 1,000 CIFAR-shaped clients, 50 per round,
# batch 10, one local epoch, PFLlib's FedAvgCNN, FedAvg (ALGOS=fedavg,fedper: also FedPer, ~+100 s),
# in this order:
#   runs   `pflbench run` --executor sequential, --executor vmap, then PFLlib (if set up), child
#          processes on the same data folder: s/round (no evaluation), samples/s, GPU util/memory
#   check  vmap vs sequential on 24 clients of 1-12 steps (unequal sizes), FedAvg and FedPer:
#          the largest difference of an upload, a private head, a loss
#   micro  one round's training of 50 and of 200 clients: sequential / vmap executors, the bare
#          eager loop, one vmapped step per step index, then both as CUDA graphs (each against
#          the sequential executor's numbers)
# For a lent machine whose Python has torch but not necessarily this project's install (pflbench
# is imported from the checkout; carry .pfllib for PFLlib):
#   bash benchmarks/gpu_batched.sh [--pfllib DIR] [OUTDIR]
# PFLlib: --pfllib DIR, else $PFLLIB_DIR, else the checkout's ignored .pfllib/PFLlib (stand-ins
# for its missing dependencies: bench_cross_device.py); without one, pflbench alone. Dry run on a
# CPU at a tiny size (~3 min on a busy 2-core machine):
#   DEVICE=cpu CLIENTS=20 MICRO_CLIENTS=5,8 ROUNDS=1 BATCHED_OPTIONS="--train-samples 1000 --test-samples 200 --join-ratio 0.25 --check-clients 10 --micro-repeats 2" bash benchmarks/gpu_batched.sh /tmp/batched_dry
# Results: OUTDIR (default $OUT if set, else /tmp/pflbench_batched)/results.json + results.txt,
# written after each part, and the child runs' logs in OUTDIR/logs (the data and run folders stay
# in WORK, default a fresh /tmp folder: ~0.7 GB of data, not worth sending back).
set -uo pipefail
pfllib=${PFLLIB_DIR:-}
[[ -z $pfllib && -f .pfllib/PFLlib/system/main.py ]] && pfllib=.pfllib/PFLlib
if [[ ${1:-} == --pfllib ]]; then pfllib=$2; shift 2; fi
out=${1:-${OUT:-/tmp/pflbench_batched}}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
py=${PYTHON:-python3}
device=${DEVICE:-cuda}
work=${WORK:-$(mktemp -d /tmp/batched_gpu.XXXXXX)}
export PFLBENCH_CACHE=${PFLBENCH_CACHE:-$work/cache}
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv 2>/dev/null | tee "$out/gpu.txt"
$py -c 'import torch; print("torch", torch.__version__, torch.cuda.is_available() and torch.cuda.get_device_name())' |
  tee -a "$out/gpu.txt"
# the built-in algorithms are entry points: registered only once the package is installed
$py -c 'from pflbench.registry import ALGORITHMS; assert ALGORITHMS.names()' 2>/dev/null ||
  $py -m pip install -q --no-deps --no-build-isolation --no-index -e . >"$out/install.log" 2>&1
bench=($py benchmarks/bench_batched.py --device "$device" --clients "${CLIENTS:-1000}" --work "$work")
bench+=(--rounds "${ROUNDS:-3}" --repeats "${REPEATS:-1}" --micro-clients "${MICRO_CLIENTS:-50,200}")
bench+=(--parts "${PARTS:-runs,check,micro}" --algos "${ALGOS:-fedavg}" --out "$out" ${BATCHED_OPTIONS:-})
[[ -n $pfllib ]] && bench+=(--pfllib "$pfllib")
started=$SECONDS
timeout "${LIMIT:-330}" "${bench[@]}" 2>&1 | tee "$out/bench.log"
echo "== bench_batched: rc ${PIPESTATUS[0]}, $((SECONDS - started)) s; results in $out/results.txt"
mkdir -p "$out/logs"
cp "$work"/K*/*.log "$out/logs/" 2>/dev/null
true
