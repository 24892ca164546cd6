# One benchmark layer, side by side under a profiler: fp16 F.linear and the sm_90a kernel
# (libqk_large.so, see build.sh), each called a few times, for ncu to pick the launches it wants.
# Usage: python3 profile.py LAYER FORMAT M [ROWS] [SCHEDULE] [CALLS]
#   LAYER: a name of qk_common.SHAPES; FORMAT: int8 | nf4 | nf4dq; ROWS: 256 | 128 | 64;
#   SCHEDULE: 0 automatic, 1 data-parallel, 2 stream-K.
# Example: ncu --kernel-name regex:WgmmaLinear --launch-skip 2 --launch-count 1
#   --section SourceCounters --import-source yes -o prof python3 profile.py flux_mlp_up_3072x12288 int8 4096
import os, sys

import torch
import torch.nn.functional as F

args = sys.argv[1:] + [None] * 6
layer, fmt, m = args[0], args[1], int(args[2])
rows = int(args[3] or 256)
schedule = int(args[4] or 0)
calls = int(args[5] or 4)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "quant_small_m"))
from qk_common import layer_inputs  # noqa: E402
from qk_large import Library  # noqa: E402

w, wf, x, out = layer_inputs(layer, fmt, m)
lib = Library()
for _ in range(calls):
    F.linear(x, wf)
    lib.wgmma(w, x, None, out, rows, None, schedule)
torch.cuda.synchronize()
print(f"{layer} {fmt} M={m} rows={rows} schedule={schedule}: {calls} calls of each")
