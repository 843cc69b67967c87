#!/usr/bin/env bash
# Everything the project measures on a CUDA GPU, in one command with a bounded time (issue 25,
# item 4), for a lent GPU machine whose Python has torch but not necessarily this project's
# install (pflbench is imported from the checkout; datasets/Ray are not needed):
#   bash benchmarks/gpu_all.sh [OUTDIR]
# Each step is time-boxed and writes OUTDIR/NAME.log as it goes, so a step that runs out of time
# leaves the others' numbers. The headline job runs on random CIFAR-100-shaped data
# (benchmarks/cifar_shaped.py): its timings are real, its accuracies are chance.
set -uo pipefail
out=${1:-/tmp/pflbench_gpu}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 PFLBENCH_PROGRESS_EVERY=5
export PFLBENCH_CACHE=${PFLBENCH_CACHE:-$out/cache}
py=${PYTHON:-python3}
device=${DEVICE:-cuda}  # DEVICE=cpu: a dry run of the plumbing
step() { # NAME SECONDS COMMAND...: run with a time limit, log to OUTDIR/NAME.log
  local name=$1 limit=$2; shift 2
  echo "== $name (limit ${limit}s)"
  local started=$SECONDS
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  tail -n "${TAIL:-12}" "$out/$name.log"
  echo "== $name: rc $rc, $((SECONDS - started)) s"
}
# the headline job on CIFAR-shaped data on the device (a command, not a function: `timeout` runs it)
job=($py -c 'import sys; from pflbench.cli import main; sys.argv[0] = "pflbench"; main()' run
  --plugin benchmarks/cifar_shaped.py --algo fedsdg --dataset cifar100_shaped --alpha 0.1 --device "$device"
  --out "$out/runs")
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv | tee "$out/gpu.txt" || true
$py -c 'import torch; print("torch", torch.__version__, torch.cuda.is_available() and torch.cuda.get_device_name())' |
  tee -a "$out/gpu.txt"
# 1. the headline model's three stages vs plain loops, fp32 and bf16 (README "Speed")
step headline_bench "${LIMIT_BENCH:-130}" $py benchmarks/bench_headline.py --device $device --threads 1 \
  --samples "${SAMPLES:-20000}" --precision "${PRECISIONS:-fp32,bf16}"
# 2. every algorithm, 2 rounds on digits, on the device (tensors kept on it)
step every_algorithm "${LIMIT_E2E:-110}" env PFLBENCH_TEST_DEVICE=$device $py -m pytest -q -p no:cacheprovider \
  tests/algorithms/test_every_algorithm.py
# 3. the headline job: 2 pretraining epochs + 2 rounds, fp32 then bf16 (extrapolate per epoch and round)
step job_fp32 "${LIMIT_JOB:-60}" "${job[@]}" --pretrain-epochs 2 --rounds 2 ${JOB_OPTIONS:-}
step job_bf16 "${LIMIT_JOB:-60}" "${job[@]}" --pretrain-epochs 2 --rounds 2 --precision bf16 ${JOB_OPTIONS:-}
$py - "$out/runs" <<'PY' | tee "$out/job_times.txt"
import json, pathlib, sys
for run in sorted(p for p in pathlib.Path(sys.argv[1]).glob("runs/*") if (p / "rounds.jsonl").is_file()):
    rounds = [json.loads(line) for line in (run / "rounds.jsonl").read_text().splitlines() if line.strip()]
    summary = json.loads((run / "summary.json").read_text()) if (run / "summary.json").exists() else {}
    print(run.name, "wall", round(summary.get("wall_time_s", float("nan")), 1), "round, eval s",
          [(round(r["round_time_s"], 2), round(r.get("eval_time_s", 0.0), 2)) for r in rounds])
PY
# 4. many LoRA clients through one backbone pass vs one by one (and --executor vmap)
step multi_adapter "${LIMIT_MULTI:-80}" $py benchmarks/bench_multi_adapter.py --device $device \
  --clients "${MULTI_CLIENTS:-10,20,50}" --batches 4 --repeats 3 --vmap
# 5. --executor vmap vs sequential on the small models
step vmap "${LIMIT_VMAP:-40}" $py benchmarks/bench_vmap.py --device $device --clients 20,100 --out "$out/vmap"
# 6. every algorithm under bf16 autocast
step every_algorithm_bf16 "${LIMIT_E2E_BF16:-60}" env PFLBENCH_TEST_DEVICE=$device PFLBENCH_TEST_PRECISION=bf16 \
  $py -m pytest -q -p no:cacheprovider tests/algorithms/test_every_algorithm.py
echo "all logs in $out"
