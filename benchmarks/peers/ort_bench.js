// The same measurement as `numaserve bench`, on ONNX Runtime (npm
// onnxruntime-node, CPU execution provider):
//   node ort_bench.js --model PATH --shape 3,224,224 [--batch 1,8,32]
//                     [--threads N] [--seconds S] [--spin 0|1] [--json]
// --spin 0 stops idle intra-op threads from spinning (ONNX Runtime's
// session.intra_op.allow_spinning), the counterpart of OMP_WAIT_POLICY=passive.
// --shape is the input's shape without the batch dimension. With --json,
// one object per line per batch size with the keys numaserve bench uses.
'use strict';
const ort = require('onnxruntime-node');

function parseArgs(argv) {
  const args = {batch: '1,8,32', threads: 0, seconds: 3, spin: '1', json: false};
  for (let i = 2; i < argv.length; ++i) {
    const a = argv[i];
    if (a === '--json') { args.json = true; continue; }
    const value = argv[++i];
    if (value === undefined) throw new Error(`${a} needs a value`);
    args[a.replace(/^--/, '')] = value;
  }
  if (!args.model || !args.shape) throw new Error('--model and --shape are required');
  return args;
}

function percentile(sorted, q) {
  return sorted[Math.min(sorted.length - 1, Math.round(q * (sorted.length - 1)))];
}

async function main() {
  const args = parseArgs(process.argv);
  const threads = Number(args.threads);
  const options = {
    executionProviders: ['cpu'],
    graphOptimizationLevel: 'all',
    executionMode: 'sequential',
    interOpNumThreads: 1,
  };
  if (threads > 0) options.intraOpNumThreads = threads;
  options.extra = {session: {intra_op: {allow_spinning: String(args.spin)}}};
  const session = await ort.InferenceSession.create(args.model, options);
  const inner = args.shape.split(',').map(Number);
  const inputName = session.inputNames[0];
  for (const batch of args.batch.split(',').map(Number)) {
    const dims = [batch, ...inner];
    const data = new Float32Array(dims.reduce((a, b) => a * b, 1));
    for (let i = 0; i < data.length; ++i) data[i] = Math.random() * 2 - 1;
    const feeds = {[inputName]: new ort.Tensor('float32', data, dims)};
    for (let i = 0; i < 2; ++i) await session.run(feeds);
    const latencies = [];
    const start = performance.now();
    let now = start;
    while (latencies.length < 5 || now - start < Number(args.seconds) * 1000) {
      const t0 = performance.now();
      await session.run(feeds);
      now = performance.now();
      latencies.push(now - t0);
    }
    const total = (now - start) / 1000;
    latencies.sort((a, b) => a - b);
    const result = {
      model: args.model,
      batch,
      threads,
      iterations: latencies.length,
      inferences_per_second: batch * latencies.length / total,
      p50_ms: percentile(latencies, 0.5),
      p99_ms: percentile(latencies, 0.99),
    };
    if (args.json) {
      console.log(JSON.stringify(result));
    } else {
      console.log(`${args.model} batch ${batch}: ${result.inferences_per_second.toFixed(1)} ` +
                  `infer/s, p50 ${result.p50_ms.toFixed(3)} ms, p99 ${result.p99_ms.toFixed(3)} ms`);
    }
  }
}

main().catch((e) => {
  console.error(`ort_bench: ${e.message}`);
  process.exit(1);
});
