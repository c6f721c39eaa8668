// Package docscheck holds the tests that keep the documentation true: every
// Hopper config shown in the README and under docs/ loads and validates,
// and every relative link and anchor resolves.
package docscheck
