package order

import "hash/fnv"

// MaxPreference bounds Preference.
const MaxPreference = 1000

// Preference is how strongly an instance (a replica of the sidecar) asks
// to deliver a partition queue, 1..MaxPreference: the consumer priority it
// subscribes to the queue with. Every replica subscribes to every
// partition; where the broker activates the single active consumer of
// highest priority (quorum queues from RabbitMQ 4.0), each partition goes
// to the replica that prefers it most. The preference is a hash of the
// pair, so no replica needs to know the others: with R replicas each
// wins about 1/R of the partitions (highest-random-weight hashing), and
// when one goes, each of its partitions moves to the replica that
// preferred it next, the others staying where they are.
func Preference(instance, queue string) int {
	h := fnv.New64a()
	h.Write([]byte(instance))
	h.Write([]byte{0})
	h.Write([]byte(queue))
	return int(h.Sum64()%MaxPreference) + 1
}
