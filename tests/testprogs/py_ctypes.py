"""Traced program: Python -> C (libc's qsort through ctypes) -> Python callback -> busy leaf.
The stack must show it whole: py_main -> call_into_c -> [qsort ...] -> py_callback -> cb_leaf.
Runs for argv[1] seconds (default 2)."""
import ctypes
import ctypes.util
import sys
import time

libc = ctypes.CDLL(ctypes.util.find_library("c"))
CMP = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int))


def cb_leaf():
    total = 0
    for i in range(3000):
        total += i * i
    return total


def py_callback(a, b):
    cb_leaf()
    return a[0] - b[0]


callback = CMP(py_callback)


def call_into_c():
    values = (ctypes.c_int * 2)(2, 1)
    libc.qsort(values, 2, ctypes.sizeof(ctypes.c_int), callback)


def py_main(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        call_into_c()


if __name__ == "__main__":
    py_main(float(sys.argv[1]) if len(sys.argv) > 1 else 2.0)
