//! The event queue of the simulator: events in virtual time (integer nanoseconds, so that sums of
//! costs are exact), earliest first, events at the same time in the order they were scheduled.
//!
//! A simulation of 4,096 ranks of 16 threads keeps ~65,000 events scheduled (one per busy
//! thread) and pops one per chunk, so the queue is most of its time: a 4-ary min-heap of 16-byte
//! entries (time; sequence number and the event's slot packed in one word), four children in
//! one cache line, the events themselves in a slab beside it. A binary heap of the events
//! themselves (48 bytes each) spent 42 % of a 2,048-rank simulation in `pop`.

/// Virtual time in nanoseconds.
pub type Nanos = u64;

/// Bits of an entry's second word that hold the event's slot (the rest: its sequence number).
const SLOT_BITS: u32 = 24;
/// Children per heap node.
const ARITY: usize = 4;

/// One scheduled event in the heap: ordered by time, then sequence number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Entry {
    at: Nanos,
    /// Sequence number (high bits) and slot (low [`SLOT_BITS`]).
    key: u64,
}

/// Events of type `E`, earliest first; ties in scheduling order.
#[derive(Debug)]
pub struct EventQueue<E> {
    heap: Vec<Entry>,
    slots: Vec<Option<E>>,
    free: Vec<u32>,
    seq: u64,
    now: Nanos,
    popped: u64,
}

impl<E> Default for EventQueue<E> {
    fn default() -> Self {
        Self { heap: Vec::new(), slots: Vec::new(), free: Vec::new(), seq: 0, now: 0, popped: 0 }
    }
}

impl<E> EventQueue<E> {
    /// Schedules `event` at `at` (not before now: an event in the past runs now).
    pub fn push(&mut self, at: Nanos, event: E) {
        self.seq += 1;
        let slot = match self.free.pop() {
            Some(s) => {
                self.slots[s as usize] = Some(event);
                s
            }
            None => {
                self.slots.push(Some(event));
                (self.slots.len() - 1) as u32
            }
        };
        assert!(slot < 1 << SLOT_BITS, "more than 2^24 events scheduled at once");
        assert!(self.seq < 1 << (64 - SLOT_BITS), "more than 2^40 events scheduled");
        let e = Entry { at: at.max(self.now), key: (self.seq << SLOT_BITS) | u64::from(slot) };
        // Sift up.
        let mut i = self.heap.len();
        self.heap.push(e);
        while i > 0 {
            let parent = (i - 1) / ARITY;
            if self.heap[parent] <= e {
                break;
            }
            self.heap[i] = self.heap[parent];
            i = parent;
        }
        self.heap[i] = e;
    }

    /// The next event and its time, which becomes the current time.
    pub fn pop(&mut self) -> Option<(Nanos, E)> {
        let top = *self.heap.first()?;
        let last = self.heap.pop().expect("a heap with a first entry has a last");
        if !self.heap.is_empty() {
            // Sift the last entry down from the root.
            let n = self.heap.len();
            let mut i = 0;
            loop {
                let first = i * ARITY + 1;
                if first >= n {
                    break;
                }
                let end = (first + ARITY).min(n);
                let mut min = first;
                for c in first + 1..end {
                    if self.heap[c] < self.heap[min] {
                        min = c;
                    }
                }
                if last <= self.heap[min] {
                    break;
                }
                self.heap[i] = self.heap[min];
                i = min;
            }
            self.heap[i] = last;
        }
        let slot = (top.key & ((1 << SLOT_BITS) - 1)) as u32;
        let e = self.slots[slot as usize].take().expect("a scheduled event's slot holds it");
        self.free.push(slot);
        self.now = top.at;
        self.popped += 1;
        Some((top.at, e))
    }

    /// The current time: that of the last event popped.
    pub fn now(&self) -> Nanos {
        self.now
    }

    /// Events scheduled and not yet popped.
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// Whether no event is scheduled.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }

    /// Events popped so far.
    pub fn popped(&self) -> u64 {
        self.popped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_come_out_by_time_then_in_scheduling_order() {
        let mut q = EventQueue::default();
        q.push(30, "c");
        q.push(10, "a1");
        q.push(20, "b");
        q.push(10, "a2");
        let got: Vec<_> = std::iter::from_fn(|| q.pop()).collect();
        assert_eq!(got, [(10, "a1"), (10, "a2"), (20, "b"), (30, "c")]);
        assert_eq!(q.now(), 30);
        assert_eq!(q.popped(), 4);
        assert!(q.is_empty());
    }

    #[test]
    fn time_never_runs_backwards() {
        let mut q = EventQueue::default();
        q.push(100, 1);
        assert_eq!(q.pop(), Some((100, 1)));
        // Scheduled in the past: runs now, after what is already due now.
        q.push(100, 2);
        q.push(50, 3);
        assert_eq!(q.pop(), Some((100, 2)));
        assert_eq!(q.pop(), Some((100, 3)));
        assert_eq!(q.len(), 0);
    }

    #[test]
    fn many_events_come_out_as_a_sort_by_time_then_order_would_give() {
        // Pushes and pops interleaved (as a simulation does), times drawn with many ties.
        let mut q = EventQueue::default();
        let mut want = Vec::new();
        let mut got = Vec::new();
        let mut x = 12345u64;
        for i in 0..20_000u64 {
            x = crate::plan::mix(x);
            let at = q.now() + x % 50;
            q.push(at, i);
            want.push((at, i));
            if x.is_multiple_of(3) {
                got.extend(q.pop());
            }
        }
        got.extend(std::iter::from_fn(|| q.pop()));
        want.sort();
        // Popped in time order overall, ties in push order: the same as sorting, as long as
        // nothing was pushed before the time already popped (every push is at or after now).
        assert_eq!(got, want);
    }
}
