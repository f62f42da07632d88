#!/usr/bin/env python3
"""Holds GPU memory so that a check can run kvd on a nearly full device (serve_check.sh's
headroom phase), through the CUDA driver (libcuda.so.1) with ctypes: no PyTorch needed.

Usage: device_hog.py LEAVE_MIB. Allocates all but LEAVE_MIB of GPU 0's free memory, prints
"device_hog: held N MiB; free M MiB of T MiB" and sleeps until killed. Exit status 1 when
the driver fails (naming the call), 2 on a usage error.
"""
import ctypes
import sys
import time


def main(argv):
    if len(argv) != 2 or not argv[1].isdigit():
        print("usage: device_hog.py LEAVE_MIB", file=sys.stderr)
        return 2
    leave = int(argv[1]) << 20
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as err:
        print(f"device_hog: {err}", file=sys.stderr)
        return 1

    def check(code, call):
        if code != 0:
            raise RuntimeError(f"{call} failed with CUresult {code}")

    try:
        check(cuda.cuInit(0), "cuInit")
        device = ctypes.c_int()
        check(cuda.cuDeviceGet(ctypes.byref(device), 0), "cuDeviceGet")
        context = ctypes.c_void_p()
        check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device),
              "cuDevicePrimaryCtxRetain")
        check(cuda.cuCtxSetCurrent(context), "cuCtxSetCurrent")
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        check(cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)), "cuMemGetInfo")
        want = max(0, free.value - leave)
        held = 0
        pointers = []
        piece = 1 << 30
        while want - held >= 2 << 20:  # whole 2 MiB pages, in pieces of at most 1 GiB
            size = min(piece, (want - held) & ~((2 << 20) - 1))
            pointer = ctypes.c_uint64()
            check(cuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(size)),
                  f"cuMemAlloc of {size} bytes")
            pointers.append(pointer)
            held += size
        check(cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)), "cuMemGetInfo")
    except RuntimeError as err:
        print(f"device_hog: {err}", file=sys.stderr)
        return 1
    print(f"device_hog: held {held >> 20} MiB; free {free.value >> 20} MiB of "
          f"{total.value >> 20} MiB", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
