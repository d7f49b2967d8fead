// Package server puts idemgate's tools on MCP: it registers every tool with
// its JSON Schemas and behaviour hints, attaches the caller's identity to
// each call, turns progress into MCP notifications and every answer into a
// tool result (isError for anything the model must act on, never a
// JSON-RPC error), and serves the transports: stdio (one process, one
// principal) and Streamable HTTP (bearer tokens → identities, /healthz,
// Prometheus /metrics).
package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"regexp"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"

	"idemgate/ledger"
	"idemgate/schemas"
	"idemgate/tools"
)

// Version is the server version reported to clients.
const Version = "0.1.0"

// Identity is who a stdio server acts for: one process, one principal.
type Identity struct {
	Principal string
	Tenant    string
	Role      string // agent, approver
	// OnBehalfOf and Model are the user the agent acts for and its model,
	// as the operator configured them (token, serve flags); recorded in the
	// audit log, optional.
	OnBehalfOf string
	Model      string
	// Client and Issuer are, for an OAuth access token, the client it
	// was issued to (azp or client_id) and its issuer; empty otherwise.
	Client string
	Issuer string
}

var namePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.@:-]{0,63}$`)

// Validate refuses identities that cannot be stored or audited safely.
func (id Identity) Validate() error {
	if !namePattern.MatchString(id.Principal) {
		return fmt.Errorf("principal %q: must be 1-64 characters of letters, digits and _.@:- starting with a letter or digit", id.Principal)
	}
	if !namePattern.MatchString(id.Tenant) {
		return fmt.Errorf("tenant %q: must be 1-64 characters of letters, digits and _.@:- starting with a letter or digit", id.Tenant)
	}
	switch id.Role {
	case "agent", "approver":
	default:
		return fmt.Errorf("role %q: must be agent or approver", id.Role)
	}
	return validateDelegation(id.OnBehalfOf, id.Model)
}

type identityKey struct{}

// WithIdentity returns ctx carrying the identity of the caller of one
// request (the HTTP transport sets it from the bearer token).
func WithIdentity(ctx context.Context, id Identity) context.Context {
	return context.WithValue(ctx, identityKey{}, id)
}

// identityOf is the request's identity, or fallback (the stdio process's
// own) when the request carries none.
func identityOf(ctx context.Context, fallback Identity) Identity {
	if id, ok := ctx.Value(identityKey{}).(Identity); ok {
		return id
	}
	return fallback
}

// New returns the MCP server for svc. Calls act for the identity their
// context carries (WithIdentity), or for id when it carries none (stdio:
// one process, one principal). metrics may be nil.
func New(svc *tools.Service, id Identity, logger *slog.Logger, metrics *Metrics) *mcpserver.MCPServer {
	out := json.RawMessage(schemas.OutputSchema())
	approverOnly := map[string]bool{}
	published := map[string]mcp.Tool{}
	for _, spec := range svc.Specs() {
		approverOnly[spec.Name] = spec.ApproverOnly
		published[spec.Name] = toolOf(spec, out)
	}
	s := mcpserver.NewMCPServer("idemgate", Version,
		mcpserver.WithToolCapabilities(false),
		// Approver tools are neither listed nor callable for other roles
		// (mcp-go refuses calls to filtered-out tools); the tools re-check.
		// Every tool passes as published (see registeredTool).
		mcpserver.WithToolFilter(func(ctx context.Context, ts []mcp.Tool) []mcp.Tool {
			approver := identityOf(ctx, id).Role == "approver"
			out := ts[:0:0]
			for _, t := range ts {
				if approverOnly[t.Name] && !approver {
					continue
				}
				if p, ok := published[t.Name]; ok {
					t = p
				}
				out = append(out, t)
			}
			return out
		}),
		mcpserver.WithRecovery(),
		mcpserver.WithInstructions("idemgate runs side effects (orders, notifications) at most once per operation_key. "+
			"For each business intent get ONE key (new_operation_key) before the first attempt and reuse it on every retry; "+
			"a timeout is not a failure — retry with the same key, or check get_operation_status. Never mint a new key to retry."),
	)
	for _, spec := range svc.Specs() {
		s.AddTool(registeredTool(published[spec.Name]), handler(s, svc, id, spec.Name, metrics))
	}
	addRequestIDHook(s)
	if tel := newRequestTelemetry(svc.Telemetry()); tel != nil {
		tel.addHooks(s)
	}
	return s
}

// toolOf is the MCP tool of spec as tools/list publishes it: its input
// schema file (compacted: tools/list publishes the same bytes either way,
// as encoding/json compacts a json.RawMessage), the shared output schema
// out, every behaviour hint set.
func toolOf(spec tools.Spec, out json.RawMessage) mcp.Tool {
	in, _ := schemas.InputSchema(spec.Name)
	if spec.InputSchema != nil {
		in = spec.InputSchema
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, in); err == nil {
		in = compact.Bytes()
	}
	t := mcp.NewToolWithRawSchema(spec.Name, spec.Description, in)
	t.RawOutputSchema = out
	t.Annotations = mcp.ToolAnnotation{
		Title:           spec.Title,
		ReadOnlyHint:    mcp.ToBoolPtr(spec.ReadOnly),
		DestructiveHint: mcp.ToBoolPtr(spec.Destructive),
		IdempotentHint:  mcp.ToBoolPtr(spec.Idempotent),
		OpenWorldHint:   mcp.ToBoolPtr(spec.OpenWorld),
	}
	return t
}

// headerlessSchema is the input schema a tool is registered with when its
// published schema binds no parameter to a header (registeredTool).
var headerlessSchema = json.RawMessage(`{"type":"object"}`)

// registeredTool is the tool t as it is kept in mcp-go's registry. Over
// Streamable HTTP mcp-go re-encodes and decodes the registered input
// schema on every tools/call of the 2026-07-28 era, to find its
// x-mcp-header bindings and check each bound parameter against its
// request header (validateStandardHeadersForMessage →
// mcp.ValidateParamHeadersLookup → mcp.ExtractParamHeaderBindings), at a
// cost in proportion to the schema's bytes: tens of microseconds for
// create_order's. A schema without any binding is therefore registered as
// {"type":"object"}, which binds none either, so that check runs and
// decides as it would on the published schema; a schema with a binding
// is registered whole, as is one whose annotations mcp-go would refuse
// (mcp.ValidateParamHeaderAnnotations), so that AddTool still refuses it.
// Nothing else of mcp-go reads a registered tool's
// input schema (input validation is off) but tools/list, and the tool
// filter in New lists and passes every tool as published (toolOf).
func registeredTool(t mcp.Tool) mcp.Tool {
	if mcp.ExtractParamHeaderBindings(&t) != nil || mcp.ValidateParamHeaderAnnotations(&t) != nil {
		return t
	}
	t.RawInputSchema = headerlessSchema
	return t
}

// handler adapts one tool of svc to mcp-go.
func handler(s *mcpserver.MCPServer, svc *tools.Service, fallback Identity, name string, metrics *Metrics) mcpserver.ToolHandlerFunc {
	return func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		started := time.Now()
		id := identityOf(ctx, fallback)
		actor := ledger.Actor{Tenant: id.Tenant, Principal: id.Principal, Role: id.Role,
			OnBehalfOf: id.OnBehalfOf, Model: id.Model, SessionID: sessionID(ctx)}
		actor.ClientName, actor.ClientVersion = clientInfo(ctx)
		// The OAuth client the token was issued to, and its issuer, which
		// the authorization server vouches for, beside the clientInfo the
		// session stated.
		actor.AuthClient, actor.AuthIssuer = id.Client, id.Issuer
		requestOf(&actor, req.Params.Meta)
		// Traced, the call runs under its request's span, and its audit
		// entries and answer name that span.
		ctx = requestSpan(ctx)
		traceID, spanID := traceOf(ctx, &actor)
		st := requestStreamOf(ctx)
		var progress tools.Progress
		if meta := req.Params.Meta; meta != nil {
			if token := meta.ProgressToken; token != nil {
				progress = func(done, total float64, msg string) {
					n := progressNotification(token, done, total, msg)
					if st == nil {
						_ = s.SendNotificationToClient(ctx, n.Method, n.Params.AdditionalFields)
						return
					}
					st.notify(ctx, n)
				}
			}
		}
		// The arguments as the client sent them, when mcp-go kept them
		// (every call read off the wire): validation reads JSON, so it
		// need not encode mcp-go's decoded map again.
		var args any = req.Params.Arguments
		if raw := req.Params.RawArguments; len(raw) > 0 {
			args = raw
		}
		if sc := screenedOf(ctx); sc != nil {
			// Refused before decoding; mcp-go read {} in their place.
			args = sc
		}
		resp := svc.Call(ctx, actor, name, args, progress)
		if st != nil {
			st.settle(ctx)
		}
		metrics.observeCall(name, resp, time.Since(started))
		r := toResult(resp)
		if traceID != "" {
			r.Meta = mcp.NewMetaFromMap(map[string]any{MetaTraceID: traceID, MetaSpanID: spanID})
		}
		return r, nil
	}
}

// clientInfo is the client's self-reported name and version: recorded for
// audit, never used for identity.
func clientInfo(ctx context.Context) (string, string) {
	if info := mcpserver.RequestProtocolInfoFromContext(ctx); info != nil && info.ClientInfo != nil {
		return clip(info.ClientInfo.Name), clip(info.ClientInfo.Version)
	}
	// An HTTP session's client, from the ledger: known on every process.
	if name, version, ok := sessionClientOf(ctx); ok {
		return clip(name), clip(version)
	}
	if cs, ok := mcpserver.ClientSessionFromContext(ctx).(mcpserver.SessionWithClientInfo); ok {
		ci := cs.GetClientInfo()
		return clip(ci.Name), clip(ci.Version)
	}
	return "", ""
}

func clip(s string) string {
	if len(s) > 64 {
		return s[:64]
	}
	return s
}

// toResult renders a response as structuredContent plus the same JSON as
// text, for clients that only read text.
func toResult(resp *tools.Response) *mcp.CallToolResult {
	b, err := resp.Encoded() // the bytes the audit digested
	if err != nil {
		b = []byte(`{"status":"unknown","replayed":false,"next_action":"wait_and_poll_status","error":{"code":"internal","message":"idemgate could not encode its answer"}}`)
		return &mcp.CallToolResult{Content: []mcp.Content{mcp.NewTextContent(string(b))}, StructuredContent: json.RawMessage(b), IsError: true}
	}
	r := mcp.NewToolResultStructured(json.RawMessage(b), string(b))
	r.IsError = resp.IsError
	return r
}

// PublishedTool is spec's tool as tools/list publishes it, as JSON (for
// `idemgate tools check`).
func PublishedTool(spec tools.Spec) ([]byte, error) {
	return json.MarshalIndent(toolOf(spec, json.RawMessage(schemas.OutputSchema())), "", "  ")
}
