// ONNX Runtime's own per-operator profile for a model, summarized the way
// `numaserve bench --profile` summarizes numaserve's, to see where the two
// engines spend their time on the same model:
//   node benchmarks/models/ort_profile.js --model PATH --shape 3,224,224
//        [--batch 32] [--threads 2] [--runs 20] [--spin 0|1] [--top 15]
// Uses the onnxruntime-node that benchmarks/peers pins (npm ci there first).
// Prints ms per run by operator type (kernel time, summed over nodes) and
// the costliest nodes, with their share of the time in kernels.
'use strict';
const fs = require('fs');
const os = require('os');
const path = require('path');
const ort = require(path.join(__dirname, '..', 'peers', 'node_modules', 'onnxruntime-node'));

function parseArgs(argv) {
  const args = {batch: '32', threads: '2', runs: '20', spin: '0', top: '15'};
  for (let i = 2; i < argv.length; ++i) {
    const value = argv[i + 1];
    if (value === undefined) throw new Error(`${argv[i]} needs a value`);
    args[argv[i].replace(/^--/, '')] = value;
    ++i;
  }
  if (!args.model || !args.shape) throw new Error('--model and --shape are required');
  return args;
}

async function main() {
  const args = parseArgs(process.argv);
  const prefix = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'ort_profile_')), 'trace');
  const session = await ort.InferenceSession.create(args.model, {
    executionProviders: ['cpu'],
    graphOptimizationLevel: 'all',
    executionMode: 'sequential',
    interOpNumThreads: 1,
    intraOpNumThreads: Number(args.threads),
    enableProfiling: true,
    profileFilePrefix: prefix,
    extra: {session: {intra_op: {allow_spinning: String(args.spin)}}},
  });
  const batch = Number(args.batch);
  const dims = [batch, ...args.shape.split(',').map(Number)];
  const data = new Float32Array(dims.reduce((a, b) => a * b, 1));
  for (let i = 0; i < data.length; ++i) data[i] = Math.random() * 2 - 1;
  const feeds = {[session.inputNames[0]]: new ort.Tensor('float32', data, dims)};
  for (let i = 0; i < 2; ++i) await session.run(feeds);
  const runs = Number(args.runs);
  const start = performance.now();
  for (let i = 0; i < runs; ++i) await session.run(feeds);
  const wallMs = (performance.now() - start) / runs;
  session.endProfiling();
  const dir = path.dirname(prefix);
  const file = fs.readdirSync(dir).map((f) => path.join(dir, f)).find((f) => f.endsWith('.json'));
  const events = JSON.parse(fs.readFileSync(file, 'utf8'));
  fs.rmSync(dir, {recursive: true, force: true});
  // Kernel events of every run; the 2 warm-up runs are dropped per node.
  const perNode = new Map();
  for (const e of events) {
    if (e.cat !== 'Node' || !e.name.endsWith('_kernel_time')) continue;
    const name = e.name.slice(0, -'_kernel_time'.length);
    const entry = perNode.get(name) || {op: e.args.op_name, durs: []};
    entry.durs.push(e.dur / 1000);
    perNode.set(name, entry);
  }
  const nodes = [];
  for (const [name, e] of perNode) {
    const measured = e.durs.slice(-runs);
    nodes.push({name, op: e.op, ms: measured.reduce((a, b) => a + b, 0) / runs});
  }
  const total = nodes.reduce((a, n) => a + n.ms, 0);
  const byOp = new Map();
  for (const n of nodes) {
    const e = byOp.get(n.op) || {ms: 0, count: 0};
    e.ms += n.ms;
    e.count += 1;
    byOp.set(n.op, e);
  }
  const pct = (ms) => (100 * ms / total).toFixed(1).padStart(5) + '%';
  console.log(`ONNX Runtime ${args.model} batch ${batch}, ${args.threads} threads: ` +
              `${total.toFixed(3)} ms per run in ${nodes.length} kernels, run wall ` +
              `${wallMs.toFixed(3)} ms`);
  console.log(`  ${'op'.padEnd(24)} ${'nodes'.padStart(5)} ${'ms/run'.padStart(10)}  share`);
  for (const [op, e] of [...byOp].sort((a, b) => b[1].ms - a[1].ms)) {
    console.log(`  ${op.padEnd(24)} ${String(e.count).padStart(5)} ${e.ms.toFixed(3).padStart(10)} ${pct(e.ms)}`);
  }
  const top = Number(args.top);
  console.log(`  top ${Math.min(top, nodes.length)} nodes`);
  for (const n of nodes.sort((a, b) => b.ms - a.ms).slice(0, top)) {
    console.log(`  ${n.ms.toFixed(3).padStart(10)} ${pct(n.ms)}  ${n.op}: ${n.name}`);
  }
}

main().catch((e) => {
  console.error(`ort_profile: ${e.message}`);
  process.exit(1);
});
