// call_flood.js: one caller making the same unary call many times (@grpc/grpc-js), to flood a
// daemon's refusals.
//
// Usage: node call_flood.js SOCKET METHOD CALLS IN_FLIGHT [REQUEST_HEX]
//
// Dials unix://SOCKET with grpc-js's default options (one channel: one connection, one caller)
// and makes CALLS calls of METHOD ("/package.Service/Method"), IN_FLIGHT at a time, each sending
// the bytes REQUEST_HEX (default: none, an empty message) and reading the answer as bytes. Prints
// one JSON line: {"codes": {"CODE": COUNT, ...}, "seconds": S}, CODE the status code's number
// (0 for an answer). Exits 2 on bad arguments.
'use strict';

const grpc = require('@grpc/grpc-js');

const [socket, method, calls, inFlight, requestHex] = process.argv.slice(2);
const total = Number(calls);
const parallel = Number(inFlight);
if (!socket || !method || !Number.isInteger(total) || !Number.isInteger(parallel) || parallel < 1) {
  process.stderr.write('usage: node call_flood.js SOCKET METHOD CALLS IN_FLIGHT [REQUEST_HEX]\n');
  process.exit(2);
}
const request = Buffer.from(requestHex || '', 'hex');
const bytes = (buffer) => buffer;
const client = new grpc.Client(`unix://${socket}`, grpc.credentials.createInsecure());
const codes = {};
const started = process.hrtime.bigint();
let sent = 0;
let answered = 0;

function next() {
  if (sent >= total) return;
  sent += 1;
  client.makeUnaryRequest(method, bytes, bytes, request, (error) => {
    const code = error ? error.code : 0;
    codes[code] = (codes[code] || 0) + 1;
    answered += 1;
    if (answered === total) {
      const seconds = Number(process.hrtime.bigint() - started) / 1e9;
      process.stdout.write(`${JSON.stringify({ codes, seconds })}\n`);
      client.close();
    } else {
      next();
    }
  });
}

for (let i = 0; i < Math.min(parallel, total); i += 1) next();
