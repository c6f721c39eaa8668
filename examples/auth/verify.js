// Check Hopper's Hopper-Signature header in a Node.js app.
//
//   node verify.js KEY_FILE SIGNATURE < body     exit 0: genuine, 1: refused
"use strict";
const crypto = require("node:crypto");
const fs = require("node:fs");

const WINDOW = 300; // seconds: a signature older or newer than this is refused (a replay)

// verify is true when signature ("t=<unix seconds>,v1=<hex>") is key's
// HMAC-SHA256 of "<t>.<body>" and t is within WINDOW of now.
function verify(key, signature, body, now = Date.now() / 1000) {
  const f = Object.fromEntries(signature.split(",").map((p) => [p.slice(0, p.indexOf("=")), p.slice(p.indexOf("=") + 1)]));
  if (!/^\d+$/.test(f.t || "") || Math.abs(now - Number(f.t)) > WINDOW) return false;
  const want = crypto.createHmac("sha256", key).update(f.t + ".").update(body).digest();
  const got = Buffer.from(f.v1 || "", "hex");
  return got.length === want.length && crypto.timingSafeEqual(got, want);
}

module.exports = { verify, WINDOW };

if (require.main === module) {
  let key = fs.readFileSync(process.argv[2]);
  while (key.length && (key[key.length - 1] === 0x0a || key[key.length - 1] === 0x0d)) key = key.subarray(0, -1);
  if (!verify(key, process.argv[3], fs.readFileSync(0))) {
    console.error(`refused: bad signature or outside the ${WINDOW} s window`);
    process.exit(1);
  }
}
