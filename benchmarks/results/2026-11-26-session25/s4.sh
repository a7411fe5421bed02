# session 25 call D (two GPUs, NCCL): the stop vote of several ranks (LaggedVote, tree 61fc98c in .gpu/final) —
# a SIGTERM on rank 1 only at step 3 with log_every=1000 must stop both ranks at step 4 with a checkpoint; and what the
# per-step vote costs DDP: gpt2-124m on 2 GPUs, before (023e4c6, .gpu/old) and after, A B A B
mkdir -p $OUT/r; R=$OUT/r; ROOT=$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/device.txt; cat $R/device.txt
s=$(date +%s); t() { echo "   [$(( $(date +%s) - s )) s]"; }
C="train.log_every=10 data.eval_batches=0 checkpoint.every=0 checkpoint.final=false"
ddp() { tree=$1; name=$2; echo "== ddp $name ($tree)"; cd $ROOT/.gpu/$tree; export PYTHONPATH=src:tests TURBOTRAIN_CACHE=$PWD/.data
  timeout 200 python -m torch.distributed.run --standalone --nproc_per_node=2 -m turbotrain train gpt2-124m parallel.strategy=ddp train.steps=80 $C run.out_dir="'/tmp/d'" run.name=$name > $R/ddp_$name.log 2>&1; echo "rc=$?"
  grep -E "done|rror" $R/ddp_$name.log | tail -2; cp /tmp/d/$name/metrics.jsonl $R/ddp_$name.jsonl
  python -c "import json,statistics; v=[r['tokens_per_s'] for r in map(json.loads, open('$R/ddp_$name.jsonl')) if r['step']>=30]; print('   median', round(statistics.median(v)), 'min', round(min(v)), 'max', round(max(v)))"; t; }
ddp final new1
ddp old old1
ddp final new2
ddp old old2
echo "== SIGTERM on rank 1 at step 3, log_every=1000"; cd $ROOT/.gpu/final; export PYTHONPATH=src:tests
timeout 200 python -m torch.distributed.run --standalone --nproc_per_node=2 -m turbotrain train gpt2-124m parallel.strategy=ddp train.steps=300 train.log_every=1000 checkpoint.every=1000 data.eval_batches=0 run.out_dir="'/tmp/s'" run.name=sig 'train.callbacks=["userpkg.redteam_s24_dist:TermRank1AtStep3"]' > $R/sig.log 2>&1; echo "rc=$?"
grep -E "SIGTERM|stopped|saved|rror|exitcode" $R/sig.log | head -8; ls /tmp/s/sig/checkpoints > $R/sig_ls.txt 2>&1; cat $R/sig_ls.txt; t
cd $OUT && tar czf r.tgz r && rm -rf r
