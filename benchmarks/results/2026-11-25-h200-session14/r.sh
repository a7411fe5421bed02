# call R: GPT-2 124M on one H200, same call: the fused loss with its new row kernel and one chunk, with and without
# coordinate-descent tuning, the preset (fused loss off), Accelerate and plain PyTorch with CUDA graphs
export PYTHONPATH=src:benchmarks/baselines TURBOTRAIN_CACHE=$PWD/.data
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/device.txt
python -c "import torch, accelerate; print(torch.__version__, accelerate.__version__)" >> $OUT/device.txt
s=$(date +%s); t() { echo "   [$(( $(date +%s) - s )) s]"; }
left() { echo $(( 585 - $(date +%s) + s )); }
echo "== gpu tests"; timeout 90 python -m pytest -q -p no:cacheprovider tests/unit/test_fused_loss.py 2>&1 | tail -3; t
G="train.steps=100 train.log_every=10 data.eval_batches=0 checkpoint.every=0 checkpoint.final=false run.out_dir='/tmp/g'"
tt() { name=$1; shift; echo "== tt $name"; timeout $(left) python -m turbotrain train gpt2-124m $G run.name=$name "$@" > $OUT/tt_$name.log 2>&1
  grep -E "step (50|100)/|compile:|done|rror" $OUT/tt_$name.log | grep -v "compiling the model"; cp /tmp/g/$name/metrics.jsonl $OUT/tt_$name.jsonl; t; }
peer() { echo "== $1"; timeout $(left) python benchmarks/baselines/$2 --compile-mode reduce-overhead > $OUT/$1.log 2>&1; tail -1 $OUT/$1.log; t; }
tt fused kernels.fused_loss=true
peer accelerate "peer.py --framework accelerate --workload gpt"
tt preset
peer plain plain_gpt.py
tt fused_cdt kernels.fused_loss=true compile.coordinate_descent_tuning=true
