package msg

// Headers Hopper reads and writes on a message. They are AMQP application
// headers, so they survive every republish and any AMQP tool can show them.
const (
	// HeaderRetryCount counts failed attempts. It is Hopper's own counter:
	// RabbitMQ 3.13+ no longer maintains x-death for republished messages,
	// so x-death is history only.
	HeaderRetryCount = "x-retry-count"
	// HeaderRequeueCount counts 425 Too Early requeues, which are not attempts.
	HeaderRequeueCount = "x-requeue-count"
	// HeaderOriginalExchange and HeaderOriginalRoutingKey are set on the first
	// move so that the app keeps seeing where the message was first published.
	HeaderOriginalExchange   = "x-original-exchange"
	HeaderOriginalRoutingKey = "x-original-routing-key"
	HeaderOriginalQueue      = "x-original-queue"
	HeaderFirstFailureTime   = "x-first-failure-time"
	HeaderLastFailureTime    = "x-last-failure-time"
	HeaderLastStatusCode     = "x-last-status-code"
	// HeaderDeadline holds the message's absolute deadline in Unix milliseconds.
	// It is set at first receipt from the AMQP expiration and never reset.
	HeaderDeadline = "x-hopper-deadline"
	// HeaderCrashCount counts requests with this message that ended with the
	// app dying under them (the connection cut mid-request, then the health
	// check failing). A message that keeps killing the app goes to the DLQ
	// instead of keeping it in a crash loop.
	HeaderCrashCount = "x-hopper-crash-count"
	// HeaderCrashSuspect marks a message that was in flight when the app
	// died together with other requests: it is delivered again on its own,
	// so that only a message that kills the app by itself is charged.
	HeaderCrashSuspect = "x-hopper-crash-suspect"

	// HeaderDelay is the delayed-message exchange plugin's header: how many
	// milliseconds after it was published a message may be delivered. With
	// scheduling on, Hopper counts it from when it first receives the
	// message, so publishers moving off the plugin change only the exchange.
	HeaderDelay = "x-delay"
	// HeaderNotBefore is the publisher's absolute "not before" time: an
	// RFC 3339 string, or Unix milliseconds.
	HeaderNotBefore = "Hopper-Not-Before"
	// HeaderDue holds the due time Hopper settled on, in Unix
	// milliseconds, written on every copy of a scheduled message: each hop
	// through a parking queue starts again from it, and a retry or a
	// give-back neither resets nor adds to it.
	HeaderDue = "x-hopper-due"
	// HeaderParked marks a copy in (or back from) a parking queue that
	// has not reached the app since: the first delivery after it measures
	// how late the message is. Every later copy drops it.
	HeaderParked = "x-hopper-parked"

	// HeaderStream and HeaderStreamOffset name the stream a message was
	// read from and its offset there. A stream keeps its messages in
	// place, so these two say exactly which entry a retry's copy or a
	// dead letter is, and every copy carries them on.
	HeaderStream       = "x-stream"
	HeaderStreamOffset = "x-stream-offset"

	// DLQ headers: why and when the message was dead-lettered, and the last
	// failure seen.
	HeaderFinalStatusCode  = "x-final-status-code"
	HeaderFinalError       = "x-final-error"
	HeaderFinalRetryCount  = "x-final-retry-count"
	HeaderDeadLetterReason = "x-dead-letter-reason"
	HeaderDeadLetterTime   = "x-dead-letter-time"
	HeaderTraceID          = "x-trace-id"
)

// Headers of a replay out of the DLQ.
const (
	// HeaderReplayCount counts how many times a message was replayed from a
	// DLQ. Hopper carries it through retries and back into the DLQ, so a
	// replay can refuse a message that fails for ever instead of replaying
	// it for ever.
	HeaderReplayCount = "x-replay-count"
	// HeaderReplayTime is when it was last replayed (RFC 3339).
	HeaderReplayTime = "x-last-replay-time"
	// HeaderReplayedFrom names the DLQ it was last replayed from.
	HeaderReplayedFrom = "x-replayed-from"
	// HeaderReplayRun names the replay run that last replayed it. A
	// message back in the DLQ with it failed again after that replay, so
	// the DLQ tools can tell per run how many came back.
	HeaderReplayRun = "x-hopper-replay-run"
)

// Headers the broker writes. x-death holds one entry per queue and reason
// the broker dead-lettered the message from, the most recent first; the
// x-first-death-* headers describe the oldest, which for a message that went
// through a delay tier is the tier's expiry, not what brought it to the DLQ.
const (
	HeaderDeath              = "x-death"
	HeaderFirstDeathQueue    = "x-first-death-queue"
	HeaderFirstDeathReason   = "x-first-death-reason"
	HeaderFirstDeathExchange = "x-first-death-exchange"
	// HeaderDeliveryCount is set by quorum queues on a message returned to
	// them: how many of its returns count against the queue's delivery
	// limit. RabbitMQ 3.x counts every return; 4.x counts a basic.reject
	// with requeue and a return by a closed channel or connection, but
	// not a basic.nack with requeue.
	HeaderDeliveryCount = "x-delivery-count"
	// HeaderAcquiredCount is set by quorum queues on RabbitMQ 4.x: how many
	// times the message was handed out and came back, whatever the way.
	HeaderAcquiredCount = "x-acquired-count"
)
