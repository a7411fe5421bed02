# call 6 (one GPU): GPT-2 preset, inductor knobs in the same call: as shipped, aggressive_fusion, coordinate descent, both
export PYTHONPATH=src:benchmarks/baselines TURBOTRAIN_CACHE=$PWD/.data
mkdir -p $OUT/r; R=$OUT/r
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/device.txt
python -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $R/device.txt; cat $R/device.txt
s=$(date +%s); t() { echo "   [$(( $(date +%s) - s )) s]"; }
left() { echo $(( 585 - $(date +%s) + s )); }
C="train.log_every=10 data.eval_batches=0 checkpoint.every=0 checkpoint.final=false run.out_dir='/tmp/g'"
AGG="import sys, torch._inductor.config as c; c.aggressive_fusion = True; sys.argv[0] = 'turbotrain'; from turbotrain.cli import main; raise SystemExit(main())"
tt() { name=$1; shift 1; echo "== tt $name"; timeout $(left) "$@" $C run.name=$name > $R/tt_$name.log 2>&1
  grep -E "step 100/|compile:|done|rror" $R/tt_$name.log | grep -v "compiling the model" | tail -3; cp /tmp/g/$name/metrics.jsonl $R/tt_$name.jsonl
  python -c "import json,statistics; v=[r['tokens_per_s'] for r in map(json.loads, open('$R/tt_$name.jsonl')) if r['step']>=30]; print('   median', round(statistics.median(v)), 'min', round(min(v)), 'max', round(max(v)))"; t; }
tt base python -m turbotrain train gpt2-124m train.steps=100
tt agg python -c "$AGG" train gpt2-124m train.steps=100
tt cdt python -m turbotrain train gpt2-124m train.steps=100 compile.coordinate_descent_tuning=true
tt agg_cdt python -c "$AGG" train gpt2-124m train.steps=100 compile.coordinate_descent_tuning=true
tt base2 python -m turbotrain train gpt2-124m train.steps=100
tt agg2 python -c "$AGG" train gpt2-124m train.steps=100
cd $OUT && tar czf r.tgz r && rm -rf r
