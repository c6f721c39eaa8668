package order

import "slices"

// Lanes keeps, per key, the items waiting behind the one being delivered,
// in arrival order. A key is busy from the Add that finds it free until the
// Done that finds nothing left behind it. Lanes is not safe for concurrent
// use; the caller serialises Add and Done.
//
// Memory is what waits: Lanes holds no more than was handed to it, and a
// key's entry is gone as soon as it is free again, so the number of keys
// kept is bounded by the items in hand (at most the consumer's prefetch).
type Lanes[T any] struct {
	busy map[string]*lane[T]
	// waiting counts the items held behind a busy key.
	waiting int
	// spare keeps emptied lanes for reuse, so a steady flow of keys does
	// not allocate one per message.
	spare []*lane[T]
}

// lane is a FIFO of the items waiting for one key.
type lane[T any] struct {
	items []T
	head  int
}

// NewLanes returns empty lanes.
func NewLanes[T any]() *Lanes[T] {
	return &Lanes[T]{busy: map[string]*lane[T]{}}
}

// Add hands over an item with key k. It reports true when k was free: the
// item is to be delivered now, and k is busy until Done(k) says it is
// free. Otherwise the item waits behind k.
func (l *Lanes[T]) Add(k string, item T) bool {
	ln, ok := l.busy[k]
	if !ok {
		if n := len(l.spare); n > 0 {
			ln, l.spare = l.spare[n-1], l.spare[:n-1]
		} else {
			ln = &lane[T]{}
		}
		l.busy[k] = ln
		return true
	}
	ln.items = append(ln.items, item)
	l.waiting++
	return false
}

// Done ends the delivery of k's current item. It returns the next item of
// k to deliver, k staying busy, or false when none waits: k is free.
func (l *Lanes[T]) Done(k string) (T, bool) {
	var zero T
	ln, ok := l.busy[k]
	if !ok {
		return zero, false
	}
	if ln.head == len(ln.items) {
		delete(l.busy, k)
		clear(ln.items)
		ln.items, ln.head = ln.items[:0], 0
		if cap(ln.items) <= maxSpareCap && len(l.spare) < maxSpare {
			l.spare = append(l.spare, ln)
		}
		return zero, false
	}
	next := ln.items[ln.head]
	ln.items[ln.head] = zero
	ln.head++
	l.waiting--
	return next, true
}

// Firsts calls f with each busy key that has items waiting behind it and
// the first of them, the one that has waited longest for that key.
func (l *Lanes[T]) Firsts(f func(k string, first T)) {
	for k, ln := range l.busy {
		if ln.head < len(ln.items) {
			f(k, ln.items[ln.head])
		}
	}
}

// Cut takes every item waiting behind k out of its line and returns them
// in arrival order. k stays busy with the item being delivered; items
// added later wait behind it as before.
func (l *Lanes[T]) Cut(k string) []T {
	ln, ok := l.busy[k]
	if !ok || ln.head == len(ln.items) {
		return nil
	}
	out := slices.Clone(ln.items[ln.head:])
	clear(ln.items)
	ln.items, ln.head = ln.items[:0], 0
	l.waiting -= len(out)
	return out
}

// maxSpareCap is the largest lane kept for reuse: the lane of a hot key
// that once held thousands is let go rather than kept for ever.
const maxSpareCap = 64

// maxSpare is the most emptied lanes kept for reuse.
const maxSpare = 1024

// Busy is the number of keys being delivered now.
func (l *Lanes[T]) Busy() int { return len(l.busy) }

// Waiting is the number of items held behind a busy key.
func (l *Lanes[T]) Waiting() int { return l.waiting }
