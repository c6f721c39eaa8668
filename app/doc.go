// Package app is everything Hopper knows about the app behind it: how to
// call it, whether it is up, how much it can take, and whether it takes
// Hopper's credentials. The delivery loop (proxy) hands it a message and
// gets back a retry.Outcome; what then becomes of the message is
// retry.Decide's, and its settling the loop's. Nothing here decides a
// message's fate or talks to the broker.
//
// One app stands behind every queue a sidecar consumes, so one app side
// serves them all. It is a chain of Deliverers, each a decorator of the
// next, outermost first:
//
//	Pacer     per queue, with several queues: slows down a queue whose
//	          messages keep failing while another queue's succeed
//	Refusal   the app refusing Hopper's credentials (401 by default):
//	          pauses every queue, probes with real deliveries
//	Breaker   the app down: refuses at once, pauses every queue, probes
//	          with the health check; beside it the crash detector says
//	          whether a cut request killed the app, and isolates suspects
//	Limiter   how much the app can take: an adaptive concurrency limit
//	          shared fairly by the queues
//	Client    the request: body, Hopper's headers, token and signatures
//	          (Auth), TLS, trace context; and the classification of what
//	          came back into an outcome
//
// The room exists to keep two questions apart that look alike from the
// outside: is the app failing, or is this message? A refused connection,
// a failing health check, a crash are the app's: the message spends no
// attempt and consuming pauses, so messages wait in the queue instead of
// cycling through Hopper to the DLQ. A 5xx, a timeout, a request cut
// while the app stays healthy are the message's: it takes its retry tier.
// Every decorator reads an outcome the same way (assess: a success, an
// answer, a failed message, overload), and each acts on its own part of
// it.
//
// The consumers the breaker and the refusal pause belong to the broker
// package; this one sees them only as a Gate. Time comes from a Clock, so
// tests move it instead of sleeping.
package app
