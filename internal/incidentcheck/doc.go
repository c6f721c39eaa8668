// Package incidentcheck runs the incident walk-through of docs/incident.md:
// it seeds a private RabbitMQ node with the DLQ the page starts from (the
// dead letters of an order service after a payment outage), runs every
// command the page shows, in order, with the hopper binary, and fails when
// one prints anything other than what the page shows. The console the page
// opens in step 2 is started too, and its failure groups read from its API.
//
// The page's figures are those of the full DLQ, 119,762 messages, which
// HOPPER_INCIDENT_FULL=1 (`make incident`) seeds: seeding and replaying
// that many takes minutes. `make check` runs a reduced DLQ instead, the same
// messages with most of the ones to replay left out, and rewrites the four
// figures of the page that count them; everything else the page shows must
// be printed as it is.
package incidentcheck
