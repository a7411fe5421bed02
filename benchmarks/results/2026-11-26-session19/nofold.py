import sys
import turbotrain.accel.optim as o
o.folds_clip = lambda opt: False  # the A/B: clip as its own pass
from turbotrain.cli import main
sys.argv[0] = "turbotrain"
raise SystemExit(main())
