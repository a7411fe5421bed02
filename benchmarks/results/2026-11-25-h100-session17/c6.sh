export PYTHONPATH=src; nvidia-smi --query-gpu=name --format=csv,noheader; timeout 150 python .gpu/s2d16.py 2>&1 | grep -v Warn | tail -3
