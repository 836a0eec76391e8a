"""Traced program: a known Python chain with recursion, for every interpreter version.
main_loop -> outer -> middle -> recurse x6 -> leaf (busy). Runs for argv[1] seconds of its own CPU time
(default 2): a busy machine gives as many samples, later."""
import sys
import time


def leaf():
    total = 0
    for i in range(2000):
        total += i * i
    return total


def recurse(n):
    if n == 0:
        return leaf()
    return recurse(n - 1) + 1


def middle():
    return recurse(5)


def outer():
    return middle()


def main_loop(seconds):
    end = time.process_time() + seconds
    while time.process_time() < end:
        outer()


if __name__ == "__main__":
    main_loop(float(sys.argv[1]) if len(sys.argv) > 1 else 2.0)
