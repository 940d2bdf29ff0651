"""What the page adds for a class: the style of the presentation layout and of the large-text,
high-contrast switch, the keyboard shortcuts, and the what-if speedup model, which redraws its
curves in the browser from its sliders (no request to the server).

The model is `speedup.py`'s with every slot accepted with the same probability a:
E(B) = (1 - a^B) / (1 - a) tokens per cycle, a cycle costs one drafter pass (DFlash) or B - 1 of
them (an autoregressive drafter) plus a verify of B tokens, all in plain decoding steps; the verify
grows linearly from one plain step at B = 1 to the slider's cost at B = 16 (on a GPU it stays near
one step, on a CPU it grows). "This run" reads the finished race's numbers from the summary
(`why_speed.run_data`'s element); "a GPU as in the paper" is the paper's Qwen3-8B acceptance on
GSM8K at block 16 (tau 6.54, docs/benchmarks.md) with a verify of one plain step.
"""

from __future__ import annotations

from .speedup import effective_acceptance

PAPER_TAU, PAPER_BLOCK = 6.54, 16  # Qwen3-8B, GSM8K, block 16 (the paper's table; docs/benchmarks.md)
# One pass of a drafter a few layers deep beside a 36-layer target: an assumption, said on the page.
PAPER_DRAFT = 0.15

# Marks that reach 3:1 against white (WCAG 2.1, non-text contrast), over the pastel fills, whose
# dark text passes 4.5:1; rejected drafts at full opacity with a thick strike.
STRONG = {"accepted": "#1a7f37", "bonus": "#9a6700", "first": "#9a6700", "plain": "#1f5fbf", "rejected": "#b42318"}

PAGE_CSS = """
#page-head { display: none; }
#header { align-items: center; gap: 10px; }
#header h1 { font-size: 1.35rem; margin: 0; }
#header p { margin: 0; }
/* Four whole lines (as tall as the pair's dropdown beside it), then a scroll: Gradio's prose gives
   the paragraph a taller line of its own. */
#pair-status { max-height: 72px; overflow-y: auto; }
#pair-status .prose, #pair-status p { font-size: 13px !important; line-height: 18px !important; margin: 0 !important; }
#lanes .dflash-pane { max-height: 18em; }
.why-slower { margin: 6px 10px; padding: 6px 10px; border-left: 4px solid #9a6700; background: #fff8e6;
              color: #222; font-size: 14px; }
body.large-text #lanes .dflash-pane { font-size: 22px !important; line-height: 1.75 !important; color: #000 !important; }
body.large-text .side-stats, body.large-text .race-summary, body.large-text .why-slower { font-size: 18px !important; }
body.large-text .draft-strip div { font-size: 18px !important; }
body.large-text .cycle { font-size: 17px !important; }
body.large-text .chip-rejected { opacity: 1 !important; text-decoration-thickness: 3px !important;
                                 text-decoration-color: #b42318 !important; color: #000 !important; }
""" + "".join(
    f"body.large-text .tok-{kind}, body.large-text .chip-{kind} {{ box-shadow: inset 0 -4px 0 {color}; color: #000; }}\n"
    for kind, color in STRONG.items()
) + """
body:not(.run-ended) #pin { visibility: hidden; }
body.no-block-bars .tok { border-left: none !important; padding-left: 0 !important; margin-left: 0 !important; }
.whatif { border: 1px solid #ccd; border-radius: 8px; padding: 10px 14px; background: #fff; color: #111; }
.whatif h4 { margin: 0 0 6px 0; }
.whatif .presets button { margin-right: 6px; padding: 3px 10px; border: 1px solid #8a94a6; border-radius: 5px;
                          background: #f4f6fa; color: #111; cursor: pointer; }
.whatif .presets button:disabled { color: #999; cursor: not-allowed; }
.whatif .sliders { display: grid; grid-template-columns: 22em 1fr 4em; gap: 4px 10px; align-items: center; margin: 8px 0; }
.whatif svg { width: 100%; max-width: 720px; height: auto; background: #fff; }
.whatif .readout { font-size: 14px; }
"""

# Space: Pause / Continue (nothing in a finished run); right arrow: Step, or the next cycle of a
# finished run or of a run stepped back ("Back at cycle"); left arrow: the previous cycle. Keys typed
# into a field are left alone.
PAGE_JS = """
if (!window.dflashKeys) {
  window.dflashKeys = true;
  const visible = (id) => { const el = document.getElementById(id); return el && el.offsetParent !== null ? el : null; };
  const press = (id) => { const el = visible(id); if (el) el.click(); return !!el; };
  document.addEventListener('keydown', (event) => {
    if (event.altKey || event.ctrlKey || event.metaKey || event.shiftKey) return;
    const target = event.target;
    if (target && target.closest && target.closest('input, textarea, select, [contenteditable="true"]')) return;
    const status = (document.getElementById('control-status') || {}).innerText || '';
    const finished = /Finished|finished/.test(status), back = /Back at cycle/.test(status);
    let done = false;
    if (event.key === ' ') done = finished || press(/Paused/.test(status) || back ? 'continue' : 'pause');
    else if (event.key === 'ArrowRight') done = press(finished || back ? 'cycle-next' : 'step');
    else if (event.key === 'ArrowLeft') done = press('cycle-prev');
    if (done) event.preventDefault();
  });
  // "Pin this race" shows once the run on screen has ended (its status line says so); hidden, it
  // keeps its place, so nothing moves when it appears.
  setInterval(() => {
    const status = (document.getElementById('control-status') || {}).innerText || '';
    document.body.classList.toggle('run-ended', /Finished|finished|Ended/.test(status));
  }, 400);
}
"""

# Race / Replay clicked: where less than 200 px of the lanes show, the page scrolls to show 360.
SCROLL_TO_LANES_JS = """
(...args) => {
  const lanes = document.getElementById('lanes');
  const top = lanes ? lanes.getBoundingClientRect().top : 0;
  if (top > window.innerHeight - 200) window.scrollBy(0, top - (window.innerHeight - 360));
  return args;
}
"""

# Step with nothing playing: the handler armed "start paused"; the tab's own run button starts it.
START_PAUSED_JS = """
(status) => {
  if (typeof status === 'string' && status.startsWith('Starting paused')) {
    for (const id of ['run', 'replay-run']) {
      const button = document.getElementById(id);
      if (button && button.offsetParent !== null) { button.click(); break; }
    }
  }
}
"""

TOGGLE_JS = "(on) => {{ document.body.classList.toggle('{name}', {when}); }}"


def toggle_js(name: str, when_on: bool = True) -> str:
    """JS that puts class `name` on the page's body while a checkbox is on (or off: `when_on=False`)."""
    return TOGGLE_JS.format(name=name, when="!!on" if when_on else "!on")


def page_head_html() -> str:
    return f"<style>{PAGE_CSS}</style>"


def whatif_html() -> str:
    """The what-if model's panel; `WHATIF_JS` draws it."""
    a_gpu = effective_acceptance(PAPER_TAU, PAPER_BLOCK)
    sliders = (
        ('wi-a', 'per-slot acceptance a', 0, 0.99, 0.01, 0.5),
        ('wi-v', 'verify of 16 tokens, in plain steps', 0.5, 8, 0.05, 1.0),
        ('wi-c', 'one drafter pass (and bookkeeping), in plain steps', 0, 1, 0.01, 0.1),
    )
    rows = "".join(
        f'<label for="{i}">{label}</label><input type="range" id="{i}" min="{lo}" max="{hi}" step="{step}" '
        f'value="{value}"><output id="{i}-out">{value}</output>'
        for i, label, lo, hi, step, value in sliders
    )
    return (
        f'<div class="whatif" data-gpu-a="{a_gpu:.4f}" data-gpu-c="{PAPER_DRAFT}">'
        "<h4>What if? The speedup model, moved by hand (drawn here, nothing runs)</h4>"
        '<div class="presets">Presets: <button type="button" data-preset="run" disabled>this run</button>'
        '<button type="button" data-preset="cpu" disabled>this CPU (this run\'s costs)</button>'
        '<button type="button" data-preset="gpu">a GPU as in the paper</button></div>'
        f'<div class="sliders">{rows}</div>'
        '<svg viewBox="0 0 640 280" role="img" aria-label="modelled speedup against block size"></svg>'
        '<div class="readout"></div>'
        f'<div style="color:#556;font-size:12px">Speedup = E(B) / (cycle cost in plain steps), E(B) = (1 − a^B)/(1 − a); '
        "a verify of B tokens costs 1 + (v16 − 1)(B − 1)/15 plain steps. The GPU preset: the paper's Qwen3-8B "
        f"acceptance on GSM8K at block 16 (tau {PAPER_TAU}, a ≈ {a_gpu:.2f}), a verify of one plain step, and a "
        f"drafter pass assumed at {PAPER_DRAFT} plain steps. ★ this run, measured.</div></div>"
    )


WHATIF_JS = """
const root = element.querySelector('.whatif');
const svg = root.querySelector('svg');
const readout = root.querySelector('.readout');
const input = (id) => root.querySelector('#' + id);
const value = (id) => parseFloat(input(id).value);
const W = 640, H = 280, L = 48, R = 150, T = 14, B = 36, MAXB = 16;
const expected = (a, b) => a >= 1 ? b : (1 - Math.pow(a, b)) / (1 - a);
const verify = (v16, b) => 1 + (v16 - 1) * (b - 1) / 15;
const model = (a, v16, c, b, passes) => expected(a, b) / (passes * c + verify(v16, b));
let run = null;
const readRun = () => {
  const el = document.querySelector('#summary .run-model');
  if (!el) { run = null; } else {
    const d = el.dataset, b = parseInt(d.b);
    const v = parseFloat(d.v);
    run = {a: parseFloat(d.a), b: b, c: parseFloat(d.c) + parseFloat(d.o), s: parseFloat(d.s),
           v16: Math.min(8, Math.max(0.5, 1 + (v - 1) * 15 / Math.max(b - 1, 1)))};
  }
  root.querySelector('[data-preset="run"]').disabled = !run;
  root.querySelector('[data-preset="cpu"]').disabled = !run;
};
const set = (id, x) => { input(id).value = x; };
const draw = () => {
  const a = value('wi-a'), v16 = value('wi-v'), c = value('wi-c');
  for (const id of ['wi-a', 'wi-v', 'wi-c']) root.querySelector('#' + id + '-out').textContent = input(id).value;
  const sizes = Array.from({length: MAXB}, (_, i) => i + 1);
  const dflash = sizes.map((b) => model(a, v16, c, b, b > 1 ? 1 : 0));
  const ar = sizes.map((b) => model(a, v16, c, b, b - 1));
  const top = Math.max(2, ...dflash, ...ar, run ? run.s : 0) * 1.1;
  const x = (b) => L + (b - 1) * (W - L - R) / (MAXB - 1);
  const y = (s) => T + (1 - s / top) * (H - T - B);
  const line = (ys) => ys.map((s, i) => `${x(i + 1).toFixed(1)},${y(s).toFixed(1)}`).join(' ');
  const ticks = [];
  for (let b = 1; b <= MAXB; b += (b < 2 ? 1 : 2)) ticks.push(`<text x="${x(b)}" y="${H - B + 16}" text-anchor="middle" font-size="12">${b}</text>`);
  const step = top > 8 ? 2 : top > 4 ? 1 : 0.5;
  for (let s = 0; s <= top; s += step) ticks.push(`<text x="${L - 6}" y="${y(s) + 4}" text-anchor="end" font-size="12">${s}</text>`);
  let star = '';
  if (run) star = `<text id="wi-run" x="${x(run.b)}" y="${y(run.s) + 6}" text-anchor="middle" font-size="20" fill="#111">★</text>`;
  const best = dflash.indexOf(Math.max(...dflash)) + 1;
  svg.innerHTML = `<line x1="${L}" x2="${W - R}" y1="${y(1)}" y2="${y(1)}" stroke="#999" stroke-dasharray="4 4"/>` +
    `<line x1="${L}" x2="${L}" y1="${T}" y2="${H - B}" stroke="#333"/><line x1="${L}" x2="${W - R}" y1="${H - B}" y2="${H - B}" stroke="#333"/>` +
    ticks.join('') + `<text x="${(L + W - R) / 2}" y="${H - 4}" text-anchor="middle" font-size="13">block size B</text>` +
    `<polyline id="wi-dflash" fill="none" stroke="#b8860b" stroke-width="3" points="${line(dflash)}"/>` +
    `<polyline id="wi-ar" fill="none" stroke="#6f42c1" stroke-width="2" stroke-dasharray="6 4" points="${line(ar)}"/>` +
    `<text x="${W - R + 8}" y="${y(dflash[MAXB - 1]) + 4}" font-size="13" fill="#8a6100">DFlash (1 pass)</text>` +
    `<text x="${W - R + 8}" y="${y(ar[MAXB - 1]) + 4}" font-size="13" fill="#6f42c1">AR (B−1 passes)</text>` +
    `<text x="${W - R + 8}" y="${y(1) + 4}" font-size="12" fill="#666">plain = 1×</text>` + star;
  svg.dataset.dflash = dflash.map((s) => s.toFixed(3)).join(',');
  const at = run ? run.b : 16;
  readout.textContent = `DFlash: best at B = ${best} (${dflash[best - 1].toFixed(2)}×); at B = ${at}: ` +
    `${expected(a, at).toFixed(2)} tokens per cycle for ${(c + verify(v16, at)).toFixed(2)} plain steps = ` +
    `${dflash[at - 1].toFixed(2)}×` + (run ? `; this run measured ${run.s.toFixed(2)}×.` : '.');
};
root.querySelectorAll('input[type=range]').forEach((el) => el.addEventListener('input', draw));
root.querySelector('.presets').addEventListener('click', (event) => {
  const preset = event.target.dataset && event.target.dataset.preset;
  if (!preset) return;
  readRun();
  if (preset === 'gpu') { set('wi-a', root.dataset.gpuA); set('wi-v', 1); set('wi-c', root.dataset.gpuC); }
  else if (run) { if (preset === 'run') set('wi-a', run.a); set('wi-v', run.v16); set('wi-c', run.c); }
  draw();
});
const summary = document.getElementById('summary');
if (summary) new MutationObserver(() => {
  const had = run; readRun();
  if (run && (!had || had.s !== run.s)) { set('wi-a', run.a); set('wi-v', run.v16); set('wi-c', run.c); }
  draw();
}).observe(summary, {childList: true, subtree: true});
readRun();
draw();
"""
