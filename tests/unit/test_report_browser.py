"""report.html in a real browser: headless Chromium loads it and every plot decodes to an image.

Skipped when no Chromium is installed (Debian package `chromium`). The page is the generator's own
output with one small script appended that, after the load event, writes each <img>'s decoded
size into the DOM; `chromium --dump-dom` prints that DOM. A screenshot must not be blank either.
A copy with one corrupt PNG proves the check can fail.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import flashfleet.report as fr
import pytest

pytest.importorskip("matplotlib")

CHROMIUM = next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")) if p), None)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no headless Chromium (Debian package `chromium`)")

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--hide-scrollbars"]

PROBE = """
<script>
window.addEventListener("load", function () {
  var out = Array.prototype.map.call(document.images, function (img) {
    return {alt: img.alt, complete: img.complete, w: img.naturalWidth, h: img.naturalHeight};
  });
  var pre = document.createElement("pre");
  pre.id = "img-probe";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>
"""


def _run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "v2"
    host = run / "gpu01"
    host.mkdir(parents=True)
    lines = []
    for step in range(1, 81):
        lines.append(json.dumps({
            "step": step, "epoch": step / 40, "time": 1_764_525_600.0 + 2 * step, "loss": 3.0 / (1 + step / 20),
            "ce": 2.0 / (1 + step / 20), "kl": 1.0 / (1 + step / 20), "lr": 6e-4 * min(1, step / 10),
            "noise": 0.1 - 0.001 * step, "acc": [0.9 - 0.05 * i for i in range(8)],
            "accept_proxy": 1 + step / 40, "target_tokens_per_s": 50000.0 + step, "drafter_rows_per_s": 120.0,
            "peak_mem_bytes": 3 * 2**30}))
    (host / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (host / "status.json").write_text(json.dumps({"phase": "training", "step": 80}))
    (host / "diagnosis.json").write_text(json.dumps({"verdict": "running", "reason": "training, step 80"}))
    return run


def _chromium(args: list[str], profile: Path) -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args],
                          capture_output=True, text=True, timeout=120, check=False)


def _probe(page: Path, tmp_path: Path) -> list[dict]:
    probed = page.with_name(page.stem + "-probe.html")
    probed.write_text(page.read_text().replace("</body>", PROBE + "</body>"))
    res = _chromium(["--virtual-time-budget=10000", "--dump-dom", probed.as_uri()], tmp_path / "profile-dom")
    m = re.search(r'<pre id="img-probe">(.*?)</pre>', res.stdout, re.S)
    assert m, f"no probe output from chromium (exit {res.returncode}): {res.stderr[-2000:]}"
    return json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&"))


@pytest.fixture
def report(tmp_path):
    out = fr.write_report(_run_dir(tmp_path))
    assert "</body>" in out.read_text()
    return out


def test_every_plot_decodes_in_chromium(report, tmp_path):
    images = _probe(report, tmp_path)
    n_plots = len(re.findall(r"<figcaption>", report.read_text()))
    assert n_plots >= 5 and len(images) == n_plots
    for img in images:
        assert img["complete"] and img["w"] > 100 and img["h"] > 100, img


def test_screenshot_is_not_blank(report, tmp_path):
    from matplotlib.image import imread

    shot = tmp_path / "shot.png"
    res = _chromium([f"--screenshot={shot}", "--window-size=1200,2400", report.as_uri()], tmp_path / "profile-shot")
    assert shot.is_file(), f"no screenshot (exit {res.returncode}): {res.stderr[-2000:]}"
    pixels = imread(shot)
    assert pixels.shape[0] >= 1000 and pixels.shape[1] >= 1000
    rgb = pixels[..., :3]
    assert float(rgb.std()) > 0.05, "the screenshot is blank"
    # plotted lines are coloured, the page itself is black on white
    colour = (rgb.max(axis=2) - rgb.min(axis=2)) > 0.3
    assert int(colour.sum()) > 500, "no coloured plot lines in the screenshot"


def test_probe_catches_a_broken_plot(report, tmp_path):
    text = report.read_text()
    first = re.search(r'src="data:image/png;base64,([A-Za-z0-9+/=]{40})', text)
    broken = report.with_name("broken.html")
    broken.write_text(text.replace(first.group(1), "A" * 40, 1))
    images = _probe(broken, tmp_path)
    assert [img["w"] for img in images].count(0) == 1
