"""The syncer's status page (`/` of `atoll syncer --http-port`): one self-contained HTML file,
no external resource, that reads `/status.json` every second and draws the learners (island
size, heartbeat age, turning red when a learner goes quiet, steps, tokens, the last update sent
to it, merges, staleness, reconnects, bytes each way: syncer/roster.py), the run's figures
(bytes against the data-parallel equivalent, a bar to the token budget), goodput and tokens
over time, a learner x round participation strip, the failures and rejoins the syncer saw
(listed, and marked on the goodput chart: red lost, green joined), and the global model's
held-out loss against tokens as the syncer evaluates it (syncer/evaluation.py).
A shard set's page (shard_endpoints.py: `shards` is a list) also has one row per shard, red
while it does not answer."""

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
<table id="learners"><thead><tr><th>learner</th><th>incarnation</th><th>ranks</th>
<th>beat age</th><th>steps</th><th>tokens</th><th>tokens/s</th><th>last update</th>
<th>merged</th><th>stale</th><th>reconnects</th><th>MB up / down</th></tr></thead>
<tbody></tbody></table>
<h3>Held-out loss of the global model, against tokens</h3>
<canvas id="loss" width="420" height="160"></canvas> <span id="lossnote"></span>
<h3>Goodput and tokens over time</h3>
<canvas id="goodput" width="420" height="160"></canvas>
<canvas id="tokens" width="420" height="160"></canvas>
<h3>Participation: learner x round (newest right)</h3>
<canvas id="strip" width="840" height="120"></canvas>
<h3>Failures and rejoins</h3><ul id="marks"></ul>
<script>
const hist = [], seen = {};
// a line of points {x, y} on canvas `id`; `marks`: [{x, colour}] drawn as vertical lines
function plot(id, label, pts, fmt, marks = [], zero = true) {
  const c = document.getElementById(id), g = c.getContext('2d');
  g.fillStyle = '#fff'; g.fillRect(0, 0, c.width, c.height);
  g.fillStyle = '#222'; g.font = '12px sans-serif'; g.fillText(label, 6, 14);
  if (pts.length < 1) return;
  const x0 = pts[0].x, x1 = Math.max(pts[pts.length - 1].x, x0 + 1e-9);
  const ys = pts.map(p => p.y), top = Math.max(...ys, 1e-9);
  const bot = zero ? 0 : Math.min(...ys) - 0.05 * Math.max(top - Math.min(...ys), 1e-3);
  const X = x => 6 + (c.width - 12) * (x - x0) / (x1 - x0);
  const Y = y => c.height - 6 - (c.height - 26) * (y - bot) / Math.max(top - bot, 1e-9);
  marks.filter(m => m.x >= x0).forEach(m => {
    g.strokeStyle = m.colour; g.lineWidth = 1; g.beginPath();
    g.moveTo(X(m.x), 20); g.lineTo(X(m.x), c.height - 4); g.stroke();
  });
  g.strokeStyle = '#1f77b4'; g.lineWidth = 2; g.beginPath();
  pts.forEach((p, i) => i ? g.lineTo(X(p.x), Y(p.y)) : g.moveTo(X(p.x), Y(p.y)));
  g.stroke();
  g.fillStyle = '#1f77b4';
  pts.forEach(p => g.fillRect(X(p.x) - 2, Y(p.y) - 2, 4, 4));
  g.fillStyle = '#222'; g.fillText(fmt(ys[ys.length - 1]), c.width - 110, 14);
}
function chart(id, key, fmt, marks) {
  plot(id, key, hist.map(h => ({x: h.t, y: h[key]})), fmt, marks);
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
async function tick() {
  try {
    const s = await (await fetch('status.json', {cache: 'no-store'})).json();
    document.getElementById('who').textContent =
      `run ${s.run_id}, shard ${s.shard}/${s.shards}, epoch ${s.epoch}`;
    const budget = s.token_budget ? ` / ${s.token_budget.toLocaleString()}` : '';
    document.getElementById('figs').innerHTML =
      `<span>rounds <b id="rounds">${s.rounds}</b></span>` +
      `<span>learners live <b>${s.learners_live}</b> of ${s.learners_expected}</span>` +
      `<span>tokens <b>${s.tokens.toLocaleString()}</b>${budget}</span>` +
      `<span>goodput <b>${(100 * s.goodput).toFixed(1)}%</b></span>` +
      `<span>bytes in/out <b>${(s.bytes_in / 1e6).toFixed(2)} / ` +
      `${(s.bytes_out / 1e6).toFixed(2)} MB</b> (data-parallel ` +
      `${s.dp_bytes ? (s.dp_bytes / 1e6).toFixed(0) + ' MB' : '-'})</span>` +
      `<span>refused <b>${s.refused}</b></span>` +
      (s.token_budget ? `<progress id="budget" max="${s.token_budget}" value="` +
                        `${Math.min(s.tokens, s.token_budget)}"></progress>` : '');
    const body = document.querySelector('#learners tbody');
    const now = Date.now() / 1000;
    body.innerHTML = s.learners.map(l => {
      const quiet = l.age_s > s.quiet_after_s;
      const key = l.id + '/' + l.incarnation, p = seen[key];  // tokens/s since the last poll
      const rate = p && now > p.t && l.tokens >= p.tokens ? (l.tokens - p.tokens) / (now - p.t)
                                                          : (p ? p.rate : 0);
      seen[key] = {t: now, tokens: l.tokens, rate: rate};
      const st = l.staleness === undefined || l.staleness < 0 ? '-' : l.staleness;
      const mb = v => ((v || 0) / 1e6).toFixed(2);
      return `<tr class="${quiet ? 'quiet' : ''}"><td>${l.id}</td><td>${l.incarnation}</td>` +
             `<td>${l.ranks || 1}</td>` +
             `<td class="${quiet ? '' : 'ok'}">${l.age_s.toFixed(1)} s</td>` +
             `<td>${(l.steps || 0).toLocaleString()}</td>` +
             `<td>${l.tokens.toLocaleString()}</td><td>${Math.round(rate).toLocaleString()}</td>` +
             `<td>${l.last || '-'}</td><td>${l.merged || 0}</td><td>${st}</td>` +
             `<td>${l.reconnects || 0}</td><td>${mb(l.bytes_in)} / ${mb(l.bytes_out)}</td></tr>`;
    }).join('');
    document.getElementById('marks').innerHTML = s.marks.slice().reverse().map(m =>
      `<li>${new Date(m.t * 1000).toLocaleTimeString()} ${m.kind} ${m.learner}` +
      `${m.shard === undefined ? '' : ' (shard ' + m.shard + ')'}</li>`).join('');
    hist.push({t: Date.now() / 1000, goodput: s.goodput, tokens: s.tokens});
    if (hist.length > 600) hist.shift();
    const marks = s.marks.map(m => ({x: m.t, colour: m.kind === 'lost' ? '#d62728' : '#2ca02c'}));
    chart('goodput', 'goodput', v => (100 * v).toFixed(1) + '%', marks);
    chart('tokens', 'tokens', v => v.toLocaleString(), []);
    plot('loss', 'eval loss', s.evals.filter(e => e.loss !== null)  // null: not finite
                                .map(e => ({x: e.tokens, y: e.loss})),
         v => v.toFixed(4), [], false);
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
