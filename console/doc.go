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
package console
