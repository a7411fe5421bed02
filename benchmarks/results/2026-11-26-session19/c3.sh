# call 3: the GELU-in-the-GEMM MLP op (forward GELU_AUX_BIAS, backward torch) in isolation and in the GPT-2 step
export PYTHONPATH=src:benchmarks/baselines TURBOTRAIN_CACHE=$PWD/.data
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/device.txt
python -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $OUT/device.txt
s=$(date +%s); t() { echo "   [$(( $(date +%s) - s )) s]"; }
left() { echo $(( 575 - $(date +%s) + s )); }
echo "== mlp.py"; timeout 200 python .gpu/mlp.py > $OUT/mlp.txt 2>&1; grep -E "rel err|fwd\+bwd|ms  x|---" $OUT/mlp.txt | cut -c1-160; t
C="train.log_every=10 data.eval_batches=0 checkpoint.every=0 checkpoint.final=false run.out_dir='/tmp/g'"
tt() { name=$1; shift 1; echo "== tt $name"; timeout $(left) "$@" $C run.name=$name > $OUT/tt_$name.log 2>&1
  grep -E "step [0-9]+0/|compile:|done|rror" $OUT/tt_$name.log | grep -v "compiling the model" | tail -3; cp /tmp/g/$name/metrics.jsonl $OUT/tt_$name.jsonl; t; }
tt base python -m turbotrain train gpt2-124m train.steps=100
tt mlp python .gpu/mlp_step.py train gpt2-124m train.steps=100
tt base2 python -m turbotrain train gpt2-124m train.steps=100
tt mlp2 python .gpu/mlp_step.py train gpt2-124m train.steps=100
