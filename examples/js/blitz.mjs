// A JavaScript client for Blitz's native POST /embed, on the portable msgpack layout:
// string keys only, `embeddings` is the little-endian bytes of an array whose `shape` and
// `dtype` (numpy's dtype.str: "<f4", "<f2", "|i1", "|u1") travel beside it. Node 18+ or a
// browser; one dependency, @msgpack/msgpack (`npm ci` here).
//
//   node examples/js/blitz.mjs http://127.0.0.1:8000 "hello world" "fast embeddings"
//
// tests/unit/test_portable_layout.py drives this file against the real HTTP API.
import { decode, encode } from "@msgpack/msgpack";

const MSGPACK = "application/msgpack";

// The typed array each wire dtype becomes, and its size in bytes on the wire.
// float16 becomes Float32Array (Node 20 has no Float16Array).
const DTYPES = {
  "<f8": [Float64Array, 8],
  "<f4": [Float32Array, 4],
  "<f2": [Float32Array, 2],
  "|i1": [Int8Array, 1],
  "|u1": [Uint8Array, 1],
};

function halfToFloat(h) {
  const sign = h & 0x8000 ? -1 : 1;
  const exponent = (h >> 10) & 0x1f;
  const fraction = h & 0x3ff;
  if (exponent === 0) return sign * 2 ** -14 * (fraction / 1024);
  if (exponent === 0x1f) return fraction ? NaN : sign * Infinity;
  return sign * 2 ** (exponent - 15) * (1 + fraction / 1024);
}

// The rows of a portable reply: one typed array per input text.
export function embeddingRows(reply) {
  const { embeddings: bytes, shape, dtype } = reply;
  const entry = DTYPES[dtype];
  if (!entry) throw new Error(`unknown dtype ${dtype}`);
  const [ArrayType, size] = entry;
  const count = shape.reduce((a, b) => a * b, 1);
  if (bytes.byteLength !== count * size) {
    throw new Error(`${bytes.byteLength} bytes do not hold shape ${shape} of ${dtype}`);
  }
  // read through a DataView: the bytes sit at any offset in the reply, and are
  // little-endian whatever the host's byte order
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const values = new ArrayType(count);
  for (let i = 0; i < count; i++) {
    const at = i * size;
    values[i] = dtype === "<f8" ? view.getFloat64(at, true)
      : dtype === "<f4" ? view.getFloat32(at, true)
      : dtype === "<f2" ? halfToFloat(view.getUint16(at, true))
      : dtype === "|i1" ? view.getInt8(at)
      : view.getUint8(at);
  }
  const width = shape.length > 1 ? shape[1] : count;
  return Array.from({ length: shape[0] ?? 1 }, (_, r) => values.subarray(r * width, (r + 1) * width));
}

// POST /embed; options are the request body's (model, dtype, dimensions, normalize, ...).
// Returns { model, rows, shape, dtype, usage }.
export async function embed(baseUrl, texts, options = {}, apiKey = undefined) {
  const headers = { "content-type": MSGPACK, accept: `${MSGPACK}; layout=portable` };
  if (apiKey) headers.authorization = `Bearer ${apiKey}`;
  const response = await fetch(`${baseUrl}/embed`, {
    method: "POST", headers, body: encode({ texts, ...options }, { ignoreUndefined: true }),
  });
  if (!response.ok) {  // errors are JSON on every route
    const { error } = await response.json();
    throw new Error(`${response.status} ${error.code}: ${error.message}`);
  }
  const reply = decode(new Uint8Array(await response.arrayBuffer()));
  return { model: reply.model, rows: embeddingRows(reply), shape: reply.shape,
           dtype: reply.dtype, usage: reply.usage };
}

// POST /rerank with a msgpack reply (rerank replies hold no arrays: every layout is portable).
export async function rerank(baseUrl, query, documents, options = {}, apiKey = undefined) {
  const headers = { "content-type": MSGPACK, accept: MSGPACK };
  if (apiKey) headers.authorization = `Bearer ${apiKey}`;
  const response = await fetch(`${baseUrl}/rerank`, {
    method: "POST", headers,
    body: encode({ query, documents, ...options }, { ignoreUndefined: true }),
  });
  if (!response.ok) {
    const { error } = await response.json();
    throw new Error(`${response.status} ${error.code}: ${error.message}`);
  }
  return decode(new Uint8Array(await response.arrayBuffer()));
}

export { decode };

if (typeof process !== "undefined" && import.meta.url === `file://${process.argv[1]}`) {
  const [baseUrl = "http://127.0.0.1:8000", ...texts] = process.argv.slice(2);
  const reply = await embed(baseUrl, texts.length ? texts : ["hello world"]);
  console.log(reply.model, reply.shape, reply.dtype, reply.usage, reply.rows[0].slice(0, 4));
}
