"""bench_drafter / bench_target --profile: kernel time sorted by kind from a profiler trace, with the
kernel names these GPUs really print (cuDNN's attention names itself `..._sdpa_..._fprop_...` and must
not count as a convolution), and by record_function region when there are regions."""

import json

from flashfleet_trainer.bench_drafter import idle_table, share_table

KERNELS = {  # name -> microseconds; names as the H200 profiles printed them
    "nvjet_sm90_tst_192x192_64x4_2x1_v_bz_coopB_TNN": 700.0,
    "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128_4x1x1_cga1x1": 180.0,
    "void at::native::(anonymous namespace)::conv_depthwise2d_forward_kernel_generic<c10::BFloat16>": 66.0,
    "chunk_gated_delta_rule_fwd_kernel_h_blockdim64": 43.0,
    "triton_poi_fused__unsafe_view_mul_silu_4": 11.0,
}


def trace(tmp_path, spans=()):
    events, t = [], 0.0
    for name, us in KERNELS.items():
        events.append({"cat": "kernel", "name": name, "ts": t, "dur": us})
        t += us
    events += [{"cat": "gpu_user_annotation", "name": n, "ts": s, "dur": d} for n, s, d in spans]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def shares(table: str) -> dict:
    """{kind: percent} from the kind-only table (the second one)."""
    kinds = table.split("| share | kind |\n|---:|---|\n")[1].split("\n\n")[0]
    return {row.split(" | ")[1].rstrip(" |"): float(row.split("%")[0].strip("| ")) for row in kinds.splitlines()}


def test_a_target_forward_is_split_by_kernel_kind(tmp_path):
    table = share_table(trace(tmp_path), regions=(), outside="forward")
    assert shares(table) == {"GEMM": 70.0, "attention": 18.0, "convolution": 6.6, "linear attention (fla)": 4.3,
                             "elementwise/other": 1.1}
    assert "| 70.0% | GEMM | forward |" in table and "backward" not in table


def test_kernels_inside_a_region_are_counted_there(tmp_path):
    table = share_table(trace(tmp_path, spans=[("drafter_forward", 0.0, 700.0)]))
    assert "| 70.0% | GEMM | drafter_forward |" in table  # inside the span
    assert "| 18.0% | attention | backward |" in table  # outside any span: the default region


def test_idle_gaps_are_put_on_the_op_that_launched_the_next_kernel(tmp_path):
    """Three kernels with two gaps: 40 us before `b`, launched late inside aten::mm after a
    cudaStreamSynchronize that ended in the gap; 10 us before `c`, launched inside aten::add."""
    ev = [
        {"cat": "kernel", "name": "a", "ts": 0.0, "dur": 100.0, "args": {"correlation": 1}},
        {"cat": "kernel", "name": "b", "ts": 140.0, "dur": 50.0, "args": {"correlation": 2}},
        {"cat": "kernel", "name": "c", "ts": 200.0, "dur": 20.0, "args": {"correlation": 3}},
        {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": -5.0, "dur": 2.0, "tid": 1, "args": {"correlation": 1}},
        {"cat": "cuda_runtime", "name": "cudaStreamSynchronize", "ts": 10.0, "dur": 95.0, "tid": 1},
        {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 135.0, "dur": 3.0, "tid": 1, "args": {"correlation": 2}},
        {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 195.0, "dur": 3.0, "tid": 2, "args": {"correlation": 3}},
        {"cat": "cpu_op", "name": "aten::linear", "ts": 120.0, "dur": 30.0, "tid": 1},
        {"cat": "cpu_op", "name": "aten::mm", "ts": 130.0, "dur": 10.0, "tid": 1},  # innermost around launch 2
        {"cat": "cpu_op", "name": "aten::mm", "ts": 190.0, "dur": 10.0, "tid": 1},  # another thread's: not it
        {"cat": "cpu_op", "name": "aten::add", "ts": 192.0, "dur": 8.0, "tid": 2},
        {"cat": "gpu_user_annotation", "name": "loss", "ts": 130.0, "dur": 100.0},
    ]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": ev}))
    table = idle_table(path, steps=2)
    assert table.splitlines()[0].startswith("GPU idle 0.0 ms a step of 0.1 ms (22.7%)")  # 50 of 220 us
    rows = table.splitlines()[3:]
    assert rows == ["| 0.02 ms | 1 | loss | aten::mm after a sync |", "| 0.01 ms | 1 | loss | aten::add |"], rows
