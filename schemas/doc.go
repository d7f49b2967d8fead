// Package schemas holds the JSON Schemas of idemgate's tools and turns a
// tool call's raw arguments into a validated, fingerprinted Request.
//
// The schema files (draft 2020-12) are embedded: one per tool, named after
// it (create_order.json, …), plus result.json, the result envelope every
// tool answers with. They are what tools/list publishes, so the published
// contract and the enforced one cannot drift apart.
//
// Guarantees:
//
//   - Validation comes before any ledger claim. Prepare refuses arguments
//     that do not match the schema, and operation keys that are not a
//     canonical UUID or are placeholders (the nil UUID, copied
//     documentation examples), with a *ValidationError. Such a refusal
//     leaves no record, so the caller may fix the arguments and retry with
//     the same key. This holds for a retry of a completed operation too:
//     the schema check is not skipped when the fingerprint matches a
//     stored record. Skipping it would need the record read before
//     Prepare, a second read beside the ledger's own (a round trip on
//     PostgreSQL) on every new call, to save a check that costs less
//     than decoding the record; and two requests that differ as sent but
//     agree once defaults are applied share a fingerprint, so a match
//     does not prove the request as sent valid.
//   - Messages are written for a model to act on, one per problem, as
//     PATH: MESSAGE, for example
//     items[0].quantity: must be an integer ≥ 1 (got 0)
//     or, at the root, missing required property "currency". They never
//     echo more than 64 characters of input, and there are at most 20.
//   - Bounded work: arguments nested more than MaxDepth (32) levels deep
//     are refused before they are decoded or walked, numbers longer than
//     64 characters or beyond float64 before schema validation, and every
//     walk over arguments is linear, so Prepare's time and memory are
//     O(size of the arguments).
//   - Canonical form: RFC 8785 (JSON Canonicalization Scheme). Key order,
//     whitespace and the spelling of a number (1, 1.0, 1e0) do not matter;
//     strings are compared as given, without Unicode normalization. Its
//     definition is encoding/json followed by jcs.Transform; Canonical
//     writes the same bytes in one pass from the decoded value, and a
//     test pins the fingerprints that definition gave.
//   - Fingerprint: lowercase hex SHA-256 of the canonical form of
//     {"tool": name, "arguments": arguments}, with operation_key left out
//     and schema defaults applied first, so leaving out a defaulted
//     argument and sending its default are the same request.
//
// This binary uses ONE JSON Schema engine, github.com/santhosh-tekuri/
// jsonschema/v6, the same one mcp-go uses for its optional input
// validation, so a schema means the same thing wherever it is checked.
// Formats are asserted (a malformed uuid or date is an error). Integer
// bounds in the schemas stay below 2^53, so arguments decoded into
// float64 by an MCP library are still exact.
package schemas
