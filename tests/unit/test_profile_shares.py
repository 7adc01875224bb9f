"""bench_drafter / bench_target --profile: kernel time sorted by kind from a profiler trace, with the
kernel names these GPUs really print (cuDNN's attention names itself `..._sdpa_..._fprop_...` and must
not count as a convolution), and by record_function region when there are regions."""

import json

from flashfleet_trainer.bench_drafter import share_table

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
