"""sweep.html rendered by headless Chromium (Debian's `chromium`; scripts/install-deps.sh
--test installs it): both charts are drawn with their axis labels and a legend entry per
plan, measured on the laid-out page (element boxes), and the screenshot shows each plan's
line colour in each chart's half of the page."""
import json
import pathlib
import re
import shutil
import struct
import subprocess
import sys
import zlib

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from test_sweep import PLANS, sweep  # noqa: E402,F401  (the module fixture: one sweep for both files)

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (scripts/install-deps.sh --test)")

# Appended to a copy of the page: measures the laid-out SVG elements into <pre id="measure">.
MEASURE = """<script>
const box = e => { const r = e.getBoundingClientRect(); return {x: r.x, y: r.y, w: r.width, h: r.height}; };
const out = {};
for (const svg of document.querySelectorAll('svg')) {
  out[svg.id] = {
    svg: box(svg),
    x_label: {text: svg.querySelector('.x-label').textContent, box: box(svg.querySelector('.x-label'))},
    y_label: {text: svg.querySelector('.y-label').textContent, box: box(svg.querySelector('.y-label'))},
    legend: [...svg.querySelectorAll('.legend-entry')].map(e => ({text: e.textContent, box: box(e)})),
    series: [...svg.querySelectorAll('.series')].map(e => ({plan: e.dataset.plan, box: box(e),
                                                             stroke: getComputedStyle(e).stroke})),
    x_ticks: [...svg.querySelectorAll('.x-tick')].map(e => e.textContent),
    y_ticks: [...svg.querySelectorAll('.y-tick')].length,
  };
}
const pre = document.createElement('pre'); pre.id = 'measure'; pre.textContent = JSON.stringify(out);
document.body.appendChild(pre);
</script>"""


def chromium(*args):
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           "--window-size=1400,1000", *args], capture_output=True, text=True, timeout=120)


def read_png_rgb(path):
    """(width, height, rows of (r, g, b)) of an 8-bit RGB or RGBA PNG, without PIL."""
    data = pathlib.Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and color in (2, 6), (depth, color)
            channels = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * channels
    rows, prev = [], bytearray(stride)
    for y in range(height):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b, c = prev[i], prev[i - channels] if i >= channels else 0
            if f == 1: line[i] = (line[i] + a) & 255
            elif f == 2: line[i] = (line[i] + b) & 255
            elif f == 3: line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append([tuple(line[x * channels:x * channels + 3]) for x in range(width)])
        prev = line
    return width, height, rows


def test_rendered_page_has_both_charts_with_axis_labels_and_legend(sweep, tmp_path):
    out, _ = sweep
    page = tmp_path / "measured.html"
    page.write_text((out / "sweep.html").read_text().replace("</body>", MEASURE + "\n</body>"))
    proc = chromium("--dump-dom", "--virtual-time-budget=3000", page.as_uri())
    match = re.search(r'<pre id="measure">(.*?)</pre>', proc.stdout, re.S)
    assert match, proc.stderr[-2000:]
    charts = json.loads(match.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    assert set(charts) == {"chart-aggregate", "chart-per-request"}
    for name, chart in charts.items():
        svg = chart["svg"]
        assert svg["w"] >= 600 and svg["h"] >= 350, (name, svg)

        def inside(b):
            return (b["w"] > 0 and b["h"] > 0 and b["x"] >= svg["x"] - 1 and b["y"] >= svg["y"] - 1
                    and b["x"] + b["w"] <= svg["x"] + svg["w"] + 1 and b["y"] + b["h"] <= svg["y"] + svg["h"] + 1)

        assert chart["x_label"]["text"] == "concurrency (requests in flight)" and inside(chart["x_label"]["box"])
        assert "tok/s" in chart["y_label"]["text"] and inside(chart["y_label"]["box"])
        assert chart["y_label"]["box"]["h"] > chart["y_label"]["box"]["w"], "the y label is drawn vertically"
        assert [e["text"] for e in chart["legend"]] == PLANS
        assert all(inside(e["box"]) for e in chart["legend"])
        plot_right = max(s["box"]["x"] + s["box"]["w"] for s in chart["series"])
        assert all(e["box"]["x"] >= plot_right for e in chart["legend"]), "the legend sits beside the plot"
        assert [s["plan"] for s in chart["series"]] == PLANS
        assert all(inside(s["box"]) and s["box"]["w"] > 100 for s in chart["series"])
        assert len({s["stroke"] for s in chart["series"]}) == len(PLANS), "one colour per plan"
        assert chart["x_ticks"] == ["1", "4", "16"] and chart["y_ticks"] >= 3


def test_screenshot_shows_every_plan_line_in_both_charts(sweep, tmp_path):
    out, _ = sweep
    shot = tmp_path / "sweep.png"
    proc = chromium(f"--screenshot={shot}", (out / "sweep.html").as_uri())
    assert shot.exists(), proc.stderr[-2000:]
    width, height, rows = read_png_rgb(shot)
    html = (out / "sweep.html").read_text()
    colours = re.findall(r'<polyline class="series" data-plan="[^"]+" fill="none" stroke="#([0-9a-f]{6})"', html)
    assert len(colours) == 2 * len(PLANS)
    # The charts sit side by side: each half of the page shows every plan's colour.
    for half in (range(0, width // 2), range(width // 2, width)):
        seen = set()
        for row in rows[:height * 2 // 3]:
            for x in half:
                seen.add(row[x])
        for colour in colours[:len(PLANS)]:
            rgb = tuple(int(colour[i:i + 2], 16) for i in (0, 2, 4))
            assert rgb in seen, f"colour #{colour} not drawn in half {half.start}"
