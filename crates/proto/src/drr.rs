//! Deficit round-robin (Shreedhar & Varghese) across streams, with
//! fq_codel's sparse-flow rule.
//!
//! Each stream with queued items takes turns; on its turn it earns a
//! `quantum` of bytes and sends items while it has deficit to pay for them.
//! With a quantum at least as large as the largest item, every turn sends at
//! least one item and byte shares are equal over time whatever the item
//! sizes, which is what makes ten bulk streams get a tenth each.
//!
//! A stream that *becomes* active (its queue was empty) joins a "new" list
//! that is served before the round of busy streams, for one quantum. Bulk
//! streams are never empty, so they never benefit; an interactive stream
//! sending a small request after a pause goes out next instead of waiting a
//! whole round behind every bulk stream's quantum.

use std::collections::VecDeque;

/// Anything with a length in bytes.
pub trait HasLen {
    fn size(&self) -> usize;
}

impl HasLen for bytes::Bytes {
    fn size(&self) -> usize {
        self.len()
    }
}

#[derive(Debug)]
struct Flow<T> {
    items: VecDeque<T>,
    bytes: usize,
    deficit: usize,
}

/// Per-stream queues served in deficit round-robin order.
#[derive(Debug)]
pub struct Drr<T> {
    flows: crate::StreamMap<Flow<T>>,
    /// Streams that just became active: served first, one quantum each.
    new: VecDeque<u32>,
    /// The round of busy streams.
    old: VecDeque<u32>,
    quantum: usize,
    total_bytes: usize,
    /// Emptied queues kept for the next stream that becomes active, so an
    /// interactive stream does not allocate one per message; at most
    /// [`SPARE_QUEUES`], of at most [`SPARE_CAPACITY`] items each.
    spare: Vec<VecDeque<T>>,
}

const SPARE_QUEUES: usize = 4;
const SPARE_CAPACITY: usize = 4;

impl<T: HasLen> Drr<T> {
    pub fn new(quantum: usize) -> Drr<T> {
        Drr {
            flows: Default::default(),
            new: VecDeque::new(),
            old: VecDeque::new(),
            quantum: quantum.max(1),
            total_bytes: 0,
            spare: Vec::new(),
        }
    }

    /// Queues `item` at the back of stream `id`'s queue.
    pub fn push(&mut self, id: u32, item: T) {
        let size = item.size();
        let quantum = self.quantum;
        let spare = &mut self.spare;
        let flow = self.flows.entry(id).or_insert_with(|| Flow {
            items: spare.pop().unwrap_or_default(),
            bytes: 0,
            deficit: 0,
        });
        if flow.items.is_empty() {
            flow.deficit = quantum;
            self.new.push_back(id);
        }
        flow.items.push_back(item);
        flow.bytes += size;
        self.total_bytes += size;
    }

    /// Bytes queued for stream `id`.
    pub fn queued(&self, id: u32) -> usize {
        self.flows.get(&id).map_or(0, |f| f.bytes)
    }

    /// Bytes queued across all streams.
    pub fn total_queued(&self) -> usize {
        self.total_bytes
    }

    pub fn is_empty(&self) -> bool {
        self.new.is_empty() && self.old.is_empty()
    }

    /// Whether a stream that just became active waits (it goes out next).
    pub fn has_new(&self) -> bool {
        !self.new.is_empty()
    }

    /// Forgets stream `id`'s emptied queue, keeping its buffer if small.
    fn retire(&mut self, id: u32) {
        if let Some(flow) = self.flows.remove(&id) {
            let items = flow.items;
            if items.is_empty()
                && items.capacity() <= SPARE_CAPACITY
                && self.spare.len() < SPARE_QUEUES
            {
                self.spare.push(items);
            }
        }
    }

    /// Drops everything queued for stream `id`.
    pub fn remove(&mut self, id: u32) {
        if let Some(flow) = self.flows.remove(&id) {
            self.total_bytes -= flow.bytes;
            self.new.retain(|&a| a != id);
            self.old.retain(|&a| a != id);
        }
    }

    /// The next item to send, and its stream.
    pub fn pop(&mut self) -> Option<(u32, T)> {
        self.pop_from(false, |_| true)
    }

    /// The next item of a newly active stream only (the ones that may jump
    /// ahead of bulk data already handed to the carrier).
    pub fn pop_new(&mut self) -> Option<(u32, T)> {
        self.pop_from(true, |_| true)
    }

    /// Like [`Drr::pop_new`], but only if `ok` accepts the very item that
    /// would be taken; otherwise nothing is taken.
    pub fn pop_new_if(&mut self, ok: impl Fn(&T) -> bool) -> Option<(u32, T)> {
        self.pop_from(true, ok)
    }

    fn pop_from(&mut self, only_new: bool, ok: impl Fn(&T) -> bool) -> Option<(u32, T)> {
        loop {
            let (from_new, id) = match self.new.front() {
                Some(&id) => (true, id),
                None if only_new => return None,
                None => (false, *self.old.front()?),
            };
            let list = if from_new {
                &mut self.new
            } else {
                &mut self.old
            };
            let Some(flow) = self.flows.get_mut(&id) else {
                // Cannot happen (listed ids always have a flow); recover anyway.
                list.pop_front();
                continue;
            };
            let Some(head) = flow.items.front() else {
                list.pop_front();
                self.retire(id);
                continue;
            };
            let size = head.size();
            if size <= flow.deficit {
                if !ok(head) {
                    return None;
                }
                flow.deficit -= size;
                flow.bytes -= size;
                self.total_bytes -= size;
                let item = flow.items.pop_front()?;
                if flow.items.is_empty() {
                    // An idle stream keeps no credit (classic DRR).
                    list.pop_front();
                    self.retire(id);
                }
                return Some((id, item));
            }
            // Turn over: earn a quantum and wait for the next round.
            flow.deficit += self.quantum;
            list.pop_front();
            self.old.push_back(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    #[derive(Debug, PartialEq)]
    struct Item(u32, usize);
    impl HasLen for Item {
        fn size(&self) -> usize {
            self.1
        }
    }

    #[test]
    fn equal_shares_with_unequal_items() {
        let mut d = Drr::new(1000);
        for _ in 0..100 {
            d.push(1, Item(1, 1000));
        }
        for _ in 0..1000 {
            d.push(2, Item(2, 100));
        }
        let mut sent = [0usize; 3];
        // Take the first 40 000 bytes and check both got about half.
        let mut total = 0;
        while total < 40_000 {
            let (id, it) = d.pop().unwrap();
            sent[id as usize] += it.1;
            total += it.1;
        }
        assert!((sent[1] as i64 - sent[2] as i64).abs() <= 1000, "{sent:?}");
    }

    #[test]
    fn fifo_within_a_stream_and_removal() {
        let mut d = Drr::new(10);
        d.push(1, Item(1, 5));
        d.push(1, Item(2, 5));
        d.push(2, Item(3, 5));
        d.remove(2);
        assert_eq!(d.pop(), Some((1, Item(1, 5))));
        assert_eq!(d.pop(), Some((1, Item(2, 5))));
        assert_eq!(d.pop(), None);
        assert_eq!(d.total_queued(), 0);
    }

    #[test]
    fn a_newly_active_stream_goes_first() {
        let mut d = Drr::new(1000);
        for i in 0..10 {
            for _ in 0..5 {
                d.push(i, Item(i, 1000));
            }
        }
        // Serve until every bulk stream has had its first quantum and joined
        // the round of busy streams.
        for _ in 0..20 {
            d.pop().unwrap();
        }
        d.push(99, Item(99, 10));
        assert_eq!(
            d.pop(),
            Some((99, Item(99, 10))),
            "the sparse stream waits for no round"
        );
    }

    #[test]
    fn pop_new_takes_only_newly_active_streams() {
        let mut d = Drr::new(1000);
        for _ in 0..3 {
            d.push(1, Item(1, 1000));
        }
        assert_eq!(d.pop_new(), Some((1, Item(1, 1000))));
        // Stream 1 spent its quantum: it is now in the round, not new.
        assert_eq!(d.pop_new(), None);
        d.push(2, Item(2, 5));
        d.push(3, Item(3, 7));
        assert_eq!(
            d.pop_new_if(|it| it.0 != 2),
            None,
            "refused item is not skipped over"
        );
        assert_eq!(d.pop_new(), Some((2, Item(2, 5))));
        assert_eq!(d.pop_new_if(|it| it.0 == 3), Some((3, Item(3, 7))));
        assert_eq!(d.pop(), Some((1, Item(1, 1000))));
    }

    proptest! {
        #[test]
        fn everything_pushed_comes_out_once_in_order(ops in proptest::collection::vec((0u32..5, 1usize..3000), 0..200)) {
            let mut d = Drr::new(2048);
            let mut expect: HashMap<u32, Vec<usize>> = HashMap::new();
            for (i, (id, size)) in ops.iter().enumerate() {
                d.push(*id, Item(i as u32, *size));
                expect.entry(*id).or_default().push(i);
            }
            let mut got: HashMap<u32, Vec<usize>> = HashMap::new();
            while let Some((id, it)) = d.pop() {
                got.entry(id).or_default().push(it.0 as usize);
            }
            prop_assert_eq!(got, expect);
            prop_assert_eq!(d.total_queued(), 0);
        }
    }
}
