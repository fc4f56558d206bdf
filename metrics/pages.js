// What the live page (page.html) and the job's page (job.html) both draw with: spliced into each
// page's script at build time (cmake/embed_text.cmake), so a page still loads nothing but itself.
const $ = (id) => document.getElementById(id);
const SVG = "http://www.w3.org/2000/svg";

function fixed(value, digits) { return typeof value === "number" ? value.toFixed(digits) : "-"; }
function clock(seconds) { return new Date(seconds * 1000).toLocaleTimeString(); }

function node(tag, attrs, content) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (content !== undefined) e.textContent = content;
  return e;
}

// A round number for an axis label: 1, 2, 5 times a power of ten.
function niceStep(span, count) {
  const raw = span / Math.max(count, 1), power = Math.pow(10, Math.floor(Math.log10(raw)));
  const f = raw / power;
  return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * power;
}

// Runs of consecutive points whose values are all present (a gap breaks a line or a band).
function runs(points, present) {
  const out = [];
  let current = [];
  for (const p of points) {
    if (present(p)) current.push(p);
    else if (current.length) { out.push(current); current = []; }
  }
  if (current.length) out.push(current);
  return out;
}

// A chart in the svg's 480 x 220 box: `lines` [{points: [[x, y]...], color, cls, dots}] and
// `bands` [{points: [[x, lo, hi]...], color}]; `empty` is said when there is no point at all.
function drawChart(svg, lines, bands, xLabel, yLabel, empty) {
  const W = 480, H = 220, L = 48, R = 10, T = 10, B = 34;
  svg.replaceChildren();
  const xs = [], ys = [];
  for (const l of lines) for (const p of l.points) { xs.push(p[0]); ys.push(p[1]); }
  for (const b of bands) for (const p of b.points) { xs.push(p[0]); ys.push(p[1], p[2]); }
  if (!xs.length) {
    svg.appendChild(node("text", {x: W / 2, y: H / 2, "text-anchor": "middle"}, empty));
    return;
  }
  let x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(...ys), y1 = Math.max(...ys);
  if (x1 === x0) x1 = x0 + 1;
  if (y1 === y0) { y0 -= 0.5; y1 += 0.5; }
  const pad = (y1 - y0) * 0.05; y0 -= pad; y1 += pad;
  const sx = (x) => L + (x - x0) / (x1 - x0) * (W - L - R);
  const sy = (y) => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
  const ystep = niceStep(y1 - y0, 4), xstep = niceStep(x1 - x0, 6);
  for (let y = Math.ceil(y0 / ystep) * ystep; y <= y1; y += ystep) {
    svg.appendChild(node("line", {x1: L, x2: W - R, y1: sy(y), y2: sy(y), stroke: "#eef0f3"}));
    svg.appendChild(node("text", {x: L - 4, y: sy(y) + 4, "text-anchor": "end"},
                         +y.toPrecision(3)));
  }
  for (let x = Math.ceil(x0 / xstep) * xstep; x <= x1; x += xstep)
    svg.appendChild(node("text", {x: sx(x), y: H - B + 14, "text-anchor": "middle"},
                         +x.toPrecision(4)));
  svg.appendChild(node("line", {x1: L, x2: L, y1: T, y2: H - B, stroke: "#98a2b3"}));
  svg.appendChild(node("line", {x1: L, x2: W - R, y1: H - B, y2: H - B, stroke: "#98a2b3"}));
  svg.appendChild(node("text", {x: (L + W - R) / 2, y: H - 4, "text-anchor": "middle"}, xLabel));
  svg.appendChild(node("text", {x: 12, y: (T + H - B) / 2, "text-anchor": "middle",
                                transform: `rotate(-90 12 ${(T + H - B) / 2})`}, yLabel));
  const xy = (x, y) => sx(x).toFixed(1) + "," + sy(y).toFixed(1);
  for (const b of bands)
    for (const run of runs(b.points, () => true)) {
      const d = "M" + run.map((p) => xy(p[0], p[2])).join("L") + "L" +
                run.slice().reverse().map((p) => xy(p[0], p[1])).join("L") + "Z";
      svg.appendChild(node("path", {d, fill: b.color, "fill-opacity": 0.16, stroke: "none",
                                    class: "band"}));
    }
  for (const l of lines) {
    const d = l.points.map((p, i) => (i ? "L" : "M") + xy(p[0], p[1])).join("");
    svg.appendChild(node("path", {d, fill: "none", stroke: l.color, "stroke-width": 1.8,
                                  class: l.cls ? "curve " + l.cls : "curve",
                                  "data-points": l.points.length}));
    if (l.dots)
      for (const p of l.points)
        svg.appendChild(node("circle", {cx: sx(p[0]), cy: sy(p[1]), r: 3, fill: l.color}));
  }
}
