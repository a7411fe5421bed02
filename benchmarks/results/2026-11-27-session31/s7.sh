# session 31 call 7 (one GPU): GPU tests of cublaslt, the fused loss and the GELU epilogue; then GPT-2 A B A B: the
# tree with the head's GEMMs by cuBLASLt's timed choice (7da2537) against the tree before (4cb99a8), peers between
python -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/whl/*.whl || exit 1
cd .gpu/final; export PYTHONPATH=src:benchmarks/baselines:..:/tmp/site TURBOTRAIN_CACHE=$PWD/.data PYTHONUNBUFFERED=1
mkdir -p $OUT/r; R=$OUT/r
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/device.txt
python -c "import torch, triton, accelerate, lightning, cudnn; print(torch.__version__, triton.__version__, accelerate.__version__, lightning.__version__, 'cudnn', torch.backends.cudnn.version(), 'frontend', cudnn.__version__)" >> $R/device.txt; cat $R/device.txt
cp COMMIT $R/commit.txt
s=$(date +%s); t() { echo "   [$(( $(date +%s) - s )) s]"; }
left() { echo $(( 590 - $(date +%s) + s )); }
echo "== GPU tests"; timeout 120 python -m pytest -q -m gpu -p no:cacheprovider tests/integration/test_cublaslt_gpu.py tests/unit/test_fused_loss.py tests/unit/test_gelu_epilogue.py tests/integration/test_gelu_epilogue_gpu.py > $R/gpu_tests.txt 2>&1; echo "rc=$?"; tail -n 1 $R/gpu_tests.txt; grep -E "^FAILED|^ERROR|^E " $R/gpu_tests.txt | head; t
C="train.log_every=10 data.eval_batches=0 checkpoint.every=0 checkpoint.final=false run.out_dir='/tmp/g'"
med() { python -c "import json,statistics; v=[r['tokens_per_s'] for r in map(json.loads, open('$1')) if r['step']>=30]; print('   median', round(statistics.median(v)), 'min', round(min(v)), 'max', round(max(v)), 'n', len(v))"; }
tt() { name=$1; dir=$2; echo "== tt $name ($dir)"; (cd ../$dir && PYTHONPATH=src:/tmp/site timeout $(left) python -m turbotrain train gpt2-124m train.steps=240 $C run.name=$name compile.cache_dir=/tmp/cc_$dir > $R/tt_$name.log 2>&1)
  grep -E "step 240/|rror" $R/tt_$name.log | tail -2; cp /tmp/g/$name/metrics.jsonl $R/tt_$name.jsonl; med $R/tt_$name.jsonl; t; }
peer() { echo "== $1 $2"; timeout $(left) python benchmarks/baselines/peer.py --framework $1 --workload gpt --compile-mode reduce-overhead > $R/$1$2.log 2>&1; tail -1 $R/$1$2.log | cut -c1-200; t; }
tt new final
tt old old
peer accelerate 1
tt new2 final
tt old2 old
peer fabric
tt new3 final
peer accelerate 2
cd $OUT && tar czf r.tgz r && rm -rf r
