// Package pgproxy is a TCP proxy for tests that stands between a client
// (pgx) and PostgreSQL or PgBouncer and loses, on demand, either a request
// or its acknowledgement: the two halves of an ambiguous commit.
//
// The proxy forwards every byte unchanged and reads just enough of the
// PostgreSQL v3 protocol to see which statement a client executes: the
// startup packet (it answers 'N' to SSLRequest and GSSENCRequest, so the
// client goes on in plain text, and forwards a CancelRequest to the
// server), then the typed messages, each a 1-byte type and an int32
// length. A statement is executed by a simple Query ('Q') or, in the
// extended protocol, by a Bind ('B') of a statement an earlier Parse
// ('P') prepared, on this connection, perhaps many round trips before:
// pgx caches prepared statements and binds them again without a Parse.
// The proxy keeps each connection's prepared statements, so a rule sees
// the SQL text whichever way it is sent, batches included (pgx sends a
// batch as Bind/Describe/Execute for each statement, then one Sync).
//
// # Rules
//
// A test arms a [Rule]: a predicate on a statement's SQL text and a
// [Fault]. The first statement that matches, on any connection, fires it:
//
//   - [LoseAcknowledgement] forwards the statement and the rest of its round
//     trip (up to its Sync, or the Query itself), waits for the server's
//     ReadyForQuery that ends it — the server has run, and committed,
//     everything in it — and closes both connections without forwarding
//     any reply of that round trip. The client sees an error; the work is
//     done (a transaction the round trip left open rolls back).
//   - [LoseRequest] closes both connections before the statement (and
//     anything after it) reaches the server. The client sees the same error;
//     nothing of the round trip's end was run, and an open transaction
//     rolls back when the server sees its connection close.
//
// A rule fires once, or [Rule.Times] times, and [Armed.Fired] says how
// often it has, counted before the client's connection closes: once a
// client sees the fault, Fired already reports it. Everything else passes
// byte for byte.
//
// # Delay
//
// [Options.Delay] makes the proxy a network: every message arrives that
// much later in each direction, without limiting the throughput, so a
// benchmark's round trips cost what they cost between two hosts.
package pgproxy
