// The worker page: reads the hub and token from its own URL, starts the
// Web Worker (worker_main.js) that does everything else, and shows its state.
//   /worker?token=T                 the hub that serves this page (same origin: /ws, /v1/...)
//   /worker/?token=T&hub=http://H:P another hub (tests; the page and the hub then differ in origin)
//   &name=N                         the worker's name in the hub's logs
//   &cpu=1, &capacity=C             the CPU path even with WebGPU; JOIN's placement weight
//   &corrupt=P                      tests only: a result is wrong with probability P (as moex-worker's
//                                   --inject-corrupt-prob), for the hub's --verify to catch
'use strict';

const q = new URLSearchParams(location.search);
const settings = JSON.parse(localStorage.getItem('moex-worker') || '{}');

function hubUrls() {
  const hub = q.get('hub');
  const origin = hub ? new URL(hub) : new URL(location.href);
  const secure = origin.protocol === 'https:' || origin.protocol === 'wss:';
  return {
    ws: `${secure ? 'wss' : 'ws'}://${origin.host}/ws`,
    http: `${secure ? 'https' : 'http'}://${origin.host}`,
  };
}

const $ = (id) => document.getElementById(id);
const mib = (b) => `${(b / 1048576).toFixed(1)} MiB`;
let worker = null;

function start() {
  if (worker) worker.terminate();
  const urls = hubUrls();
  $('hub').textContent = urls.ws;
  // The worker script's own directory holds moex_wasm.js, the .wasm and wgsl/.
  worker = new Worker(new URL('worker_main.js', document.baseURI || location.href));
  window.__moexWorker = worker;   // tests and the console: worker.postMessage({cmd: 'stop'})
  worker.onmessage = (ev) => {
    if (ev.data.status) show(ev.data.status);
    if (ev.data.log) addLog(ev.data.log);
  };
  worker.onerror = (ev) => { $('phase').textContent = `error: ${ev.message}`; };
  worker.postMessage({ cmd: 'start', cfg: {
    ws: urls.ws, http: urls.http, token: q.get('token') || '', name: q.get('name') || settings.name || '',
    budget: (settings.budgetMiB || 0) * 1048576, forceCpu: !!settings.cpu || q.get('cpu') === '1', capacity: +(q.get('capacity') || 0),
    corrupt: Math.min(1, Math.max(0, +(q.get('corrupt') || 0))),
  } });
}

// The worker's log lines, the last 200.
function addLog(line) {
  const el = $('log');
  el.textContent = (el.textContent + line + '\n').split('\n').slice(-201).join('\n');
  el.scrollTop = el.scrollHeight;
}

function show(s) {
  window.__moex = s;     // for tests and the console
  $('phase').textContent = s.fatal ? `stopped: ${s.fatal}` : `${s.phase} (${s.link})`;
  $('phase').className = s.fatal ? 'stopped' : '';
  $('dl').max = Math.max(1, s.download.total);
  $('dl').value = s.download.done;
  $('dltext').textContent = s.download.total ? `${mib(s.download.done)} of ${mib(s.download.total)}` : '';
  const c = s.capabilities || {};
  $('backend').textContent = s.backend === 'webgpu'
    ? `WebGPU: ${c.adapter}${c.fallbackAdapter ? ' (software)' : ''}${c.subgroups ? ', subgroups' : ''}${c.dot4 ? ', packed int8 dot' : ''}`
    : `CPU (WASM ${c.wasmSimd || ''})${s.gpuFailed ? ` — no WebGPU: ${s.gpuFailed}` : ''}`;
  $('model').textContent = s.model ? `${s.model.hash}: ${s.model.layers} layers × ${s.model.experts} experts, hidden ${s.model.hidden}` : '–';
  $('held').textContent = `${s.held}${s.heldOnCpu ? ` (${s.heldOnCpu} on the CPU)` : ''}`;
  $('cached').textContent = mib(s.cachedBytes);
  $('served').textContent = `${s.results} results, ${s.errors} errors, ${s.cancels} cancels; backlog ${s.backlog}`;
  $('latency').textContent = s.latencyMs ? `p50 ${s.latencyMs.p50.toFixed(1)} ms, p90 ${s.latencyMs.p90.toFixed(1)} ms (last ${s.latencyMs.n})` : '–';
}

$('budget').value = settings.budgetMiB || 0;
$('cpu').checked = !!settings.cpu;
$('name').value = settings.name || '';
$('settings').onsubmit = (ev) => {
  ev.preventDefault();
  settings.budgetMiB = +$('budget').value || 0;
  settings.cpu = $('cpu').checked;
  settings.name = $('name').value.trim();
  localStorage.setItem('moex-worker', JSON.stringify(settings));
  start();
};
start();
