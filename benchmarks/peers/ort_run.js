// One inference on ONNX Runtime (npm onnxruntime-node, CPU execution
// provider, the session options ort_bench.js measures with), from a NumPy
// file to a NumPy file: the peer side of the output checks.
//   node ort_run.js --model PATH --input IN.npy --output OUT.npy [--threads N]
// IN.npy is the model's first input, float32 little-endian in C order, with
// its batch dimension; OUT.npy gets the model's first output in the same
// form. compare.py and make_reference_outputs.py run it.
'use strict';
const fs = require('fs');
const ort = require('onnxruntime-node');

const MAGIC = Buffer.from([0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59]);  // "\x93NUMPY"

function parseArgs(argv) {
  const args = {threads: 0};
  for (let i = 2; i < argv.length; ++i) {
    const value = argv[i + 1];
    if (value === undefined) throw new Error(`${argv[i]} needs a value`);
    args[argv[i].replace(/^--/, '')] = value;
    ++i;
  }
  if (!args.model || !args.input || !args.output) {
    throw new Error('--model, --input and --output are required');
  }
  return args;
}

// A float32 array and its shape from a .npy file (format versions 1 to 3).
function readNpy(path) {
  const bytes = fs.readFileSync(path);
  if (bytes.length < 10 || !bytes.subarray(0, 6).equals(MAGIC)) {
    throw new Error(`${path}: not a .npy file`);
  }
  const major = bytes[6];
  const headerLength = major === 1 ? bytes.readUInt16LE(8) : bytes.readUInt32LE(8);
  const start = major === 1 ? 10 : 12;
  const header = bytes.subarray(start, start + headerLength).toString('latin1');
  const descr = /'descr':\s*'([^']*)'/.exec(header);
  const fortran = /'fortran_order':\s*(True|False)/.exec(header);
  const shape = /'shape':\s*\(([^)]*)\)/.exec(header);
  if (!descr || !fortran || !shape) throw new Error(`${path}: unreadable header ${header}`);
  if (descr[1] !== '<f4' || fortran[1] !== 'False') {
    throw new Error(`${path}: dtype ${descr[1]}, fortran_order ${fortran[1]}; ` +
                    'only float32 (<f4) in C order is supported');
  }
  const dims = shape[1].split(',').map((s) => s.trim()).filter((s) => s).map(Number);
  const count = dims.reduce((a, b) => a * b, 1);
  const offset = start + headerLength;
  if (bytes.length - offset !== 4 * count) {
    throw new Error(`${path}: ${bytes.length - offset} data bytes for shape [${dims}]`);
  }
  // Copied, so the Float32Array is aligned whatever the header length.
  const data = new Float32Array(count);
  Buffer.from(data.buffer).set(bytes.subarray(offset));
  return {data, dims};
}

// A .npy file (format 1.0) of a float32 tensor.
function writeNpy(path, data, dims) {
  const shape = dims.length === 1 ? `(${dims[0]},)` : `(${dims.join(', ')})`;
  let header = `{'descr': '<f4', 'fortran_order': False, 'shape': ${shape}, }`;
  // Magic, version and length take 10 bytes; the header ends in '\n' and
  // pads the whole preamble to a multiple of 64.
  header += ' '.repeat(63 - ((10 + header.length) % 64)) + '\n';
  const preamble = Buffer.alloc(10);
  MAGIC.copy(preamble);
  preamble[6] = 1;
  preamble[7] = 0;
  preamble.writeUInt16LE(header.length, 8);
  fs.writeFileSync(path, Buffer.concat([
    preamble, Buffer.from(header, 'latin1'),
    Buffer.from(data.buffer, data.byteOffset, data.byteLength)]));
}

async function main() {
  const args = parseArgs(process.argv);
  const options = {
    executionProviders: ['cpu'],
    graphOptimizationLevel: 'all',
    executionMode: 'sequential',
    interOpNumThreads: 1,
  };
  if (Number(args.threads) > 0) options.intraOpNumThreads = Number(args.threads);
  const session = await ort.InferenceSession.create(args.model, options);
  const input = readNpy(args.input);
  const results = await session.run(
      {[session.inputNames[0]]: new ort.Tensor('float32', input.data, input.dims)});
  const output = results[session.outputNames[0]];
  if (output.type !== 'float32') {
    throw new Error(`output ${session.outputNames[0]} is ${output.type}, not float32`);
  }
  writeNpy(args.output, output.data, output.dims);
}

main().catch((e) => {
  console.error(`ort_run: ${e.message}`);
  process.exit(1);
});
