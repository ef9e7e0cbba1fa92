//! Long polls waiting now, by kind: an agent's `nodes/{node}:poll`, a
//! reader of a batch's output (`output?waitFor=`), a waiter on an
//! operation (gRPC `WaitOperation`). Counted per engine and read
//! at scrape time (`flexq_long_polls{kind}`), so each server — and each
//! test server of one process — reports its own.
//!
//! A long poll counts once it has read and found nothing to answer yet,
//! until it answers or its caller goes away: a waiter counted is one that
//! the next change wakes.

use std::sync::atomic::{AtomicUsize, Ordering};

/// What a long poll waits for.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Kind {
    Assignments,
    Output,
    Operation,
}

impl Kind {
    const ALL: [Kind; 3] = [Kind::Assignments, Kind::Output, Kind::Operation];

    fn label(self) -> &'static str {
        match self {
            Kind::Assignments => "assignments",
            Kind::Output => "output",
            Kind::Operation => "operation",
        }
    }
}

/// Long polls waiting now, by [`Kind`].
#[derive(Debug, Default)]
pub(crate) struct LongPolls([AtomicUsize; 3]);

impl LongPolls {
    /// Counts a long poll of `kind` until the guard is dropped (it
    /// answered, or its request's future was dropped).
    pub(crate) fn waiting(&self, kind: Kind) -> Waiting<'_> {
        let n = &self.0[kind as usize];
        n.fetch_add(1, Ordering::SeqCst);
        Waiting(n)
    }

    /// Each kind and its long polls waiting now.
    pub(crate) fn now(&self) -> Vec<(&'static str, usize)> {
        Kind::ALL
            .iter()
            .map(|k| (k.label(), self.0[*k as usize].load(Ordering::SeqCst)))
            .collect()
    }
}

/// One long poll counted while it waits.
pub(crate) struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_waiter_counts_until_dropped() {
        let polls = LongPolls::default();
        let a = polls.waiting(Kind::Output);
        let b = polls.waiting(Kind::Operation);
        let c = polls.waiting(Kind::Output);
        assert_eq!(
            polls.now(),
            [("assignments", 0), ("output", 2), ("operation", 1)]
        );
        drop((a, b));
        assert_eq!(
            polls.now(),
            [("assignments", 0), ("output", 1), ("operation", 0)]
        );
        drop(c);
        assert!(polls.now().iter().all(|(_, n)| *n == 0));
    }
}
