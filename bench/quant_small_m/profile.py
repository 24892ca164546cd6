# One benchmark layer under a profiler: fp16 F.linear and the small-M tensor-core kernel
# (libqk_new.so, see build.sh), each called a few times, for ncu to pick the launches it wants.
# Usage: python3 profile.py LAYER FORMAT M [TILES SPLITS] (0 = automatic)
#   LAYER: a name of qk_common.SHAPES; FORMAT: int8 | nf4 | nf4dq.
# Example: ncu --kernel-name regex:MmaLinearKernel --launch-skip 2 --launch-count 1
#   --section SourceCounters --import-source yes -o prof python3 profile.py sdxl_ff_1280x10240 nf4 1
import ctypes, os, sys

import torch
import torch.nn.functional as F

from qk_common import layer_inputs

args = sys.argv[1:] + ["0"] * 6
layer, fmt, m = args[0], args[1], int(args[2])
tiles, splits = (int(v) for v in args[3:5])
w, wf, x, out = layer_inputs(layer, fmt, m)
lib = ctypes.CDLL(os.path.join(os.path.dirname(os.path.abspath(__file__)), "libqk_new.so"))
P, I = ctypes.c_void_p, ctypes.c_int
lib.qk_mma_shape.argtypes = [P, P, ctypes.c_long, P, P, I, I, I, I, I, P]
sms = torch.cuda.get_device_properties(0).multi_processor_count
for _ in range(4):
    F.linear(x, wf)
    assert lib.qk_mma_shape(w.vp, x.data_ptr(), m, None, out.data_ptr(), 1, sms, 1, tiles, splits,
                            P(torch.cuda.current_stream().cuda_stream)) == 0
torch.cuda.synchronize()
