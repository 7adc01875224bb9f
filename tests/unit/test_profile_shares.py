"""bench_drafter / bench_target --profile: kernel time sorted by kind from a profiler trace, with the
kernel names these GPUs really print (cuDNN's attention names itself `..._sdpa_..._fprop_...` and must
not count as a convolution), and by record_function region when there are regions."""

import json

from tests.benchmarks.bench_drafter import idle_table, launch_table, share_table, wait_table

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


def test_small_kernels_are_put_on_the_outermost_and_innermost_ops_around_their_launch(tmp_path):
    """Two copy kernels launched inside aten::linear > aten::_to_copy (autocast's cast), one inside a
    backward node, a GEMM (another kind: left out) and a compiled kernel whose launch is not traced."""
    cast = "void at::native::unrolled_elementwise_kernel<direct_copy_kernel_cuda>"
    ev = [
        {"cat": "kernel", "name": cast, "ts": 0.0, "dur": 30.0, "args": {"correlation": 1}},
        {"cat": "kernel", "name": "nvjet_sm90_tst_192x192", "ts": 30.0, "dur": 500.0, "args": {"correlation": 2}},
        {"cat": "kernel", "name": cast, "ts": 530.0, "dur": 50.0, "args": {"correlation": 3}},
        {"cat": "kernel", "name": cast, "ts": 580.0, "dur": 20.0, "args": {"correlation": 4}},
        {"cat": "kernel", "name": "triton_poi_fused_mul_silu_0", "ts": 600.0, "dur": 8.0},
        {"cat": "cpu_op", "name": "aten::linear", "ts": 0.0, "dur": 20.0, "tid": 1},
        {"cat": "cpu_op", "name": "aten::_to_copy", "ts": 1.0, "dur": 5.0, "tid": 1},
        {"cat": "cpu_op", "name": "aten::copy_", "ts": 2.0, "dur": 3.0, "tid": 1},
        {"cat": "cpu_op", "name": "aten::mm", "ts": 8.0, "dur": 5.0, "tid": 1},
        {"cat": "cpu_op", "name": "aten::linear", "ts": 30.0, "dur": 20.0, "tid": 1},
        {"cat": "cpu_op", "name": "aten::_to_copy", "ts": 31.0, "dur": 5.0, "tid": 1},
        {"cat": "cpu_op", "name": "aten::copy_", "ts": 32.0, "dur": 3.0, "tid": 1},
        {"cat": "cpu_op", "name": "autograd::engine::evaluate_function: ToCopyBackward0", "ts": 60.0, "dur": 9.0,
         "tid": 2},
        {"cat": "cpu_op", "name": "aten::copy_", "ts": 62.0, "dur": 3.0, "tid": 2},
    ] + [{"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": t, "dur": 0.5, "tid": tid,
          "args": {"correlation": c}} for c, t, tid in ((1, 3.0, 1), (2, 9.0, 1), (3, 33.0, 1), (4, 63.0, 2))]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": ev}))
    lines = launch_table(path, steps=2).splitlines()
    assert lines[0] == "elementwise/other: 0.1 ms a step of GPU time, by the host ops that launched it"
    assert lines[3:] == [
        f"| 0.04 | 2 | aten::linear > aten::copy_ | {cast[:60]} |",  # 80 us over 2 steps
        f"| 0.01 | 1 | autograd::engine::evaluate_function: ToCopyBackward0 > aten::copy_ | {cast[:60]} |",
        "| 0.00 | 1 | (launch not traced: a compiled kernel) | triton_poi_fused_mul_silu_0 |",
    ], lines


def test_host_waits_and_driver_allocations_are_put_on_the_ops_around_them(tmp_path):
    """A stats read (cudaMemcpy inside aten::_local_scalar_dense under aten::item), two cudaFree
    calls inside the allocator's op, a kernel launch (not a wait: left out)."""
    ev = [
        {"cat": "cuda_runtime", "name": "cudaMemcpy", "ts": 10.0, "dur": 300.0, "tid": 1},
        {"cat": "cuda_runtime", "name": "cudaFree", "ts": 400.0, "dur": 50.0, "tid": 1},
        {"cat": "cuda_runtime", "name": "cudaFree", "ts": 500.0, "dur": 30.0, "tid": 1},
        {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 600.0, "dur": 900.0, "tid": 1},
        {"cat": "cpu_op", "name": "aten::item", "ts": 0.0, "dur": 320.0, "tid": 1},
        {"cat": "cpu_op", "name": "aten::_local_scalar_dense", "ts": 5.0, "dur": 310.0, "tid": 1},
        {"cat": "cpu_op", "name": "aten::empty", "ts": 390.0, "dur": 150.0, "tid": 1},
    ]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": ev}))
    lines = wait_table(path, steps=2).splitlines()
    assert lines[3:] == ["| 0.15 | 1 | cudaMemcpy | aten::item > aten::_local_scalar_dense |",
                         "| 0.04 | 2 | cudaFree | aten::empty |"], lines
