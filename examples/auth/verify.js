// Check Hopper's Hopper-Signature header in a Node.js app.
//
//   node verify.js KEY_FILE SIGNATURE < body     exit 0: genuine (prints the delivery id), 1: refused
"use strict";
const crypto = require("node:crypto");
const fs = require("node:fs");

// seconds: a signature older or newer than this is refused. A request played again within it
// carries the id of the first: refuse it by remembering, for the window, the ids processed.
const WINDOW = 300;

// verify returns the delivery id when signature ("t=<unix seconds>,id=<id>,v1=<hex>,v2=<hex>")
// has v2 = key's HMAC-SHA256 of "<t>.<id>.<body>" and t is within WINDOW of now, else null.
// v1 (over "<t>.<body>" only) is not checked: it does not cover the id.
function verify(key, signature, body, now = Date.now() / 1000) {
  const f = Object.fromEntries(signature.split(",").map((p) => [p.slice(0, p.indexOf("=")), p.slice(p.indexOf("=") + 1)]));
  if (!/^\d+$/.test(f.t || "") || Math.abs(now - Number(f.t)) > WINDOW) return null;
  if (f.id === undefined || !f.v2) return null;
  const want = crypto.createHmac("sha256", key).update(`${f.t}.${f.id}.`).update(body).digest();
  const got = Buffer.from(f.v2, "hex");
  return got.length === want.length && crypto.timingSafeEqual(got, want) ? f.id : null;
}

module.exports = { verify, WINDOW };

if (require.main === module) {
  let key = fs.readFileSync(process.argv[2]);
  while (key.length && (key[key.length - 1] === 0x0a || key[key.length - 1] === 0x0d)) key = key.subarray(0, -1);
  const id = verify(key, process.argv[3], fs.readFileSync(0));
  if (id === null) {
    console.error(`refused: bad signature or outside the ${WINDOW} s window`);
    process.exit(1);
  }
  console.log(id);
}
