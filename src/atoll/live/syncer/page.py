"""The syncer's status page (`/` of `atoll syncer --http-port`): one self-contained HTML file,
no external resource, that reads `/status.json` and `/history.json` every second and draws the
learners (island size, heartbeat age, turning red when a learner goes quiet, steps, tokens,
tokens/s, the last update sent to it, merges, staleness, reconnects, bytes each way:
syncer/roster.py; every column explained in its header's tooltip), the run's figures
(metrics.Figures: tokens, rounds, goodput and its window, bytes against the data-parallel
equivalent, a bar to the token budget), goodput and tokens over the whole run (the syncer keeps
the points: a page opened late draws the run from its start), a learner x round participation
strip, the failures and rejoins by kind (finished, lost, joined, healed, shard down, shard
restored, restored), listed and marked on the goodput chart, and the global model's held-out
loss against tokens as the syncer evaluates it (syncer/evaluation.py). Every chart has axes
with units and a legend. A shard set's page (shard_endpoints.py: `shards` is a list) also has
one row per shard, red while it does not answer."""

PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>atoll syncer</title>
<style>
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;margin:.5em 0;font-size:14px}td,th{border:1px solid #ccc;
padding:.2em .45em;text-align:right;white-space:nowrap}th{background:#f3f3f3}
td:first-child{text-align:left}
.quiet{background:#f8d0d0;color:#900}.ok{color:#070}
canvas{border:1px solid #ccc;margin:.3em .6em .3em 0}
#figs span{margin-right:1.4em}
</style></head><body>
<h2>atoll syncer <small id="who"></small></h2>
<div id="figs"></div>
<div id="shardset"></div>
<h3>Learners</h3>
<table id="learners"><thead><tr>
<th title="the learner's id">learner</th>
<th title="its process's incarnation (a new one after each restart)">incarnation</th>
<th title="ranks training as this learner (an island of N processes)">ranks</th>
<th title="seconds since its last heartbeat (red: quiet, past half the lost-after time)">
beat age</th>
<th title="training steps it reported, all its incarnations">steps</th>
<th title="tokens this incarnation reported">tokens</th>
<th title="tokens per second over its last 10 s of heartbeats">tokens/s</th>
<th title="the newest update sent to it: fragment@version">last update (fragment@version)</th>
<th title="its contributions merged into rounds">merged</th>
<th title="staleness of its contribution in the newest round it took part in (versions
behind)">stale</th>
<th title="times its communication side reconnected without a restart">reconnects</th>
<th title="megabytes it sent (contributions) / received (updates)">MB up / down</th>
</tr></thead><tbody></tbody></table>
<h3>Held-out loss of the global model, against tokens</h3>
<canvas id="loss" width="460" height="200"></canvas> <span id="lossnote"></span>
<h3>Goodput and tokens over the run</h3>
<canvas id="goodput" width="460" height="200"></canvas>
<canvas id="tokens" width="460" height="200"></canvas>
<h3>Participation: learner x round (newest right)</h3>
<canvas id="strip" width="840" height="120"></canvas>
<h3>Failures and rejoins</h3><ul id="marks"></ul>
<script>
let hist = {points: [], marks: []};  // /history.json: the whole run's chart points
const COLOUR = {lost: '#d62728', 'shard down': '#d62728', joined: '#2ca02c',
                healed: '#2ca02c', 'shard restored': '#2ca02c', restored: '#2ca02c',
                finished: '#7f7f7f'};
function ticks(lo, hi, n) {  // about n round numbers from lo to hi
  const span = Math.max(hi - lo, 1e-9), raw = span / n;
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 5, 10].map(k => k * mag).find(k => span / k <= n) || 10 * mag;
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + 1e-9 * span; v += step) out.push(v);
  return out;
}
function short(v) {
  const a = Math.abs(v);
  return a >= 1e9 ? (v / 1e9).toFixed(1) + 'G' : a >= 1e6 ? (v / 1e6).toFixed(1) + 'M' :
         a >= 1e3 ? (v / 1e3).toFixed(1) + 'k' : (+v.toPrecision(3)).toString();
}
// a chart on canvas `id`: axes with ticks, `xlabel` and `ylabel` (units), a legend of the
// line (`name`) and of the marks' kinds; `pts` [{x, y}], `marks` [{x, kind}]
function plot(id, o) {
  const c = document.getElementById(id), g = c.getContext('2d');
  const L = 56, R = 10, T = 22, B = 34, W = c.width - L - R, H = c.height - T - B;
  g.fillStyle = '#fff'; g.fillRect(0, 0, c.width, c.height);
  g.font = '11px sans-serif'; g.fillStyle = '#222'; g.strokeStyle = '#888'; g.lineWidth = 1;
  g.beginPath(); g.moveTo(L, T); g.lineTo(L, T + H); g.lineTo(L + W, T + H); g.stroke();
  g.textAlign = 'center'; g.fillText(o.xlabel, L + W / 2, c.height - 4);
  g.save(); g.translate(11, T + H / 2); g.rotate(-Math.PI / 2); g.fillText(o.ylabel, 0, 0);
  g.restore();
  const pts = o.pts;
  if (!pts.length) { g.fillText('no points yet', L + W / 2, T + H / 2); g.textAlign = 'left';
                     return; }
  const xs = pts.map(p => p.x), ys = pts.map(p => p.y);
  const x0 = Math.min(...xs), x1 = Math.max(Math.max(...xs), x0 + 1e-9);
  let y0 = o.zero ? 0 : Math.min(...ys), y1 = Math.max(...ys, o.zero ? 1e-9 : -Infinity);
  if (o.ymax !== undefined) y1 = Math.max(y1, o.ymax);
  if (y1 - y0 < 1e-9) { y0 -= 0.5; y1 += 0.5; }
  const X = x => L + W * (x - x0) / (x1 - x0), Y = y => T + H - H * (y - y0) / (y1 - y0);
  g.fillStyle = '#444';
  ticks(x0, x1, 5).forEach(v => { g.fillText(short(v), X(v), T + H + 13);
    g.beginPath(); g.moveTo(X(v), T + H); g.lineTo(X(v), T + H + 3); g.stroke(); });
  g.textAlign = 'right';
  ticks(y0, y1, 4).forEach(v => { g.fillText(o.yfmt(v), L - 4, Y(v) + 4);
    g.strokeStyle = '#eee'; g.beginPath(); g.moveTo(L + 1, Y(v)); g.lineTo(L + W, Y(v));
    g.stroke(); });
  const kinds = new Set();
  (o.marks || []).filter(m => m.x >= x0 && m.x <= x1).forEach(m => {
    kinds.add(m.kind); g.strokeStyle = COLOUR[m.kind] || '#999'; g.beginPath();
    g.moveTo(X(m.x), T); g.lineTo(X(m.x), T + H); g.stroke();
  });
  g.strokeStyle = '#1f77b4'; g.lineWidth = 2; g.beginPath();
  pts.forEach((p, i) => i ? g.lineTo(X(p.x), Y(p.y)) : g.moveTo(X(p.x), Y(p.y)));
  g.stroke(); g.lineWidth = 1; g.fillStyle = '#1f77b4';
  if (pts.length < 80) pts.forEach(p => g.fillRect(X(p.x) - 2, Y(p.y) - 2, 4, 4));
  // the legend: the line, then each kind of mark drawn
  g.textAlign = 'left'; let lx = L + 6;
  const entry = (colour, text) => { g.fillStyle = colour; g.fillRect(lx, 8, 12, 3);
    g.fillStyle = '#222'; g.fillText(text, lx + 15, 13); lx += 22 + g.measureText(text).width; };
  entry('#1f77b4', o.name + ' (' + o.yfmt(ys[ys.length - 1]) + ')');
  [...kinds].sort().forEach(k => entry(COLOUR[k] || '#999', k));
}
function strip(s) {
  const c = document.getElementById('strip'), g = c.getContext('2d');
  g.fillStyle = '#fff'; g.fillRect(0, 0, c.width, c.height);
  const ids = [...new Set([...s.learners.map(l => l.id),
                           ...s.recent_rounds.flatMap(r => r.participants)])].sort();
  const rows = Math.max(ids.length, 1), n = Math.max(s.recent_rounds.length, 1);
  const h = (c.height - 4) / rows, w = (c.width - 60) / n;
  g.font = '11px sans-serif';
  ids.forEach((id, j) => { g.fillStyle = '#222'; g.fillText(id, 2, 4 + h * j + h * .7); });
  s.recent_rounds.forEach((r, i) => r.participants.forEach(p => {
    g.fillStyle = '#2ca02c';
    g.fillRect(58 + i * w, 2 + h * ids.indexOf(p), Math.max(w - 1, 1), h - 2);
  }));
}
function fig(label, value, tip) {
  return `<span title="${tip}">${label} <b>${value}</b></span>`;
}
async function tick() {
  try {
    const s = await (await fetch('status.json', {cache: 'no-store'})).json();
    document.getElementById('who').textContent =
      `run ${s.run_id}, shard ${s.shard}/${s.shards}, epoch ${s.epoch}`;
    const budget = s.token_budget ? ` / ${s.token_budget.toLocaleString()}` : '';
    document.getElementById('figs').innerHTML =
      `<span title="rounds closed: merges of one fragment (a shard set: summed)">rounds ` +
      `<b id="rounds">${s.rounds}</b></span>` +
      fig('learners live', `${s.learners_live}</b> of <b>${s.learners_expected}`,
          'live sessions, of the learners expected') +
      fig('tokens', s.tokens.toLocaleString() + budget,
          'tokens the learners report (the token budget counts these)') +
      fig('goodput', `<span id="goodputfig">${(100 * s.goodput).toFixed(1)}%</span>`,
          'accepted step-seconds / (learners expected x the training window: the first ' +
          `join to the latest contribution, ${s.window_s.toFixed(0)} s); it holds while idle`) +
      fig('received / sent', `${(s.bytes_in / 1e6).toFixed(2)} / ` +
          `${(s.bytes_out / 1e6).toFixed(2)} MB`,
          'contribution bytes accepted / update bytes sent') +
      fig('data-parallel', s.dp_bytes ? (s.dp_bytes / 1e6).toFixed(0) + ' MB' : '-',
          'what a data-parallel ring all-reduce of fp32 gradients would have sent') +
      fig('refused', s.refused, 'contributions refused') +
      (s.token_budget ? `<progress id="budget" max="${s.token_budget}" value="` +
                        `${Math.min(s.tokens, s.token_budget)}"></progress>` : '');
    const body = document.querySelector('#learners tbody');
    body.innerHTML = s.learners.map(l => {
      const quiet = l.age_s > s.quiet_after_s;
      const st = l.staleness === undefined || l.staleness < 0 ? '-' : l.staleness;
      const mb = v => ((v || 0) / 1e6).toFixed(2);
      return `<tr class="${quiet ? 'quiet' : ''}"><td>${l.id}</td><td>${l.incarnation}</td>` +
             `<td>${l.ranks || 1}</td>` +
             `<td class="${quiet ? '' : 'ok'}">${l.age_s.toFixed(1)} s</td>` +
             `<td>${(l.steps || 0).toLocaleString()}</td>` +
             `<td>${l.tokens.toLocaleString()}</td>` +
             `<td>${Math.round(l.tokens_per_s || 0).toLocaleString()}</td>` +
             `<td>${l.last || '-'}</td><td>${l.merged || 0}</td><td>${st}</td>` +
             `<td>${l.reconnects || 0}</td><td>${mb(l.bytes_in)} / ${mb(l.bytes_out)}</td></tr>`;
    }).join('');
    document.getElementById('marks').innerHTML = s.marks.slice().reverse().map(m =>
      `<li><span style="color:${COLOUR[m.kind] || '#999'}">&#9632;</span> ` +
      `${new Date(m.t * 1000).toLocaleTimeString()} <b>${m.kind}</b> ${m.learner || ''}` +
      `${m.shard === undefined ? '' : ' (shard ' + m.shard + ')'}` +
      `${m.why ? ': ' + m.why : ''}</li>`).join('');
    hist = await (await fetch('history.json', {cache: 'no-store'})).json();
    window.atollHistory = hist.points;  // for a reader of the page (and its test)
    const t0 = hist.points.length ? Math.min(hist.points[0].t, s.first_join || Infinity) : 0;
    const marks = hist.marks.map(m => ({x: m.t - t0, kind: m.kind}));
    const since = 'seconds since the first join';
    plot('goodput', {pts: hist.points.map(p => ({x: p.t - t0, y: 100 * p.goodput})),
                     name: 'goodput', xlabel: since, ylabel: 'goodput (%)', zero: true,
                     ymax: 100, yfmt: v => v.toFixed(0) + '%', marks: marks});
    plot('tokens', {pts: hist.points.map(p => ({x: p.t - t0, y: p.tokens})),
                    name: 'tokens', xlabel: since, ylabel: 'tokens', zero: true,
                    yfmt: short, marks: []});
    plot('loss', {pts: s.evals.filter(e => e.loss !== null)  // null: not finite
                             .map(e => ({x: e.tokens, y: e.loss})),
                  name: 'global model', xlabel: 'tokens', ylabel: 'loss (nats/byte)',
                  zero: false, yfmt: v => v.toFixed(2), marks: []});
    const bad = s.evals.filter(e => e.loss === null).length;
    document.getElementById('lossnote').textContent = s.evals.length ?
      (bad ? `${bad} evaluation(s) not finite (diverged), not drawn` : '') :
      (s.token_budget ? 'no evaluation yet (the first at 1/eval_points of the budget)'
                      : 'no evaluation yet (every eval_every_s seconds; eval=false: none)');
    strip(s);
    shardSet(s);
  } catch (e) { document.getElementById('who').textContent = 'unreachable: ' + e; }
}
// a shard set: one row per shard (its own figures; red while it does not answer)
function shardSet(s) {
  const el = document.getElementById('shardset');
  if (!Array.isArray(s.shards)) { el.innerHTML = ''; return; }
  document.getElementById('who').textContent =
    `run ${s.run_id}, ${s.shards.length} shards (home shard 0: epoch ${s.epoch})`;
  const mb = v => v == null ? '-' : (v / 1e6).toFixed(2);
  const n = v => v == null ? '-' : v;
  el.innerHTML = '<h3>Shards</h3><table id="shards"><thead><tr><th>shard</th><th>state</th>' +
    '<th>rounds</th><th>accepted</th><th>refused</th><th>bytes in/out MB</th>' +
    '<th>learners live</th><th>restarts</th><th>figures age</th></tr></thead><tbody>' +
    s.shards.map(r => `<tr class="${r.up ? '' : 'quiet'}"><td>${r.shard}</td>` +
      `<td class="${r.up ? 'ok' : ''}">${r.up ? 'up' : 'down'}</td><td>${n(r.rounds)}</td>` +
      `<td>${n(r.accepted)}</td><td>${n(r.refused)}</td>` +
      `<td>${mb(r.bytes_in)} / ${mb(r.bytes_out)}</td><td>${n(r.learners_live)}</td>` +
      `<td>${n(r.restarts)}</td><td>${r.age_s == null ? '-' : r.age_s.toFixed(1) + ' s'}</td>` +
      '</tr>').join('') + '</tbody></table>';
}
tick(); setInterval(tick, 1000);
</script></body></html>
"""
