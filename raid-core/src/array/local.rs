//! The array as one shard holds it: each shard keeps a `LocalArray`, and
//! each request it runs holds a clone of that, not of the array's own
//! `Arc`, with the member tables the request plans on copied for that
//! shard. (The engine keeps one more for the requests its callers' threads
//! copy in place, `shard::inline`: those threads share it, as they shared
//! the array's `Arc` before.)
//!
//! Why: a request in flight holds the array and the member table its
//! I/Os go to (their devices stay open until it ends). Cloned from the
//! array's `Arc` and the shared table's, every request on every shard
//! wrote the same two counts, so each core took those cache lines from
//! the other at every request. A profile of RAID5 4 KiB writes on two
//! shards (RAM members) put three quarters of `AsyncWrite::start`'s
//! samples on those two `lock inc`s and on a load of the array's first
//! fields, which share a line with its count. A thread's own counts stay
//! on lines that thread alone writes.
//!
//! The copies follow the shared tables exactly: the one place that changes
//! a table (`member_io::Handles::put`) replaces every thread's copy before
//! it returns, so a request planned after a change sees it, as with the
//! shared table, and a thread that sleeps keeps no removed device open.

use super::member_io::MemberTable;
use super::{Array, DirectRead};
use arc_swap::ArcSwap;
use std::sync::Arc;

/// One thread's copies of the array's two member tables (`Handles::all`
/// and `Handles::reads`): the same members, in tables of the thread's own.
/// On lines of its own (as is `Inner`): every shard's are allocated one
/// after another by the thread that starts the engine, and one shard's
/// counts, written at every request, must not share a line with the
/// pointers another shard reads at every request.
#[repr(align(128))]
pub(super) struct TableCopy {
    pub(super) all: ArcSwap<MemberTable>,
    pub(super) reads: ArcSwap<MemberTable>,
}

#[repr(align(128))]
struct Inner {
    array: Arc<Array>,
    tables: Arc<TableCopy>,
}

/// The array as one shard holds it (see the module doc): derefs to the
/// array; its clones share one count, which the requests of the shard
/// holding it change (and, rarely, one that ends on another thread).
#[derive(Clone)]
pub struct LocalArray(Arc<Inner>);

impl LocalArray {
    /// A handle on `array` for one shard (or one thread), with copies of
    /// its member tables that `Handles::put` keeps current: made once per
    /// holder, not per request (every one alive is one more copy for each
    /// change of membership to replace).
    pub fn new(array: &Arc<Array>) -> LocalArray {
        let tables = array.handles.copy();
        LocalArray(Arc::new(Inner {
            array: array.clone(),
            tables,
        }))
    }

    /// The array's own `Arc`, for what outlives or leaves this thread.
    pub fn shared(&self) -> &Arc<Array> {
        &self.0.array
    }

    /// Every slot's member, as the data path writes them
    /// (`Array::member_handles`), from this thread's copy.
    pub(crate) fn member_handles(&self) -> Arc<MemberTable> {
        self.0.tables.all.load_full()
    }

    /// The table reads are planned on (`Array::read_handles`), from this
    /// thread's copy.
    pub(crate) fn read_handles(&self) -> Arc<MemberTable> {
        self.0.tables.reads.load_full()
    }

    /// `Array::direct_read` on this thread's copy of the reads' table.
    pub(crate) fn direct_read(&self, offset: u64, len: u64) -> Option<DirectRead> {
        self.0.array.direct_read(self.read_handles(), offset, len)
    }
}

impl AsRef<Array> for LocalArray {
    fn as_ref(&self) -> &Array {
        &self.0.array
    }
}

impl std::ops::Deref for LocalArray {
    type Target = Array;
    fn deref(&self) -> &Array {
        &self.0.array
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::array::CreateOptions;
    use crate::layout::Level;
    use crate::member::{MemberRef, RamMember};

    fn ram(name: &str) -> MemberRef {
        Arc::new(RamMember::new(format!("ram:local-{name}"), 8 << 20))
    }

    /// A shard's copies follow a change of membership before it returns:
    /// a member taken out is held by no copy once the requests that
    /// planned on it end (its device closes even where the shard sleeps),
    /// and a member put in is what the next request plans on.
    #[test]
    fn copies_follow_membership_before_it_returns() {
        let ms: Vec<MemberRef> = (0..4).map(|i| ram(&i.to_string())).collect();
        let opts = CreateOptions {
            name: "local".into(),
            level: Level::Raid5,
            chunk: 64 << 10,
            data_offset: None,
        };
        let a = Arc::new(Array::create(ms.clone(), vec![], opts).unwrap());
        let local = LocalArray::new(&a);
        let old = Arc::downgrade(&ms[1]);
        let key = ms[1].device_key();
        let in_flight = local.member_handles();
        a.fail_member(1, false).unwrap();
        assert_eq!(a.remove_member(key).unwrap(), Some(1));
        drop(ms);
        assert!(
            old.upgrade().is_some(),
            "a request in flight keeps its table"
        );
        drop(in_flight);
        assert!(
            old.upgrade().is_none(),
            "a copy kept the removed member open"
        );

        let new = ram("new");
        a.replace(1, new.clone()).unwrap();
        assert!(Arc::ptr_eq(&local.member_handles()[1], &new));
        assert!(Arc::ptr_eq(&local.read_handles()[1], &new));
        let later = LocalArray::new(&a);
        assert!(Arc::ptr_eq(&later.member_handles()[1], &new));
    }
}
