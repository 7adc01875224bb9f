"""The matmul and all-reduce figures, judged. flashfleet_trainer.gpu_probe measures them with the
trainer's own torch (this package has no torch) and prints one JSON object (PROBE below); the
functions here read it.

Bus bandwidth is nccl-tests' (doc/PERFORMANCE.md): an all-reduce of S bytes over n ranks that
takes t seconds has algbw = S / t and busbw = algbw x 2(n-1)/n, the bandwidth each link must carry
(comparable across n, and with the hardware's peak).
"""

from __future__ import annotations

import statistics

from .settings import EXPECTED_BUSBW_GBS, EXPECTED_TFLOPS

MODULE = "flashfleet_trainer.gpu_probe"


def command(python: str, indices: list[int], level: int) -> list[str]:
    return [python, "-m", MODULE, "--gpus", ",".join(map(str, indices)), "--level", str(int(level)), "--json"]


def busbw_gbs(nbytes: int, seconds: float, ranks: int) -> float:
    """nccl-tests' bus bandwidth of one all-reduce, GB/s (1e9 bytes)."""
    return nbytes / seconds / 1e9 * 2 * (ranks - 1) / ranks


def expected_tflops(cfg: dict, name: str | None) -> float | None:
    return float(cfg["matmul_expected_tflops"]) or EXPECTED_TFLOPS.get(name or "")


def matmul_findings(cfg: dict, gpus: list[dict]) -> dict[str, tuple[str, str]]:
    """{uuid: (level, text)} for each GPU the probe measured: its rate against its card's expected
    figure and against the median of the host's measured GPUs."""
    rates = [g["tflops"] for g in gpus if isinstance(g.get("tflops"), (int, float))]
    median = statistics.median(rates) if rates else None
    out = {}
    for g in gpus:
        rate = g.get("tflops")
        if not isinstance(rate, (int, float)):
            out[g["uuid"]] = ("warn", f"matmul: not measured ({g.get('error', 'no figure')})")
            continue
        expected = expected_tflops(cfg, g.get("name"))
        words, level = [f"{rate:.0f} TFLOP/s bf16"], "ok"
        if expected:
            frac = rate / expected
            words.append(f"{frac:.2f} of the expected {expected:.0f}")
            if frac < float(cfg["matmul_min_of_expected"]):
                level = "fail"
                words.append(f"below {cfg['matmul_min_of_expected']} (matmul_min_of_expected)")
        else:
            words.append(f"no expected figure for {g.get('name')!r} (set matmul_expected_tflops)")
        if median and len(rates) > 1:
            words.append(f"{rate / median:.2f} of the host's median {median:.0f}")
            if rate / median < float(cfg["matmul_min_of_median"]):
                level = "fail"
                words.append(f"below {cfg['matmul_min_of_median']} (matmul_min_of_median): a straggler")
        out[g["uuid"]] = (level, "matmul: " + ", ".join(words))
    return out


def busbw_floor(cfg: dict, names: list[str]) -> float:
    """The all-reduce floor for these cards: the setting, or (at -1) the lowest product figure of
    EXPECTED_BUSBW_GBS among them, 0 (none) when a card has no figure (PCIe-only cards)."""
    floor = float(cfg["allreduce_min_busbw_gbs"])
    if floor >= 0:
        return floor
    figures = [EXPECTED_BUSBW_GBS.get(n) for n in names]
    return 0.0 if not figures or None in figures else min(figures)


def allreduce_finding(cfg: dict, result: dict | None, names: list[str]) -> tuple[str, str]:
    """(level, text) of the run's all-reduce: its bus bandwidth against the floor."""
    if not result or result.get("skipped"):
        return "skip", f"all-reduce: skipped ({(result or {}).get('skipped', 'not run')})"
    if not result.get("correct", False):
        return "fail", f"all-reduce: wrong sum across GPUs {result.get('gpus')} (NCCL or a GPU corrupts data)"
    bw, floor = float(result["busbw_gbs"]), busbw_floor(cfg, names)
    text = (f"all-reduce of {result['bytes'] / 2**20:.0f} MiB across {len(result['gpus'])} GPUs: busbw "
            f"{bw:.0f} GB/s (algbw {result['algbw_gbs']:.0f})")
    if floor and bw < floor:
        return "fail", f"{text}, below the floor {floor:.0f} GB/s (allreduce_min_busbw_gbs)"
    return "ok", text + (f", floor {floor:.0f}" if floor else ", no floor for these cards")
