# session 23 call 1 (one GPU): after the red-team fixes — the GPT-2 preset as shipped vs Accelerate and Fabric (best settings)
# in one call, a preset run with checkpoints + final/ and its resume on the GPU, and the GPU tests
export PYTHONPATH=src:benchmarks/baselines:.gpu TURBOTRAIN_CACHE=$PWD/.data
mkdir -p $OUT/r; R=$OUT/r
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/device.txt
python -c "import torch, triton, accelerate, lightning; print(torch.__version__, triton.__version__, accelerate.__version__, lightning.__version__)" >> $R/device.txt; cat $R/device.txt
s=$(date +%s); t() { echo "   [$(( $(date +%s) - s )) s]"; }
left() { echo $(( 585 - $(date +%s) + s )); }
C="train.log_every=10 data.eval_batches=0 checkpoint.every=0 checkpoint.final=false run.out_dir='/tmp/g'"
tt() { name=$1; shift 1; echo "== tt $name"; timeout $(left) python -m turbotrain train gpt2-124m train.steps=100 "$@" $C run.name=$name compile.cache_dir=/tmp/cc_$name > $R/tt_$name.log 2>&1
  grep -E "step 100/|compile:|done|rror" $R/tt_$name.log | grep -v "compiling the model\|cold start" | tail -3; cp /tmp/g/$name/metrics.jsonl $R/tt_$name.jsonl
  python -c "import json,statistics; v=[r['tokens_per_s'] for r in map(json.loads, open('$R/tt_$name.jsonl')) if r['step']>=30]; print('   median', round(statistics.median(v)), 'min', round(min(v)), 'max', round(max(v)))"; t; }
peer() { echo "== $1"; timeout $(left) python benchmarks/baselines/peer.py --framework $1 --workload gpt --compile-mode reduce-overhead > $R/$1.log 2>&1; tail -1 $R/$1.log | cut -c1-220; t; }
tt shipped
peer accelerate
peer fabric
tt shipped2
echo "== checkpointed run, then its resume"
K="train.log_every=10 data.eval_batches=2 checkpoint.every=20 run.out_dir='/tmp/k' run.name=k"
timeout $(left) python -m turbotrain train gpt2-124m train.steps=40 $K > $R/ck1.log 2>&1; echo "rc=$?"; tail -2 $R/ck1.log
timeout $(left) python -m turbotrain train gpt2-124m train.steps=60 $K > $R/ck2.log 2>&1; echo "rc=$?"; grep -E "resumed|done|rror" $R/ck2.log | tail -3
ls /tmp/k/k /tmp/k/k/checkpoints /tmp/k/k/final > $R/ck_ls.txt 2>&1; t
if python -c "import pytest" 2>/dev/null; then
  echo "== GPU tests"; timeout $(left) python -m pytest -q -m gpu -p no:cacheprovider tests/integration/test_llama_fp8_gpu.py tests/faults/test_bad_inputs.py tests/integration/test_attention_auto.py tests/faults/test_redteam_s22_run.py $(ls tests/faults/test_redteam_s23_*.py 2>/dev/null) -x > $R/gpu_tests.txt 2>&1; echo "rc=$?"; tail -3 $R/gpu_tests.txt; t
else echo "no pytest in the image"; fi
cd $OUT && tar czf r.tgz r && rm -rf r
