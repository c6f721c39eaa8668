// Package dlq holds the operator tools for a dead-letter queue: stats,
// peek, replay, export, import and purge, and the failure groups a DLQ's
// messages fall into (GroupOf), which a Filter can select. What a
// dead-lettered message carries, and how a replayed copy is made, is the
// msg package's header contract.
//
// A message reaches the DLQ only through a confirmed publish followed by the
// ack of the original, so at any instant it is in the work queue,
// in the DLQ, or briefly in both — never in neither.
package dlq
