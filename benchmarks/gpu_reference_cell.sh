#!/usr/bin/env bash
# One reference cell (fmnist-dir0.1, FedAvg: its 6 tuning trials + default/tuned × 3 seeds) on a CUDA
# GPU, timed: the measurement behind "when a GPU is lent, state the regeneration time" (issue 35).
# For a lent machine whose python3 has torch but not this project's install nor Optuna and no
# /usr/share/datasets/fashion-mnist (nothing can be fetched there). Prepare here, in the checkout:
#   mkdir -p .gpucarry/fmnist && cp /usr/share/datasets/fashion-mnist/* .gpucarry/fmnist/
#   pip download optuna -d .gpucarry/wheels --python-version 3.12 --only-binary=:all:   # the device's Python
#   echo /.gpucarry/ >> .git/info/exclude
# then on the device (carry .gpucarry):  bash benchmarks/gpu_reference_cell.sh [OUTDIR]
# JOBS="1 4" times the cell at each --jobs; LIMIT caps each (s). CPU dry run: DEVICE=cpu LIMIT=60.
set -uo pipefail
out=${1:-${OUT:-/tmp/gref_out}}; mkdir -p "$out"
carry=${CARRY:-.gpucarry}
if [[ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]]; then
  mkdir -p /usr/share/datasets/fashion-mnist && cp "$carry"/fmnist/* /usr/share/datasets/fashion-mnist/
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
$py -c 'import optuna' 2>/dev/null ||
  $py -m pip install -q --no-index --find-links "$carry/wheels" optuna >"$out/optuna_install.log" 2>&1
$py -c 'from pflbench.registry import ALGORITHMS; assert ALGORITHMS.names()' 2>/dev/null ||
  $py -m pip install -q --no-deps --no-build-isolation --no-index -e . >"$out/install.log" 2>&1
device=${DEVICE:-cuda}
pfl=("$py" -c 'import sys; from pflbench.cli import main; sys.argv[0] = "pflbench"; main()')
{ nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null; echo "cpus $(nproc --all); device $device"; } | tee "$out/ref_gpu.txt"
root=$(mktemp -d /tmp/gref.XXXXXX)
mkdir -p "$root/fmnist-dir0.1"
sed "s/^threads = 1 .*/threads = 1\ndevice = \"$device\"/" results/reference/fmnist-dir0.1/scenario.toml >"$root/fmnist-dir0.1/scenario.toml"
start=$SECONDS # one plain run first: seconds per round of this scenario's FedAvg
timeout "${LIMIT:-240}" "${pfl[@]}" run --algo fedavg --dataset fashion_mnist --partition dirichlet --alpha 0.1 \
  --num-clients 20 --new-clients 0.1 --test-frac 0.25 --val-frac 0.1 --rounds 25 --batch-size 64 --model mlp \
  --model-option hidden=100 --eval-every 1 --threads 1 --device "$device" --out "$root/plain" >"$out/ref_plain.log" 2>&1
echo "plain fedavg, 25 rounds on $device: rc $? $((SECONDS - start)) s" | tee -a "$out/ref_times.txt"
for jobs in ${JOBS:-4}; do
  start=$SECONDS
  timeout "${LIMIT:-240}" "${pfl[@]}" reference "$root" --work "$root/work-$jobs" --scenario fmnist-dir0.1 \
    --algo fedavg --jobs "$jobs" --no-artifacts >"$out/ref_cell_$jobs.log" 2>&1
  echo "reference cell fedavg (tuning + 6 runs), --jobs $jobs on $device: rc $? $((SECONDS - start)) s" | tee -a "$out/ref_times.txt"
  tail -n 8 "$out/ref_cell_$jobs.log"
done
