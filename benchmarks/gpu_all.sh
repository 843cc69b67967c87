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
# the built-in algorithms are entry points: registered only once the package is installed
$py -c 'from pflbench.registry import ALGORITHMS; assert ALGORITHMS.names()' 2>/dev/null ||
  $py -m pip install -q --no-deps --no-build-isolation --no-index -e . >"$out/install.log" 2>&1
steps=",${STEPS:-bench,e2e,job,multi,vmap,e2e_bf16},"  # STEPS=job,multi: a subset
want() { [[ $steps == *",$1,"* ]]; }
# bench: the headline model's three stages vs plain loops, fp32 and bf16 (README "Speed")
want bench && step headline_bench "${LIMIT_BENCH:-130}" $py benchmarks/bench_headline.py --device $device \
  --threads 1 --samples "${SAMPLES:-20000}" --precision "${PRECISIONS:-fp32,bf16}"
# e2e: every algorithm, 2 rounds on digits, on the device (tensors kept on it)
want e2e && step every_algorithm "${LIMIT_E2E:-110}" env PFLBENCH_TEST_DEVICE=$device $py -m pytest -q \
  -p no:cacheprovider tests/algorithms/test_every_algorithm.py
# job: the headline job (1 pretraining epoch, 1 round), sequential then --executor vmap (the
# backbone cached by the first); FlexLoRA (per-client ranks, random backbone) likewise
if want job; then
  step job_sequential "${LIMIT_JOB:-60}" "${job[@]}" --pretrain-epochs 1 --rounds 1 ${JOB_OPTIONS:-}
  step job_vmap "${LIMIT_JOB:-60}" "${job[@]}" --pretrain-epochs 1 --rounds 1 --executor vmap ${JOB_OPTIONS:-}
  flexlora=("${job[@]}" --algo flexlora --rank-dist uniform --backbone random --rounds 1 ${JOB_OPTIONS:-})
  step flexlora_sequential "${LIMIT_JOB:-60}" "${flexlora[@]}"
  step flexlora_vmap "${LIMIT_JOB:-60}" "${flexlora[@]}" --executor vmap
  $py - "$out/runs" <<'PY' | tee "$out/job_times.txt"
import json, pathlib, sys
for run in sorted(p for p in pathlib.Path(sys.argv[1]).glob("runs/*") if (p / "rounds.jsonl").is_file()):
    config = json.loads((run / "config.json").read_text())
    rounds = [json.loads(line) for line in (run / "rounds.jsonl").read_text().splitlines() if line.strip()]
    print(config.get("algo"), config.get("executor"), config.get("precision"), "(round s, eval s):",
          [(round(r["round_time_s"], 2), round(r.get("eval_time_s", 0.0), 2)) for r in rounds],
          "pers_acc", [round(r["pers_acc"], 4) for r in rounds])
PY
fi
# multi: many LoRA clients through one backbone pass vs one by one, and --executor vmap
want multi && step multi_adapter "${LIMIT_MULTI:-80}" $py benchmarks/bench_multi_adapter.py --device $device \
  --clients "${MULTI_CLIENTS:-10,20,50}" --batches 4 --repeats 3 --vmap
# vmap: --executor vmap vs sequential on the small models
want vmap && step vmap "${LIMIT_VMAP:-40}" $py benchmarks/bench_vmap.py --device $device --clients 20,100 \
  --out "$out/vmap"
# e2e_bf16: every algorithm under bf16 autocast
want e2e_bf16 && step every_algorithm_bf16 "${LIMIT_E2E_BF16:-60}" env PFLBENCH_TEST_DEVICE=$device \
  PFLBENCH_TEST_PRECISION=bf16 $py -m pytest -q -p no:cacheprovider tests/algorithms/test_every_algorithm.py
echo "all logs in $out"
