// cri_calls.js: the integration tests' Node.js client (@grpc/grpc-js with @grpc/proto-loader), a
// generic runner of unary and server-streaming calls; the same protocol as cri_calls.py beside it.
//
// Usage: node cri_calls.js SOCKET PROTO_DIR < CALLS
//
// Loads runtime/v1/api.proto and imagemanager/v1/image_manager.proto from PROTO_DIR with
// proto-loader and dials unix://SOCKET with grpc-js's default options, as a node agent would.
// CALLS (stdin) is a JSON array of
//   {"method": "runtime.v1.ImageService/PullImage", "request": {...}, "timeout_ms": N, "cancel_after_ms": N}
// any unary or server-streaming method of the protos' services; request uses the proto's field
// names (64-bit integers as strings, enums by name); timeout_ms is the call's deadline (default
// 60000); with cancel_after_ms the client itself cancels the call (call.cancel()) after that long
// (unary calls). Instead of request, "raw": BASE64 makes a call no proto describes: those bytes
// are the request, and the response is printed as base64; with "stream": true it is
// server-streaming. "metadata": {"key": "value"} is sent with the call. The calls are made in
// order over one channel, each awaited before the next. Prints one JSON line per call, keys sorted:
//   {"ok": RESPONSE}  or  {"error": {"code": "NOT_FOUND", "message": "..."}}
// where a server-streaming call's RESPONSE is the list of its messages (none are printed when it
// fails, as the kubelet keeps none of a failed stream).
// RESPONSE is proto-loader's object (keepCase, longs: String, enums: String, bytes: String,
// defaults: false, oneofs: false) brought to protobuf's JSON mapping as Python's json_format
// prints it: fields at their default left out even when sent, Timestamp and Duration as RFC 3339 /
// "1.5s" strings, NaN and infinities as strings. code is the status code's name, message its
// details. Exits 0 when every call was made, failed or not; 2, before any call, on bad input
// (unknown fields or enum names included) or protos that do not load.
'use strict';

const fs = require('fs');
const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
// proto-loader's own protobufjs, for the types' reflection
const protobuf = require(require.resolve('protobufjs', { paths: [require.resolve('@grpc/proto-loader')] }));

const PROTOS = ['runtime/v1/api.proto', 'imagemanager/v1/image_manager.proto'];
const KEYS = ['method', 'request', 'timeout_ms', 'cancel_after_ms', 'raw', 'stream', 'metadata'];
const asIs = (bytes) => bytes;
const CODES = Object.fromEntries(Object.entries(grpc.status).map(([name, code]) => [code, name]));

function fail(message) {
  process.stderr.write(`cri_calls.js: ${message}\n`);
  process.exit(2);
}

// Rejects what Python's json_format.ParseDict rejects and protobufjs would drop without a word: a
// field `type` does not have, an enum value name its enum does not have.
function check(type, object, where) {
  const name = type.fullName.slice(1);
  if (object === null || typeof object !== 'object' || Array.isArray(object)) {
    fail(`${where}: ${name} object expected`);
  }
  for (const [key, value] of Object.entries(object)) {
    if (!Object.hasOwn(type.fields, key)) fail(`${where}: ${name} has no field ${key}`);
    const field = type.fields[key];
    const values = value === null ? [] : field.map ? Object.values(value) : field.repeated ? [].concat(value) : [value];
    for (const each of values) {
      if (field.resolvedType instanceof protobuf.Type) check(field.resolvedType, each, `${where}.${key}`);
      const names = field.resolvedType instanceof protobuf.Enum ? field.resolvedType.values : null;
      if (names && typeof each === 'string' && !Object.hasOwn(names, each)) {
        fail(`${where}.${key}: ${field.resolvedType.fullName.slice(1)} has no value ${each}`);
      }
    }
  }
}

// protobuf's JSON for Timestamp and Duration: 0, 3, 6 or 9 fractional digits.
const fraction = (nanos) => (nanos ? `.${String(nanos).padStart(9, '0').replace(/(000)*$/, '')}` : '');
const WELL_KNOWN = {
  '.google.protobuf.Timestamp': ({ seconds = '0', nanos = 0 }) =>
    `${new Date(Number(seconds) * 1000).toISOString().slice(0, 19)}${fraction(nanos)}Z`,
  '.google.protobuf.Duration': ({ seconds = '0', nanos = 0 }) =>
    `${seconds < 0 || nanos < 0 ? '-' : ''}${Math.abs(seconds)}${fraction(Math.abs(nanos))}s`,
};

// proto-loader's object of `type` as protobuf's JSON mapping prints it (see the top).
function normalize(type, object) {
  if (WELL_KNOWN[type.fullName]) return WELL_KNOWN[type.fullName](object);
  const json = {};
  for (const [name, value] of Object.entries(object)) {
    const field = type.fields[name];
    const message = field.resolvedType instanceof protobuf.Type;
    const each = (item) => (message ? normalize(field.resolvedType, item) : item);
    if (field.map) json[name] = Object.fromEntries(Object.entries(value).map(([key, item]) => [key, each(item)]));
    else if (field.repeated) json[name] = value.map(each);
    else if (message || field.hasPresence || !isDefault(field, value)) json[name] = each(value);
  }
  return json;
}

function isDefault(field, value) {
  if (field.resolvedType instanceof protobuf.Enum) return value === 0 || field.resolvedType.values[value] === 0;
  return value === '' || value === false || value === 0 || (field.long && value === '0');
}

// JSON with sorted keys, as Python's json.dumps(sort_keys=True); NaN and infinities as strings.
function stringify(value) {
  return JSON.stringify(value, (key, item) => {
    if (typeof item === 'number' && !Number.isFinite(item)) return String(item);
    if (item === null || typeof item !== 'object' || Array.isArray(item)) return item;
    return Object.fromEntries(Object.keys(item).sort().map((name) => [name, item[name]]));
  });
}

function call(client, { path, serialize, deserialize, request, timeout, cancelAfter, printable, streaming, metadata }) {
  const sent = new grpc.Metadata();
  for (const [key, value] of Object.entries(metadata)) sent.add(key, value);
  const failed = (error) => ({ error: { code: CODES[error.code] ?? String(error.code), message: error.details ?? '' } });
  return new Promise((resolve) => {
    if (streaming) {
      const received = [];
      const made = client.makeServerStreamRequest(path, serialize, deserialize, request, sent, { deadline: Date.now() + timeout });
      made.on('data', (response) => received.push(printable(response)));
      made.on('error', (error) => resolve(failed(error)));
      made.on('end', () => resolve({ ok: received }));
      return;
    }
    let timer;
    const made = client.makeUnaryRequest(path, serialize, deserialize, request, sent, { deadline: Date.now() + timeout },
      (error, response) => {
        clearTimeout(timer);
        resolve(error ? failed(error) : { ok: printable(response) });
      });
    if (cancelAfter !== undefined) timer = setTimeout(() => made.cancel(), cancelAfter);
  });
}

// The calls of stdin, checked (see check): what `call` makes of each.
function parse(calls, root, definitions) {
  if (!Array.isArray(calls)) fail('the calls must be a JSON array');
  return calls.map((each, i) => {
    const where = `call ${i}`;
    if (each === null || typeof each !== 'object' || typeof each.method !== 'string'
      || Object.keys(each).some((key) => !KEYS.includes(key))) {
      fail(`${where}: an object with a method and only ${KEYS} expected: ${JSON.stringify(each).slice(0, 300)}`);
    }
    const metadata = each.metadata ?? {};
    if (typeof metadata !== 'object' || Array.isArray(metadata) || Object.values(metadata).some((v) => typeof v !== 'string')) {
      fail(`${where}: metadata is an object of strings`);
    }
    let shape;
    if (Object.hasOwn(each, 'raw')) {
      if (Object.hasOwn(each, 'request') || typeof each.raw !== 'string' || ![undefined, true, false].includes(each.stream)) {
        fail(`${where}: raw is base64 in place of request, stream true or false`);
      }
      shape = {
        path: `/${each.method}`, serialize: asIs, deserialize: asIs, request: Buffer.from(each.raw, 'base64'),
        printable: (bytes) => Buffer.from(bytes).toString('base64'), streaming: each.stream === true,
      };
    } else {
      if (Object.hasOwn(each, 'stream')) fail(`${where}: stream goes with raw; a proto method's shape is its own`);
      const slash = each.method.lastIndexOf('/');
      const [serviceName, methodName] = [each.method.slice(0, slash), each.method.slice(slash + 1)];
      const service = slash > 0 ? root.lookup(serviceName) : null;
      const known = service instanceof protobuf.Service && service.fullName === `.${serviceName}`
        && Object.hasOwn(service.methods, methodName);
      const method = known ? service.methods[methodName] : null;
      if (!method || method.requestStream) {
        fail(`${where}: no unary or server-streaming method '${each.method}' in ${PROTOS}`);
      }
      const definition = definitions[serviceName][methodName];
      const request = each.request ?? {};
      check(method.resolvedRequestType, request, where);
      try {
        definition.requestSerialize(request);
      } catch (error) {
        fail(`${where}: bad ${method.resolvedRequestType.fullName.slice(1)}: ${error.message}`);
      }
      shape = {
        path: definition.path, serialize: definition.requestSerialize, deserialize: definition.responseDeserialize,
        request, printable: (response) => normalize(method.resolvedResponseType, response),
        streaming: Boolean(method.responseStream),
      };
    }
    const [timeout = 60000, cancelAfter] = [each.timeout_ms ?? undefined, each.cancel_after_ms ?? undefined];
    if ([timeout, cancelAfter].some((ms) => ms !== undefined && !(typeof ms === 'number' && ms >= 0))) {
      fail(`${where}: timeout_ms and cancel_after_ms are numbers of milliseconds`);
    }
    if (shape.streaming && cancelAfter !== undefined) fail(`${where}: cancel_after_ms is for unary calls`);
    return { ...shape, timeout, cancelAfter, metadata };
  });
}

async function main() {
  if (process.argv.length !== 4) fail('usage: node cri_calls.js SOCKET PROTO_DIR < CALLS');
  const [socket, protoDir] = process.argv.slice(2);
  let input;
  try {
    input = JSON.parse(fs.readFileSync(0, 'utf8'));
  } catch (error) {
    fail(`the calls are not JSON: ${error.message}`);
  }
  let definitions;
  const root = new protobuf.Root();
  try {
    definitions = protoLoader.loadSync(PROTOS, {
      keepCase: true, longs: String, enums: String, bytes: String, defaults: false, oneofs: false,
      includeDirs: [protoDir],
    });
    root.resolvePath = (origin, target) => path.resolve(protoDir, target);
    root.loadSync(PROTOS, { keepCase: true }).resolveAll();
  } catch (error) {
    fail(`cannot load ${PROTOS} from ${protoDir}: ${error.message}`);
  }
  const calls = parse(input, root, definitions);
  const client = new grpc.Client(`unix://${path.resolve(socket)}`, grpc.credentials.createInsecure());
  for (const each of calls) process.stdout.write(`${stringify(await call(client, each))}\n`);
  client.close();
}

main().catch((error) => fail(error.stack || String(error)));
