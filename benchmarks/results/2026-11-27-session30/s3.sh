# session 30 call 3 (one GPU): exp30b.py (cuBLASLt's candidate algorithms for the two epilogue GEMMs), the optimizer's
# GPU tests on the one-launch-per-group kernel, then GPT-2 A B A B (weight copies on / off) with Accelerate and Fabric
python -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/whl/*.whl || exit 1
cd .gpu/final; export PYTHONPATH=src:benchmarks/baselines:..:/tmp/site TURBOTRAIN_CACHE=$PWD/.data PYTHONUNBUFFERED=1
mkdir -p $OUT/r; R=$OUT/r
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/device.txt
python -c "import torch, triton, accelerate, lightning, cudnn; print(torch.__version__, triton.__version__, accelerate.__version__, lightning.__version__, 'cudnn', torch.backends.cudnn.version(), 'frontend', cudnn.__version__)" >> $R/device.txt; cat $R/device.txt
cp COMMIT $R/commit.txt
s=$(date +%s); t() { echo "   [$(( $(date +%s) - s )) s]"; }
left() { echo $(( 585 - $(date +%s) + s )); }
C="train.log_every=10 data.eval_batches=0 checkpoint.every=0 checkpoint.final=false run.out_dir='/tmp/g'"
tt() { name=$1; steps=$2; shift 2; echo "== tt $name"; timeout $(left) python -m turbotrain train gpt2-124m train.steps=$steps "$@" $C run.name=$name compile.cache_dir=/tmp/cc_$name > $R/tt_$name.log 2>&1
  grep -E "step $steps/|optimizer:|rror" $R/tt_$name.log | tail -3; cp /tmp/g/$name/metrics.jsonl $R/tt_$name.jsonl; cp /tmp/g/$name/summary.json $R/tt_$name.summary.json; grep -oE "(optimizer_impl|weight_copies) = [a-z\"]*" /tmp/g/$name/config.toml | tr '\n' ' '; echo
  python -c "import json,statistics; v=[r['tokens_per_s'] for r in map(json.loads, open('$R/tt_$name.jsonl')) if r['step']>=30]; print('   median', round(statistics.median(v)), 'min', round(min(v)), 'max', round(max(v)), 'n', len(v))"; t; }
peer() { echo "== $1"; timeout $(left) python benchmarks/baselines/peer.py --framework $1 --workload gpt --compile-mode reduce-overhead > $R/$1.log 2>&1; tail -1 $R/$1.log | cut -c1-220; t; }
echo "== exp30b"; timeout 60 python ../exp30b.py > $R/exp30b.txt 2>&1; echo "rc=$?"; cut -c1-160 $R/exp30b.txt | head -30; t
echo "== GPU tests (optimizer)"; timeout 120 python -m pytest -q -m gpu -p no:cacheprovider tests/integration/test_triton_adamw_gpu.py > $R/gpu_tests.txt 2>&1; echo "rc=$?"; tail -n 1 $R/gpu_tests.txt; grep -E "^FAILED|^ERROR|^E " $R/gpu_tests.txt | head; t
tt copies 300
tt plain 300 precision.weight_copies=false
peer accelerate
peer fabric
tt copies2 300
tt plain2 300 precision.weight_copies=false
cd $OUT && tar czf r.tgz r && rm -rf r
