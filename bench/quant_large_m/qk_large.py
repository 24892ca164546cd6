# The library build.sh makes (libqk_large.so, or another build of it) through ctypes: its
# signatures, and the sm_90a kernel run with the workspace its schedule asks for. Shared by
# harness.py, ab.py and profile.py.
import ctypes, os

import torch

P = ctypes.c_void_p
TYPE = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
DEFAULT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libqk_large.so")


def stream():
    return P(torch.cuda.current_stream().cuda_stream)


class Library:
    def __init__(self, path=DEFAULT):
        lib = ctypes.CDLL(path)
        lib.qk_dequant.argtypes = [P, P, ctypes.c_int, P]
        lib.qk_wgmma_supported.argtypes = [P, P, ctypes.c_long, ctypes.c_int]
        lib.qk_wgmma.argtypes = [P, P, ctypes.c_long, P, P, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                 ctypes.c_int, P, P]
        lib.qk_wgmma_workspace.argtypes = [P, ctypes.c_long, ctypes.c_int, ctypes.c_int, ctypes.c_int]
        lib.qk_wgmma_workspace.restype = ctypes.c_long
        self.lib = lib
        self.sms = torch.cuda.get_device_properties(0).multi_processor_count
        self.workspaces = {}  # device buffers by size, reused across calls

    def supported(self, w, x, m):
        return self.lib.qk_wgmma_supported(w.vp, x.data_ptr(), m, TYPE[x.dtype])

    def wgmma(self, w, x, bias, out, rows, sms=None, schedule=0):
        """schedule: 0 automatic, 1 data-parallel, 2 stream-K (cuda::WgmmaSchedule)."""
        sms = sms or self.sms
        n = self.lib.qk_wgmma_workspace(w.vp, x.shape[0], rows, sms, schedule)
        assert n >= 0
        ws = self.workspaces.get(n)
        if ws is None:
            ws = self.workspaces[n] = torch.empty(max(n, 16), dtype=torch.uint8, device=x.device)
        assert self.lib.qk_wgmma(w.vp, x.data_ptr(), x.shape[0],
                                 bias.data_ptr() if bias is not None else None, out.data_ptr(),
                                 TYPE[x.dtype], rows, sms, schedule, ws.data_ptr() if n else None,
                                 stream()) == 0

    def dequant(self, w, wbuf):
        assert self.lib.qk_dequant(w.vp, wbuf.data_ptr(), TYPE[wbuf.dtype], stream()) == 0
