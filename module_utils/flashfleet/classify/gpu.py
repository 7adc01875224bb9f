"""Reader of the GPU evidence (evidence.py's gather_gpu): nvidia-smi's errors and NVML states
matched against HOST_SIGNATURES."""

from __future__ import annotations

import re

from .signatures import HOST_SIGNATURES


def gpu_findings(evidence: dict) -> list[dict]:
    """NVML trouble in the gpu evidence (nvidia-smi's error text, fields such as `[GPU requires
    reset]`, a recovery action other than None where evidence.py records one). Current state, at
    diagnose time."""
    gpu = evidence.get("gpu") or {}
    if not gpu.get("present"):
        return []
    texts = []
    if gpu.get("error"):
        texts.append(str(gpu["error"]))
    if gpu.get("csv"):
        texts.extend(line for line in str(gpu["csv"]).splitlines() if "[" in line)
    for row in gpu.get("gpus") or []:
        for key, value in (row or {}).items():
            if isinstance(value, str) and value.startswith("[") and value not in ("[N/A]", "[Not Supported]"):
                texts.append(f"GPU {row.get('index', '?')} {key}: {value}")
        action = str((row or {}).get("recovery_action") or "")
        if action and action.lower() not in ("none", "n/a", "[n/a]", "0", "0x0"):
            texts.append(f"GPU {row.get('index', '?')} GPU Recovery Action: {action}")
    out = []
    for text in texts:
        for line in text.splitlines():
            for kind, rx, action, what in HOST_SIGNATURES:
                if rx.search(line):
                    out.append({"kind": kind, "action": action, "line": f"nvidia-smi: {line.strip()}", "what": what,
                                "ts": None, "source": "nvidia-smi", "text": line.strip()})
                    break
            else:
                m = re.search(r"GPU Recovery Action: (?P<a>.+)", line)
                if m:
                    a = m.group("a").lower()
                    act = "reboot-node" if "reboot" in a else "reset-gpu"
                    out.append({"kind": "gpu-unavailable", "action": act, "line": f"nvidia-smi: {line.strip()}",
                                "what": f"NVML reports a pending recovery action ({m.group('a')})", "ts": None,
                                "source": "nvidia-smi", "text": line.strip()})
    return out

