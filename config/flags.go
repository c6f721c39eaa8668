package config

// Flag is a command-line flag of a key's own. The main keys have one; any
// key can be set with --set key=value.
type Flag struct {
	// Name is the flag without its leading dashes: queue for --queue.
	Name string
	// Key is the dotted path of the key the flag sets.
	Key string
	// Usage is the flag's line in --help, without the key's path.
	Usage string
}

// Flags lists the keys with flags of their own, in the order --help shows
// them. A flag's value is parsed as the key's HOPPER_* variable would be.
func Flags() []Flag {
	return []Flag{
		{"queue", "queue.name", "work queue to consume"},
		{"app-url", "app.url", "URL the app receives messages on"},
		{"broker-url", "broker.urls", "broker URL(s), comma-separated"},
		{"prefetch", "consumer.prefetch", "AMQP prefetch, 0 = follows the concurrency limit"},
		{"workers", "consumer.workers", "most concurrent deliveries, 0 = prefetch if set, else 512"},
		{"admin-listen", "admin.listen", "admin HTTP address for /healthz and /readyz"},
		{"log-level", "log.level", "debug, info, warn or error"},
		{"log-format", "log.format", "json or text"},
	}
}
