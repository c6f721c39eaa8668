// A batch handler for Hopper (consumer.batch): one POST carries many
// messages, and the answer settles each one on its own. No dependencies.
//
//   PORT=8080 node app.js
const http = require("node:http");

// handle processes one message. Its status settles it as if it had come
// alone: 2xx acks it, 422 (a 4xx) dead-letters it, a 5xx retries it.
function handle(entry) {
  const order = entry.data; // absent when the body is not JSON (then data_base64)
  if (!Number.isInteger(order?.qty) || order.qty <= 0) {
    return { id: entry.id, status: 422, error: "qty must be a positive integer" };
  }
  return { id: entry.id, status: 200 };
}

const server = http.createServer((req, res) => {
  const chunks = [];
  req.on("data", (chunk) => chunks.push(chunk));
  req.on("end", () => {
    const { entries } = JSON.parse(Buffer.concat(chunks).toString("utf8"));
    res.writeHead(200, { "Content-Type": "application/json" });
    res.end(JSON.stringify({ results: entries.map(handle) }));
  });
});

server.listen(Number(process.env.PORT ?? 8080), "127.0.0.1", () => {
  console.log(`listening on 127.0.0.1:${server.address().port}`);
});
