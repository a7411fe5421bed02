# call 2: cuBLASLt algorithms for the MLP epilogues; GPT-2 preset with the clip folded into fused AdamW vs not (same call)
export PYTHONPATH=src:benchmarks/baselines TURBOTRAIN_CACHE=$PWD/.data
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/device.txt
python -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $OUT/device.txt
s=$(date +%s); t() { echo "   [$(( $(date +%s) - s )) s]"; }
left() { echo $(( 575 - $(date +%s) + s )); }
echo "== algos"; timeout 150 python .gpu/algos.py > $OUT/algos.txt 2>&1; grep -E "^torch|==|best|rror" $OUT/algos.txt | cut -c1-400; t
C="train.log_every=10 data.eval_batches=0 checkpoint.every=0 checkpoint.final=false run.out_dir='/tmp/g'"
tt() { name=$1; shift 1; echo "== tt $name"; timeout $(left) "$@" $C run.name=$name > $OUT/tt_$name.log 2>&1
  grep -E "step [0-9]+0/|compile:|done|rror" $OUT/tt_$name.log | grep -v "compiling the model" | tail -3; cp /tmp/g/$name/metrics.jsonl $OUT/tt_$name.jsonl; t; }
tt fold python -m turbotrain train gpt2-124m train.steps=100
tt nofold python .gpu/nofold.py train gpt2-124m train.steps=100
tt fold2 python -m turbotrain train gpt2-124m train.steps=100
tt nofold2 python .gpu/nofold.py train gpt2-124m train.steps=100
