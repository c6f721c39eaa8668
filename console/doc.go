// Package console is the web console of the DLQ tools (hopper dlq
// console): an overview of every DLQ of the config, its messages grouped
// by failure, a message view, and — when allowed — replay, export and
// purge of a group or a message.
//
// The console is a small HTTP API over the dlq package and an embedded
// page that calls it. It reads and moves messages only through the dlq
// package's runs (Browse, Replay, Export), over the same broker-backed
// sources the command-line tools use, so a group replayed from the
// console is published, confirmed and only then acked, exactly as
// `hopper dlq replay` does; messages outside the group are handed back,
// never lost. A scan reads every message once and keeps a compact index
// of failure groups (see Index); bodies are fetched when a message is
// opened.
//
// Reading a classic DLQ hands every message back in place; reading a
// quorum DLQ rotates it (each message copied to the tail, the original
// acked), which changes the DLQ and holds it for the whole pass. So the
// scan and the message view of a quorum DLQ are actions, like replay: a
// read-only console does not read it, and with actions allowed it needs
// the token. Every API call must come from the console's own page (see
// APIHeader), so that no other site's page can start one.
//
// The marks an operator puts on failure groups (ignored) are not the
// console's own: they are kept on the broker beside the DLQ (see
// Broker.Marks and dlq.MarksQueue), so a restart keeps them and every
// console of the DLQ shows the same ones. A mark is shown only once the
// broker has stored it.
package console
