"""The few machine operations the compiled kernel needs that Numba does not
offer, as Numba intrinsics (LLVM IR emitted in place: no call overhead, and
they cache with the functions that use them).

- ``prefetch(a, i)``: ask the CPU to start loading ``a[i]`` into cache now
  (LLVM's ``llvm.prefetch``; a hint: no fault, no effect on results). An
  SGD epoch in random order is bound by memory latency: each example's row
  (indices, values, label) and the weights it touches are cache misses. The
  order is known in advance, so the loop prefetches the rows a few examples
  ahead (``kernel``), as scikit-learn's loop does not.
- ``fetch_add(a, i, v)``: atomic add on an int64 array (sequentially
  consistent), returning the old value: how threads claim work.
- ``atomic_add_float(a, i, v)``: atomic add on a float32/float64 array (LLVM's
  ``atomicrmw fadd``, a compare-and-swap loop on x86): how threads add
  their change of the intercept (and of the average's sums) to the shared
  one without losing another's.
- ``fetch_max_f64(a, i, v)``: atomic ``a[i] = max(a[i], v)`` on a float64
  array of non-negative values (a signed integer max on their bits, which
  order as the values do), returning the old value: how threads move each
  average weight's time stamp forward only.
- ``load_acquire(a, i)`` / ``store_release(a, i, v)``: a counter one thread
  raises after writing data and another reads before reading that data
  (on x86 plain moves; on weaker CPUs, the fences they need).
- ``monotonic_ns()``: ``clock_gettime(CLOCK_MONOTONIC)`` in nanoseconds, the
  clock of Python's ``time.monotonic_ns`` (a vDSO call, no system call);
  how a thread times its own work without returning to Python.
"""
from __future__ import annotations

import time

from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic


def _array_slot(context, builder, signature, args):
    aryty = signature.args[0]
    ary = context.make_array(aryty)(context, builder, args[0])
    return cgutils.get_item_pointer(context, builder, aryty, ary, [args[1]], wraparound=False)


@intrinsic
def prefetch(typingctx, arr, idx):
    if not isinstance(arr, types.Array) or not isinstance(idx, types.Integer):
        return None
    sig = types.void(arr, idx)

    def codegen(context, builder, signature, args):
        ptr = _array_slot(context, builder, signature, args)
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
            "llvm.prefetch.p0i8")
        # read, high temporal locality, data cache
        builder.call(fn, [builder.bitcast(ptr, i8p), i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def fetch_add(typingctx, arr, idx, val):
    """``old = a[i]; a[i] += v`` as one atomic step (int64 array); returns old."""
    if not (isinstance(arr, types.Array) and arr.dtype == types.int64):
        return None
    sig = types.int64(arr, idx, val)

    def codegen(context, builder, signature, args):
        v = context.cast(builder, args[2], signature.args[2], types.int64)
        return builder.atomic_rmw("add", _array_slot(context, builder, signature, args), v,
                                  "seq_cst")

    return sig, codegen


@intrinsic
def atomic_add_float(typingctx, arr, idx, val):
    """``a[i] += v`` as one atomic step (float32 or float64 array); returns
    the old value."""
    if not (isinstance(arr, types.Array) and arr.dtype in (types.float32, types.float64)):
        return None
    sig = arr.dtype(arr, idx, val)

    def codegen(context, builder, signature, args):
        v = context.cast(builder, args[2], signature.args[2], signature.args[0].dtype)
        return builder.atomic_rmw("fadd", _array_slot(context, builder, signature, args), v,
                                  "seq_cst")

    return sig, codegen


@intrinsic
def fetch_max_f64(typingctx, arr, idx, val):
    """``old = a[i]; a[i] = max(old, v)`` as one atomic step (float64 array,
    values >= 0); returns old."""
    if not (isinstance(arr, types.Array) and arr.dtype == types.float64):
        return None
    sig = types.float64(arr, idx, val)

    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        v = context.cast(builder, args[2], signature.args[2], types.float64)
        ptr = builder.bitcast(_array_slot(context, builder, signature, args), i64.as_pointer())
        old = builder.atomic_rmw("max", ptr, builder.bitcast(v, i64), "seq_cst")
        return builder.bitcast(old, ir.DoubleType())

    return sig, codegen


@intrinsic
def load_acquire(typingctx, arr, idx):
    """``a[i]`` (int64 array), loaded with acquire ordering."""
    if not (isinstance(arr, types.Array) and arr.dtype == types.int64):
        return None
    sig = types.int64(arr, idx)

    def codegen(context, builder, signature, args):
        return builder.load_atomic(_array_slot(context, builder, signature, args), "acquire", 8)

    return sig, codegen


@intrinsic
def store_release(typingctx, arr, idx, val):
    """``a[i] = v`` (int64 array), stored with release ordering."""
    if not (isinstance(arr, types.Array) and arr.dtype == types.int64):
        return None
    sig = types.void(arr, idx, val)

    def codegen(context, builder, signature, args):
        v = context.cast(builder, args[2], signature.args[2], types.int64)
        builder.store_atomic(v, _array_slot(context, builder, signature, args), "release", 8)
        return context.get_dummy_value()

    return sig, codegen


CLOCK_MONOTONIC = getattr(time, "CLOCK_MONOTONIC", None)  # None: no clock_gettime (Windows)


@intrinsic
def monotonic_ns(typingctx):
    """Nanoseconds on CLOCK_MONOTONIC (0 where the platform has no clock_gettime)."""
    sig = types.int64()

    def codegen(context, builder, signature, args):
        i64, i32 = ir.IntType(64), ir.IntType(32)
        if CLOCK_MONOTONIC is None:
            return i64(0)
        ts = cgutils.alloca_once(builder, ir.ArrayType(i64, 2))  # struct timespec
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(i32, [i32, i64.as_pointer()]), "clock_gettime")
        p = builder.bitcast(ts, i64.as_pointer())
        builder.call(fn, [i32(CLOCK_MONOTONIC), p])
        seconds, nanos = builder.load(p), builder.load(builder.gep(p, [i32(1)]))
        return builder.add(builder.mul(seconds, i64(1_000_000_000)), nanos)

    return sig, codegen
