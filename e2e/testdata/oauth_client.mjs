// An MCP client of the official TypeScript SDK that signs in to an
// idemgate server by OAuth, as clients that discover sign-in by
// themselves do: it connects without a token, takes the 401's
// WWW-Authenticate to the Protected Resource Metadata and the
// authorization server's, runs the authorization code flow with PKCE
// (following the provider's redirects itself: the test provider's login
// approves at once), and connects again with the token. Then it calls
// create_order twice with the same arguments and prints, as one JSON
// line on stdout, both results and what the sign-in saw.
//
// Usage: node oauth_client.mjs SERVER_URL CLIENT_ID REDIRECT_URI ARGS_JSON
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { UnauthorizedError } from "@modelcontextprotocol/sdk/client/auth.js";

const [serverURL, clientID, redirectURI, argsJSON] = process.argv.slice(2);
const args = JSON.parse(argsJSON);

let verifier;
let tokens;
let authorizationURL;
const provider = {
  get redirectUrl() {
    return redirectURI;
  },
  get clientMetadata() {
    return {
      client_name: "idemgate oauth e2e",
      redirect_uris: [redirectURI],
      grant_types: ["authorization_code"],
      response_types: ["code"],
      token_endpoint_auth_method: "none",
    };
  },
  // Registered with the provider beforehand: no dynamic registration.
  clientInformation() {
    return { client_id: clientID };
  },
  tokens() {
    return tokens;
  },
  saveTokens(t) {
    tokens = t;
  },
  redirectToAuthorization(url) {
    authorizationURL = url;
  },
  saveCodeVerifier(v) {
    verifier = v;
  },
  codeVerifier() {
    return verifier;
  },
};

const client = new Client({ name: "idemgate-oauth-e2e", version: "1.0.0" });
let unauthorized = false;
try {
  await client.connect(new StreamableHTTPClientTransport(new URL(serverURL), { authProvider: provider }));
} catch (e) {
  if (!(e instanceof UnauthorizedError)) throw e;
  unauthorized = true;
}
if (!unauthorized || !authorizationURL) {
  throw new Error("the first connection was not refused for authorization");
}

// The browser's part: follow the provider's redirects to ours.
let next = authorizationURL.href;
let code;
for (let i = 0; i < 10 && !code; i++) {
  const r = await fetch(next, { redirect: "manual" });
  const loc = r.headers.get("location");
  if (!loc) throw new Error(`authorization stopped at ${next}: ${r.status} ${await r.text()}`);
  const u = new URL(loc, next);
  if (u.href.startsWith(redirectURI)) {
    if (u.searchParams.get("error")) throw new Error(`authorization refused: ${u.href}`);
    code = u.searchParams.get("code");
  }
  next = u.href;
}
if (!code) throw new Error("no authorization code after 10 redirects");

const transport = new StreamableHTTPClientTransport(new URL(serverURL), { authProvider: provider });
await transport.finishAuth(code);
await client.connect(transport);
const first = await client.callTool({ name: "create_order", arguments: args });
const second = await client.callTool({ name: "create_order", arguments: args });
await client.close();
console.log(
  JSON.stringify({
    authorization_url: authorizationURL.href,
    scope: tokens.scope ?? "",
    first,
    second,
  }),
);
