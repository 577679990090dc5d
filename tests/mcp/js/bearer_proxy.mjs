// Forward every request to TARGET with "Authorization: Bearer TOKEN" added:
// the conformance suite has no option to send a token. Listens on PORT (any
// free port when unset) and prints it.
import http from "node:http";

const target = new URL(process.env.TARGET);
const token = process.env.TOKEN;
const server = http.createServer((request, response) => {
  const headers = { ...request.headers, host: target.host, authorization: `Bearer ${token}` };
  const upstream = http.request(
    { host: target.hostname, port: target.port, path: request.url, method: request.method, headers },
    (answer) => {
      response.writeHead(answer.statusCode, answer.headers);
      answer.pipe(response);
    },
  );
  upstream.on("error", () => response.destroy());
  request.pipe(upstream);
  response.on("close", () => upstream.destroy());
});
server.listen(Number(process.env.PORT ?? 0), "127.0.0.1", () => console.log(server.address().port));
