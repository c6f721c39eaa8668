// Package dlq holds the operator tools for a dead-letter queue: stats,
// peek, replay, export, import and purge, and the failure groups a DLQ's
// messages fall into (GroupOf), which a Filter can select. What a
// dead-lettered message carries, and how a replayed copy is made, is the
// msg package's header contract. The parking queues of scheduled messages
// are listed by the same means (Reparker): what waits there is not dead,
// but is read as safely.
//
// A message reaches the DLQ only through a confirmed publish followed by the
// ack of the original, so at any instant it is in the work queue,
// in the DLQ, or briefly in both — never in neither.
package dlq
