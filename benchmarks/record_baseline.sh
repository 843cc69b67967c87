#!/usr/bin/env bash
# Record rounds.jsonl of every built-in algorithm (small settings) into $1, to compare a
# refactoring's numbers bit for bit: benchmarks/compare_rounds.py BEFORE AFTER. (--val-frac 0: the
# numbers of runs without a validation split, comparable with baselines recorded before it existed.)
set -euo pipefail
out=${1:?usage: record_baseline.sh OUTDIR}
export OMP_NUM_THREADS=1 PFLBENCH_CACHE=${PFLBENCH_CACHE:-$out/cache}
base="--dataset digits --alpha 0.3 --num-clients 8 --rounds 3 --lr 0.05 --val-frac 0 --quiet"
lora="--pretrain-epochs 2 --rounds 2 --num-clients 6 --frac 0.5 --val-frac 0"
run() { name=$1; shift; pflbench run "$@" --out "$out/$name" > /dev/null; echo "recorded $name"; }
run fedavg   --algo fedavg   $base
run fedavg_m --algo fedavg   $base --momentum 0.9 --max-grad-norm 1.0 --frac 0.5
run fedprox  --algo fedprox  $base --mu 0.1
run local    --algo local    $base
run fedper   --algo fedper   $base
run fedper_h2 --algo fedper  $base --head-layers 2 --model mlp
run fedrep   --algo fedrep   $base --head-epochs 2
run fedavg_lora --algo fedavg --lora-rank 4 --dataset digits --alpha 0.3 --quiet $lora
run fedper_lora --algo fedper --lora-rank 4 --dataset digits --alpha 0.3 --quiet $lora
run flexlora --algo flexlora --rank-dist heavy-tail --rank-set 2,4,8 --dataset digits --alpha 0.3 --quiet $lora
run flexlora_homo --algo flexlora --rank-dist homo --lora-rank 4 --dataset digits --alpha 0.3 --quiet $lora
run fedsdg   --algo fedsdg --dataset digits --alpha 0.3 --quiet $lora
run fedavg_adam --algo fedavg $base --optimizer adam --lr 0.005 --weight-decay 0.001
run fedavg_wd --algo fedavg $base --momentum 0.5 --weight-decay 0.01
for algo in apfl ditto fedala fedbabu fedbn feddyn fedrod lgfedavg moon perfedavg pfedme scaffold; do
  run "$algo" --algo "$algo" $base --model cnn_bn
done
# every other built-in algorithm (so a refactoring is checked on all of them), the same small setting
for algo in fedadagrad fedadam fedamp fedas fedavgm fedcac fedcp feddbe fedem fedfomo fedgen fedkd fedmtl \
  fednova fedpac fedproto fedyogi floco flute gpfl ifca knnper pefll pfedfda pfedgraph pfedhn pflmoe; do
  run "$algo" --algo "$algo" $base --model cnn_bn
done
