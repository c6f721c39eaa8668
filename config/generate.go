package config

// The reference of every key, docs/configuration.md, and the doc comments
// `hopper config explain` prints (docs_gen.go) are generated from this
// package's types, their doc comments and Default. `make docs` runs the
// same; a test fails while either file is stale.
//go:generate go run ../internal/confdoc/gen -root ..
