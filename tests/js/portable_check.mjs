// Driven by tests/unit/test_portable_layout.py: calls a Blitz HTTP API at argv[2] with the
// example client (examples/js/blitz.mjs, @msgpack/msgpack's default decoder, no key
// converter) and prints what it decoded as JSON on stdout.
import { decode, embed, embeddingRows, rerank } from "../../examples/js/blitz.mjs";

const baseUrl = process.argv[2];
const texts = ["a", "b c", "d e f"];
const out = { accept: {}, body: {}, numpyLayoutError: null };

async function post(path, body, accept) {
  const response = await fetch(`${baseUrl}${path}`, {
    method: "POST", headers: { "content-type": "application/json", accept },
    body: JSON.stringify(body),
  });
  return new Uint8Array(await response.arrayBuffer());
}

for (const dtype of ["float32", "float16", "int8", "uint8", "binary", "ubinary"]) {
  // selected by the Accept parameter (what embed() sends)
  const reply = await embed(baseUrl, texts, { model: "fake", dtype });
  out.accept[dtype] = { shape: reply.shape, dtype: reply.dtype,
                        rows: reply.rows.map((r) => Array.from(r)) };
  // selected by the body field, with a plain Accept
  const bytes = await post("/embed", { texts, model: "fake", dtype, layout: "portable" },
                           "application/msgpack");
  const raw = decode(bytes);
  out.body[dtype] = { shape: raw.shape, dtype: raw.dtype,
                      rows: embeddingRows(raw).map((r) => Array.from(r)) };
}

// the default layout: msgpack-numpy's bin keys, which this decoder refuses
try {
  decode(await post("/embed", { texts, model: "fake" }, "application/msgpack"));
} catch (error) {
  out.numpyLayoutError = error.message;
}

out.rerank = await rerank(baseUrl, "a", ["a", "b c", "x"], { model: "fake", top_n: 2 });
process.stdout.write(JSON.stringify(out));
