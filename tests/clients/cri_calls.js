// Makes gRPC calls with Node.js @grpc/grpc-js, as a node agent would: default channel options,
// so grpc-js sends its own :authority for a unix socket (not the socket path).
//
// Usage: node cri_calls.js SOCKET PROTO_DIR < CALLS
//
// The same protocol as cri_calls.py: CALLS is a JSON array of {"method": "package.Service/Method",
// "request": {...}, "timeout_ms": N, "cancel_after_ms": N}, any unary method of
// runtime/v1/api.proto or imagemanager/v1/image_manager.proto, the request with the proto's field
// names; made in order over one channel, each awaited before the next. Prints one JSON line per
// call: {"ok": RESPONSE} (proto field names, 64-bit integers as strings, enums by name, defaults
// left out) or {"error": {"code": "NOT_FOUND", "message": "..."}}. Exits non-zero only when the
// calls cannot be made at all.
'use strict';

const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const PROTOS = ['runtime/v1/api.proto', 'imagemanager/v1/image_manager.proto'];

function fail(message) {
  process.stderr.write(`cri_calls.js: ${message}\n`);
  process.exit(2);
}

// grpc-js's numeric status codes by their canonical names.
const CODE_NAMES = Object.fromEntries(Object.entries(grpc.status).map(([name, code]) => [code, name]));

function readStdin() {
  return new Promise((resolve, reject) => {
    const chunks = [];
    process.stdin.on('data', (chunk) => chunks.push(chunk));
    process.stdin.on('end', () => resolve(Buffer.concat(chunks).toString('utf8')));
    process.stdin.on('error', reject);
  });
}

// The response as the other runners print it: a default value is left out, as protobuf JSON
// does; proto-loader's `defaults: false` leaves out fields absent on the wire only, and a runtime
// may send a default value explicitly.
function withoutDefaults(value) {
  if (Array.isArray(value)) {
    return value.length === 0 ? undefined : value.map((item) => withoutDefaults(item) ?? {});
  }
  if (value !== null && typeof value === 'object') {
    const kept = {};
    for (const [key, item] of Object.entries(value)) {
      const pruned = withoutDefaults(item);
      if (pruned !== undefined) kept[key] = pruned;
    }
    return kept;
  }
  if (value === '' || value === false || value === 0 || value === '0' || value === null) return undefined;
  return value;
}

function call(client, definition, { method, request = {}, timeout_ms: timeoutMs = 60000, cancel_after_ms: cancelAfter }) {
  return new Promise((resolve) => {
    const deadline = new Date(Date.now() + timeoutMs);
    const made = client.makeUnaryRequest(
      `/${method}`,
      definition.requestSerialize,
      definition.responseDeserialize,
      request,
      new grpc.Metadata(),
      { deadline },
      (error, response) => {
        if (error) {
          resolve({ error: { code: CODE_NAMES[error.code] || String(error.code), message: error.details || '' } });
        } else {
          resolve({ ok: withoutDefaults(response) ?? {} });
        }
      },
    );
    if (cancelAfter !== undefined) setTimeout(() => made.cancel(), cancelAfter);
  });
}

async function main() {
  if (process.argv.length !== 4) fail('usage: node cri_calls.js SOCKET PROTO_DIR < CALLS');
  const [socket, protoDir] = process.argv.slice(2);
  let calls;
  try {
    calls = JSON.parse(await readStdin());
  } catch (error) {
    fail(`the calls are not JSON: ${error.message}`);
  }
  if (!Array.isArray(calls)) fail('the calls are a JSON array');
  const packageDefinition = protoLoader.loadSync(
    PROTOS,
    { keepCase: true, longs: String, enums: String, bytes: String, defaults: false, oneofs: false, includeDirs: [protoDir] },
  );
  const methods = {};
  for (const [name, service] of Object.entries(packageDefinition)) {
    if (service.format !== undefined) continue; // a message or an enum, not a service
    for (const [method, definition] of Object.entries(service)) {
      if (!definition.requestStream && !definition.responseStream) methods[`${name}/${method}`] = definition;
    }
  }
  const client = new grpc.Client(`unix:${socket}`, grpc.credentials.createInsecure());
  for (const each of calls) {
    const definition = methods[each.method];
    if (definition === undefined) fail(`no unary method ${JSON.stringify(each.method)}`);
    process.stdout.write(`${JSON.stringify(await call(client, definition, each))}\n`);
  }
  client.close();
}

main().catch((error) => fail(error.stack || String(error)));
