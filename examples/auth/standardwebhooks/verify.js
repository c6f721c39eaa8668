// Check the Standard Webhooks headers of Hopper's requests (app.auth.standardWebhooks) in a
// Node.js app, with the specification's own library (npm standardwebhooks):
//
//   const { verify, verifyEd25519 } = require("./verify");
//   const id = verify(process.env.WEBHOOK_SECRET, req.headers, rawBody);  // throws when refused
//
// verify takes the whsec_ secret Hopper signs with; verifyEd25519 the whpk_ public key of a whsk_
// key Hopper signs with (the library checks v1 signatures only, so that one uses Node's crypto).
// Both want the raw body bytes as received, and both refuse a timestamp more than 300 s from now.
// Then remember the returned id for the window and refuse it when it comes again: that is what
// makes a request captured on its way and sent again useless.
//
// Run as a program, it is the app the Go test in ../ sends Hopper's requests to:
//
//   node verify.js serve SECRET OTHER_SECRET PUBLIC_KEY   prints "listening <port>", then for each
//                                                          request a JSON line of what each check said
//   node verify.js vector                                  prints the library's signature of the
//                                                          specification's test vector
"use strict";
const crypto = require("node:crypto");
const http = require("node:http");
const { Webhook } = require("standardwebhooks");

const TOLERANCE = 300; // seconds, as the library's own

// verify returns the webhook-id of a request whose webhook-signature holds a v1 signature by
// secret of "<id>.<timestamp>.<body>" with a timestamp within 300 s of now; else it throws. The
// library reads the body as UTF-8 text: a body that is not UTF-8 does not verify with it.
function verify(secret, headers, body) {
  new Webhook(secret).verify(body, headers, { jsonParse: false });
  return headers["webhook-id"];
}

// verifyEd25519 is verify for a v1a signature by the Ed25519 key whose public key is
// publicKey ("whpk_<base64>").
function verifyEd25519(publicKey, headers, body, now = Date.now() / 1000) {
  const id = headers["webhook-id"];
  const ts = headers["webhook-timestamp"];
  const sigs = headers["webhook-signature"];
  if (!id || !/^\d+$/.test(ts || "") || !sigs) throw new Error("Missing required headers");
  if (Math.abs(now - Number(ts)) > TOLERANCE) throw new Error("Message timestamp too old or too new");
  const key = crypto.createPublicKey({
    key: { kty: "OKP", crv: "Ed25519", x: Buffer.from(publicKey.replace(/^whpk_/, ""), "base64").toString("base64url") },
    format: "jwk",
  });
  const signed = Buffer.concat([Buffer.from(`${id}.${ts}.`), body]);
  for (const s of sigs.split(" ")) {
    const [version, sig] = s.split(",");
    if (version === "v1a" && crypto.verify(null, signed, key, Buffer.from(sig, "base64"))) return id;
  }
  throw new Error("No matching signature found");
}

module.exports = { verify, verifyEd25519, TOLERANCE };

// outcome runs one check: "ok" or the error it threw.
function outcome(check) {
  try {
    check();
    return "ok";
  } catch (e) {
    return String(e.message || e);
  }
}

function serve(secret, otherSecret, publicKey) {
  const server = http.createServer((req, res) => {
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", () => {
      const body = Buffer.concat(chunks);
      const h = req.headers;
      const changedId = { ...h, "webhook-id": `${h["webhook-id"]}x` };
      const result = {
        id: h["webhook-id"] || null,
        timestamp: h["webhook-timestamp"] || null,
        signature: h["webhook-signature"] || null,
        good: outcome(() => verify(secret, h, body)),
        otherKey: outcome(() => verify(otherSecret, h, body)),
        changedBody: outcome(() => verify(secret, h, Buffer.concat([body, Buffer.from(" ")]))),
        changedId: outcome(() => verify(secret, changedId, body)),
        ed25519: outcome(() => verifyEd25519(publicKey, h, body)),
        ed25519ChangedBody: outcome(() => verifyEd25519(publicKey, h, Buffer.concat([body, Buffer.from(" ")]))),
        ed25519ChangedId: outcome(() => verifyEd25519(publicKey, changedId, body)),
      };
      process.stdout.write(`${JSON.stringify(result)}\n`);
      res.writeHead(result.good === "ok" ? 204 : 400);
      res.end();
    });
  });
  server.listen(0, "127.0.0.1", () => process.stdout.write(`listening ${server.address().port}\n`));
}

if (require.main === module) {
  const [cmd, ...args] = process.argv.slice(2);
  if (cmd === "serve") {
    serve(...args);
  } else if (cmd === "vector") {
    // The test vector of the reference libraries' tests.
    const wh = new Webhook("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");
    console.log(wh.sign("msg_p5jXN8AQM9LWM0D4loKWxJek", new Date(1614265330 * 1000), '{"test": 2432232314}'));
  } else {
    console.error("usage: node verify.js serve SECRET OTHER_SECRET PUBLIC_KEY | node verify.js vector");
    process.exit(64);
  }
}
