"""The Triton kernels build for sm_90 (H100/H200) with Triton's bundled compiler, without a GPU.

Triton's interpreter (which runs the other kernel tests on CPU) accepts things the compiler
rejects (non-constexpr globals, loop-carried type changes). The test session imports triton in
interpreter mode, and triton fixes its mode at first import, so the compilation runs this file as
a script in a fresh process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def compile_for_hopper() -> None:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from dflash_core.speed.kernels import kv_injection, verify

    strides = ["sk_b", "sk_n", "sk_h", "sv_b", "sv_n", "sv_h", "sc_b", "sc_n", "ss_b", "ss_n",
               "sck_b", "sck_h", "sck_p", "scv_b", "scv_h", "scv_p"]
    kv_sig = {name: "*bf16" for name in ["k_ptr", "v_ptr", "w_ptr", "cos_ptr", "sin_ptr", "ck_ptr", "cv_ptr"]}
    kv_sig.update(n="i32", offset="i32", eps="fp32", **{name: "i32" for name in strides}, HALF="constexpr", BLOCK="constexpr")
    verify_sig = {
        "logits_ptr": "*bf16", "draft_ptr": "*i64", "part_val_ptr": "*fp32", "part_idx_ptr": "*i32",
        "ws_ptr": "*i32", "out_ptr": "*i64", "vocab": "i32", "n_rows": "i32", "n_splits": "i32",
        "split_size": "i32", "stride_l": "i32",
        "NO_INDEX": "constexpr", "BLOCK": "constexpr", "ROWS": "constexpr", "SPLITS": "constexpr",
    }
    builds = [
        (kv_injection._kv_injection_kernel, kv_sig, {"HALF": 64, "BLOCK": 64}),
        (verify._verify_kernel, verify_sig, {"NO_INDEX": 2**31 - 1, "BLOCK": 2048, "ROWS": 16, "SPLITS": 16}),
    ]
    for fn, signature, constexprs in builds:
        compiled = triton.compile(ASTSource(fn=triton.jit(fn), signature=signature, constexprs=constexprs),
                                  target=GPUTarget("cuda", 90, 32))
        assert compiled.asm["cubin"], f"no cubin for {fn.__name__}"
        print(f"{fn.__name__}: {len(compiled.asm['cubin'])} bytes of sm_90 cubin")


@pytest.mark.slow
def test_kernels_compile_for_hopper():
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run([sys.executable, __file__], cwd=REPO, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("bytes of sm_90 cubin") == 2


if __name__ == "__main__":
    compile_for_hopper()
