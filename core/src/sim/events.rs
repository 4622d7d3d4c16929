//! The event queue of the simulator: events in virtual time (integer nanoseconds, so that sums of
//! costs are exact), earliest first, events at the same time in the order they were scheduled.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Virtual time in nanoseconds.
pub type Nanos = u64;

/// Events of type `E`, earliest first; ties in scheduling order.
#[derive(Debug)]
pub struct EventQueue<E> {
    heap: BinaryHeap<Reverse<(Nanos, u64, Slot<E>)>>,
    seq: u64,
    now: Nanos,
    popped: u64,
}

/// An event, compared by nothing (the heap orders by time and sequence number only).
#[derive(Debug)]
struct Slot<E>(E);

impl<E> PartialEq for Slot<E> {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
impl<E> Eq for Slot<E> {}
impl<E> PartialOrd for Slot<E> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl<E> Ord for Slot<E> {
    fn cmp(&self, _: &Self) -> std::cmp::Ordering {
        std::cmp::Ordering::Equal
    }
}

impl<E> Default for EventQueue<E> {
    fn default() -> Self {
        Self { heap: BinaryHeap::new(), seq: 0, now: 0, popped: 0 }
    }
}

impl<E> EventQueue<E> {
    /// Schedules `event` at `at` (not before now: an event in the past runs now).
    pub fn push(&mut self, at: Nanos, event: E) {
        self.seq += 1;
        self.heap.push(Reverse((at.max(self.now), self.seq, Slot(event))));
    }

    /// The next event and its time, which becomes the current time.
    pub fn pop(&mut self) -> Option<(Nanos, E)> {
        let Reverse((at, _, Slot(e))) = self.heap.pop()?;
        self.now = at;
        self.popped += 1;
        Some((at, e))
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
}
