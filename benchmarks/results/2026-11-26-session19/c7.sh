# call 7 (one GPU): GPU tests after the clip fold (fused AdamW/SGD on CUDA take the clip as grad_scale)
export PYTHONPATH=src TURBOTRAIN_CACHE=$PWD/.data
mkdir -p $OUT/r; R=$OUT/r
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/device.txt
python -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $R/device.txt; cat $R/device.txt
timeout 500 python -m pytest -q -m gpu -p no:cacheprovider tests/unit/test_optim_flops.py tests/integration/test_profile.py \
  tests/integration/test_attention_auto.py tests/unit/test_fused_loss.py 2>&1 | tail -25 | tee $R/tests.txt
cd $OUT && tar czf r.tgz r && rm -rf r
