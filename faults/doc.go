// Package faults holds Hopper's fault suite: the end-to-end proof that no
// message is ever lost.
//
// The package has no code of its own; everything lives in its tests. Each
// scenario starts a real hopper binary (built once per run) as a
// subprocess against a private RabbitMQ node, with an in-process HTTP app
// the test controls, publishes N messages with unique ids and publisher
// confirms, injects faults — broker restart, hopper SIGKILL mid-flight, app
// crash and flapping, app errors of every class, a DLQ that refuses
// publishes — and finally accounts for every id: answered 2xx at least
// once, or in the dead-letter queue with a reason. Nothing else is allowed.
//
// The batch scenario is the mixed one with batch delivery on: the app
// answers each entry of a batch by that message's own script, so every id
// must end as it would have alone.
//
// The batch-hang scenario drains a backlog through batches of 32 from a
// healthy app of which one message in 80 hangs on its first attempt: each
// batch that times out sends its messages again alone, more at once than
// Hopper has connections, and the breaker must stay closed. The same
// backlog drained without batching is timed beside it.
//
// The ordered-batch scenario closes every broker connection while the
// head of an ordered batch is held in place for its retry: no message of
// the closed channel may reach the app again once Hopper consumes anew.
//
// The big-messages scenario runs hopper at its defaults inside a memory
// cgroup of a small container's size (64 and 128 MiB) against backlogs of 1
// and 8 MiB messages: every message is acked and the kernel kills nothing.
// It needs cgroup v1's memory controller and root: under CI=true it fails
// without them, elsewhere it is skipped.
//
//	go test -count=1 -v -run TestFault ./faults/      # N=1000
//	make faults                                       # N=5000, log in faults.log
//
// Environment: HOPPER_FAULTS_N (messages per scenario, default 1000),
// HOPPER_FAULTS_SEED (the seed of the app's per-message scripts, default 1),
// HOPPER_FAULTS_KEEP=1 keeps hopper's logs and configs (a failed run always does),
// HOPPER_FAULTS_TIER_RESTARTS (rounds per tier type and way down in
// TestFaultTierRestartBrokerAlone; unset, it does not run),
// HOPPER_FAULTS_BROKER_ALONE=1 runs TestFaultQuorumTierFailoverBrokerAlone
// (make faults sets both).
package faults
