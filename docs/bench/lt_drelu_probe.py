"""Does cuBLASLt fuse the ReLU backward into an FP32 GEMM, and at what cost? (issue 20; GPU only)

The reference step's dx chain runs, per hidden layer, ``dz = dout * (y > 0)`` (act_backward, a kernel on the
chain) and then the next dx GEMM. cuBLASLt's ``RELU_AUX_BIAS`` epilogue (forward) writes a bit-mask of
``y > 0`` beside ``y``; its ``DRELU`` epilogue (backward) multiplies a GEMM's result by that mask, and
``DRELU_BGRAD`` also writes the column sums (the bias gradient). Whether the heuristic offers FP32 algorithms for
them, whether their outputs are the plain GEMM's bits (times the mask), and how long each takes against the plain
GEMM, for the reference shapes (MLP 256-256, batch 512; 1,024 rows: s and s' together), is what this prints. The
twenty-eighth session's panel-kernel form of the same fusion was slower in the step; this is cuBLASLt's own.

    PYTHONPATH=. python3 docs/bench/lt_drelu_probe.py [--out probe.json]
"""

from __future__ import annotations

import argparse
import ctypes
import json

import cupy as cp
import numpy as np

from cudarl import blas

DEFAULT, RELU_BIAS, RELU_AUX_BIAS, DRELU, DRELU_BGRAD = 1, 6, 134, 136, 152  # cublasLtEpilogue_t
AUX_POINTER, AUX_LD = 11, 12  # cublasLtMatmulDescAttributes_t


class Problem:
    """One row-major ``out[m, n] = epi(op(a)[m, k] @ op(b)[k, n])`` through cudarl.blas's own descriptor code,
    with the epilogue's auxiliary bit-mask (``ld`` bits a column of the column-major D [n, m])."""

    def __init__(self, m, n, k, trans_b, epilogue, bias_ptr=0, aux=None, split_k=False):
        lib = blas._lt_lib()
        p = self.plan = blas._LtPlan.__new__(blas._LtPlan)
        p.desc, p.layout_a, p.layout_b, p.layout_d, p.layout_c = (ctypes.c_void_p() for _ in range(5))
        p.alpha, p.beta = ctypes.c_float(1.0), ctypes.c_float(0.0)
        lds = (k, k if trans_b else n, n)
        p._describe_problem(lib, m, n, k, False, trans_b, epilogue, False, bias_ptr, lds, 0)
        if aux is not None:
            ptr, ld = aux
            for attr, v, name in (
                (AUX_POINTER, ctypes.c_void_p(ptr), "AUX_POINTER"),
                (AUX_LD, ctypes.c_int64(ld), "AUX_LD"),
            ):
                blas._set_attr(lib.cublasLtMatmulDescSetAttribute, p.desc, attr, v, name)
        self.found = blas._heuristic(lib, p.desc, p._layouts(), (16, 16, 16, 16), split_k, 8)
        if self.found:
            p.algo = blas._LtAlgo.from_buffer_copy(self.found[0].algo)

    def config(self) -> dict:
        return blas._algo_config(self.plan.algo) if self.found else {}

    def run(self, a, b, out, bias=None, workspace=None, stream=0):
        blas._lt_run(
            self.plan,
            a.data.ptr,
            b.data.ptr,
            out.data.ptr,
            0 if bias is None else bias.data.ptr,
            workspace.data.ptr,
            stream,
        )


def mask_bits(aux: cp.ndarray, m: int, n: int, ld: int) -> np.ndarray:
    """The [m, n] booleans of a bit-mask with ``ld`` bits a column of the column-major [n, m]."""
    bits = np.unpackbits(cp.asnumpy(aux).view(np.uint8), bitorder="little").reshape(m, ld)
    return bits[:, :n].astype(bool)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="lt_drelu_probe.json")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    ws = cp.zeros(blas.WORKSPACE_BYTES // 4, np.float32)
    timer = blas._EventTimer()
    rows, probs = [], []
    print(f"cuBLASLt {blas._lt_lib().cublasLtGetVersion()}, {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}")
    print(f"{'case':34s} {'algos':>5s} {'us':>7s}  check")
    for m, n, k in ((512, 256, 256), (1024, 256, 256), (256, 256, 256)):
        ld = -(-n // 128) * 128
        x = cp.asarray(rng.standard_normal((m, k), np.float32))
        W = cp.asarray(rng.standard_normal((k, n), np.float32) / 16)
        b = cp.asarray(rng.standard_normal(n, np.float32) / 4)
        aux = cp.zeros(ld // 32 * m, np.uint32)
        y_plain, y_aux = cp.empty((m, n), np.float32), cp.empty((m, n), np.float32)
        dz = cp.asarray(rng.standard_normal((m, n), np.float32))
        W2 = cp.asarray(rng.standard_normal((n, n), np.float32) / 16)  # the next layer's [n_in, n_out]: dx = dz W2^T
        dx_plain, dx_relu = cp.empty((m, n), np.float32), cp.empty((m, n), np.float32)
        gb = cp.zeros(n, np.float32)
        cases = {
            "forward RELU_BIAS": (Problem(m, n, k, False, RELU_BIAS, b.data.ptr), (x, W, y_plain, b)),
            "forward RELU_AUX_BIAS": (
                Problem(m, n, k, False, RELU_AUX_BIAS, b.data.ptr, (aux.data.ptr, ld)),
                (x, W, y_aux, b),
            ),
            "dx DEFAULT": (Problem(m, n, n, True, DEFAULT), (dz, W2, dx_plain, None)),
            "dx DRELU": (Problem(m, n, n, True, DRELU, 0, (aux.data.ptr, ld)), (dz, W2, dx_relu, None)),
            "dx DRELU_BGRAD": (
                Problem(m, n, n, True, DRELU_BGRAD, gb.data.ptr, (aux.data.ptr, ld)),
                (dz, W2, dx_relu, gb),
            ),
        }
        probs += [prob for prob, _ in cases.values()]
        for name, (prob, (a_, b_, o_, bias_)) in cases.items():
            row = {"m": m, "n": n, "k": k, "case": name, "algos": len(prob.found), "config": prob.config()}
            if prob.found:
                prob.run(a_, b_, o_, bias_, ws)
                cp.cuda.runtime.deviceSynchronize()
                row["us"] = timer.median_us(lambda s, p=prob, t=(a_, b_, o_, bias_): p.run(*t, workspace=ws, stream=s))
                check = ""
                if name == "forward RELU_AUX_BIAS":
                    y = cp.asnumpy(y_aux)
                    row["same_bits_as_relu_bias"] = bool(np.array_equal(y, cp.asnumpy(y_plain)))
                    row["mask_is_y_gt_0"] = bool(np.array_equal(mask_bits(aux, m, n, ld), y > 0))
                    check = (
                        f"bits as RELU_BIAS {row['same_bits_as_relu_bias']}, mask == (y > 0) {row['mask_is_y_gt_0']}"
                    )
                if name.startswith("dx DRELU"):
                    want = cp.asnumpy(dx_plain) * (cp.asnumpy(y_aux) > 0)
                    got = cp.asnumpy(dx_relu)
                    row["same_bits_as_default_times_mask"] = bool(np.array_equal(got, want))
                    row["max_abs_diff"] = float(np.abs(got - want).max())
                    same, diff = row["same_bits_as_default_times_mask"], row["max_abs_diff"]
                    check = f"bits as DEFAULT * mask {same} (max diff {diff:.2e})"
                    if name.endswith("BGRAD"):
                        sums = [cp.asnumpy(gb).copy()]
                        for _ in range(3):
                            prob.run(*cases[name][1][:3], gb, ws)
                            sums.append(cp.asnumpy(gb).copy())
                        row["bgrad_repeatable"] = all(np.array_equal(sums[0], s) for s in sums[1:])
                        row["bgrad_max_rel"] = float(np.abs(sums[0] - got.sum(0)).max() / np.abs(got.sum(0)).max())
                        check += (
                            f"; bgrad repeatable {row['bgrad_repeatable']}, vs column sums {row['bgrad_max_rel']:.1e}"
                        )
                print(f"{m}x{n}x{k} {name:24s} {len(prob.found):5d} {row['us']:7.2f}  {check}")
            else:
                print(f"{m}x{n}x{k} {name:24s} {0:5d}       -  no FP32 algorithm offered")
            rows.append(row)
    for prob in probs:
        prob.plan.destroy()  # the descriptors and layouts each Problem made
    timer.destroy()
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
