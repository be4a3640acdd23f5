//! What the array benches share: how the array under test is made, and
//! which levels a run measures.

use raid_core::array::{Array, CreateOptions};
use raid_core::layout::Level;
use raid_core::member::MemberRef;

/// The array a bench measures: `level` over `members`, chunk `chunk`.
pub fn array(members: Vec<MemberRef>, level: Level, chunk: u64) -> Array {
    Array::create(
        members,
        vec![],
        CreateOptions {
            name: "bench".into(),
            level,
            chunk,
            data_offset: None,
        },
    )
    .unwrap()
}

/// `levels`, less those left out by BENCH_LEVEL (raid5, say: that one only).
pub fn chosen(levels: &[Level]) -> impl Iterator<Item = Level> + '_ {
    let only = std::env::var("BENCH_LEVEL").ok();
    levels
        .iter()
        .copied()
        .filter(move |l| only.as_ref().is_none_or(|o| *o == l.to_string()))
}
