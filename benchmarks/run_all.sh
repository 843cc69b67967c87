#!/usr/bin/env bash
# Every benchmark of benchmarks/ (not part of CI's test run; see benchmarks/README.md).
# Run on a quiet machine from the repository root:  bash benchmarks/run_all.sh [OUTDIR]
# Results: one .txt per benchmark in OUTDIR (default /tmp/pflbench_benchmarks), also printed.
set -euo pipefail
out=${1:-/tmp/pflbench_benchmarks}
mkdir -p "$out"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
py=${PYTHON:-python}
bench() { name=$1; shift; echo "== $name"; "$@" 2>&1 | tee "$out/$name.txt"; }
bench engine_overhead $py -m pytest benchmarks/test_engine_overhead.py --benchmark-enable -p no:randomly -q
bench threads  $py benchmarks/bench_threads.py --out "$out/threads"
bench vmap     $py benchmarks/bench_vmap.py
bench eval     $py benchmarks/bench_eval.py
bench headline $py benchmarks/bench_headline.py --threads 1,2
bench memory   $py benchmarks/bench_memory.py --out "$out/memory"
if $py -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  bench vmap_gpu $py benchmarks/bench_vmap.py --device cuda --clients 20,100
  bench headline_gpu $py benchmarks/bench_headline.py --device cuda --threads 1 --samples 20000 --precision fp32,bf16
fi
echo "all benchmark outputs in $out"
