// The browser worker's WGSL expert FFN timed in node on Dawn (npm's webgpu:
// Chromium's WebGPU implementation), so that a machine with a GPU and no
// browser can run the very kernels the page runs (web/gpu.js, web/wgsl/):
// one Qwen3-30B-A3B expert (hidden 2048, ffn 768), q4_K_M and q8_0, one
// token and a decode layer's batch of 8 experts, each checked against a
// float64 reference first (ffn_bench.js says what is timed).
//
// Here (the repository):  cd bench/web && npm install && node bench_wgsl_ffn.mjs [options]
// On a bare Linux x64 GPU machine without node: the tarball of pack.sh, then
//   tar -xJf moex-wgsl-bench.tar.xz -C /tmp && /tmp/moex-wgsl-bench/run.sh [options]
// options: --reps N (timed runs per case, default 30), --seed S, --json FILE (the results),
//          --dawn KEY=VALUE (a Dawn option for create(), e.g. backend=vulkan; repeatable; without a
//          disable-dawn-features= option, disable-dawn-features=timestamp_quantization)
// Exit status: 0 every case computed right, 1 a wrong result or an error, 2 no WebGPU adapter
// (or npm's webgpu missing): "no adapter: ..." on stderr.
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import vm from 'node:vm';

const here = path.dirname(fileURLToPath(import.meta.url));

function parseArgs(argv) {
  const o = { reps: 30, seed: 12345, json: null, dawn: [] };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i], v = argv[i + 1];
    if (a === '--reps' && v) o.reps = Math.max(1, parseInt(v, 10)), i++;
    else if (a === '--seed' && v) o.seed = parseInt(v, 10), i++;
    else if (a === '--json' && v) o.json = v, i++;
    else if (a === '--dawn' && v) o.dawn.push(v), i++;
    else {
      console.error(`bench_wgsl_ffn: unknown or incomplete option '${a}' (see the header of ${path.basename(fileURLToPath(import.meta.url))})`);
      process.exit(1);
    }
  }
  return o;
}

// The packed layout (pack.sh: web/, reference.js beside this file) or the repository's.
function sources() {
  const packed = fs.existsSync(path.join(here, 'web', 'gpu.js'));
  return {
    web: packed ? path.join(here, 'web') : path.join(here, '..', '..', 'web'),
    reference: packed ? path.join(here, 'reference.js') : path.join(here, '..', '..', 'tests', 'web', 'reference.js'),
  };
}

// Math.f16round (node 24+) for older nodes: round to the nearest f16, ties to even.
function f16round(x) {
  if (!Number.isFinite(x) || x === 0) return x;
  const a = Math.abs(x);
  if (a >= 65520) return Math.sign(x) * Infinity;
  const e = Math.max(-14, Math.floor(Math.log2(a)));
  const ulp = 2 ** (e - 10), q = a / ulp, f = Math.floor(q), d = q - f;
  return Math.sign(x) * (d > 0.5 || (d === 0.5 && f % 2) ? f + 1 : f) * ulp;
}

function noAdapter(why) {
  console.error(`no adapter: ${why}`);
  process.exit(2);
}

async function main() {
  const opts = parseArgs(process.argv.slice(2));
  let webgpu;
  try {
    webgpu = await import('webgpu');
  } catch (e) {
    noAdapter(`npm's webgpu is not installed (cd bench/web && npm install): ${e.message}`);
  }
  // Dawn rounds timestamps to 65.536 us for pages (a timing side channel); a benchmark wants them whole.
  if (!opts.dawn.some((o) => o.startsWith('disable-dawn-features='))) opts.dawn.push('disable-dawn-features=timestamp_quantization');
  const gpu = webgpu.create(opts.dawn);
  // the browser's globals, as gpu.js expects them
  Object.assign(globalThis, webgpu.globals);
  globalThis.self = globalThis;
  Object.defineProperty(globalThis, 'navigator', { value: { gpu }, configurable: true, writable: true });
  if (!Math.f16round) Math.f16round = f16round;
  const src = sources();
  const realFetch = globalThis.fetch;
  globalThis.fetch = async (url, init) => {   // gpu.js fetches its WGSL: from the directory
    if (typeof url === 'string' && url.startsWith('moex-web/')) {
      const text = fs.readFileSync(path.join(src.web, url.slice('moex-web/'.length)), 'utf8');
      return { ok: true, status: 200, text: async () => text };
    }
    return realFetch(url, init);
  };
  for (const f of [path.join(src.web, 'gpu.js'), src.reference, path.join(here, 'ffn_bench.js')])
    vm.runInThisContext(fs.readFileSync(f, 'utf8'), { filename: f });
  console.log(`node ${process.version}, Dawn options [${opts.dawn.join(', ')}], WGSL features ` +
              `[${[...(gpu.wgslLanguageFeatures || [])].join(', ')}]`);
  let res;
  try {
    res = await globalThis.moexFfnBench({ base: 'moex-web/', reps: opts.reps, seed: opts.seed }, (l) => console.log(l));
  } catch (e) {
    if (/no adapter/.test(String(e.message || e))) noAdapter(`${e.message} (Dawn found no usable GPU: ` +
      'Vulkan needs its loader and the GPU driver\'s ICD, e.g. VK_DRIVER_FILES=.../nvidia_icd.json, and ' +
      'NVIDIA\'s driver glvnd\'s libraries: libglvnd0 libglx0 libegl1 libgl1, see pack.sh)');
    throw e;
  }
  res.node = process.version;
  if (opts.json) fs.writeFileSync(opts.json, JSON.stringify(res, null, 1));
  console.log(`result ${JSON.stringify(res)}`);
  const wrong = res.cases.filter((c) => !c.ok);
  if (wrong.length) {
    console.error(`bench_wgsl_ffn: ${wrong.length} case(s) computed wrong results (relL2 above 2e-3)`);
    process.exit(1);
  }
  process.exit(0);   // Dawn's threads would keep node alive
}

main().catch((e) => {
  console.error(`bench_wgsl_ffn: ${e.stack || e}`);
  process.exit(1);
});
