//! What the array benches share: how the array under test is made, and
//! which levels a run measures.

use raid_core::array::{Array, CreateOptions};
use raid_core::layout::Level;
use raid_core::member::MemberRef;

/// The array a bench measures: `level` over `members`, chunk `chunk`.
#[allow(dead_code)] // Not every bench uses it.
pub fn array(members: Vec<MemberRef>, level: Level, chunk: u64) -> Array {
    create(members, level, chunk, None)
}

/// `array`, its data starting at `data_offset` on the members.
#[allow(dead_code)] // Not every bench uses it.
pub fn array_at(members: Vec<MemberRef>, level: Level, chunk: u64, data_offset: u64) -> Array {
    create(members, level, chunk, Some(data_offset))
}

fn create(members: Vec<MemberRef>, level: Level, chunk: u64, data_offset: Option<u64>) -> Array {
    Array::create(
        members,
        vec![],
        CreateOptions {
            name: "bench".into(),
            level,
            chunk,
            data_offset,
        },
    )
    .unwrap()
}

/// `n` simulated datacenter NVMe drives (`NvmeModel::datacenter`) of
/// `size` bytes each, named `sim:{tag}{i}`.
#[allow(dead_code)] // Not every bench uses it.
pub fn sim_drives(
    tag: &str,
    n: usize,
    size: u64,
) -> Vec<std::sync::Arc<raid_core::member::SimNvme>> {
    (0..n)
        .map(|i| {
            std::sync::Arc::new(raid_core::member::SimNvme::new(
                format!("sim:{tag}{i}"),
                size,
                raid_core::member::NvmeModel::datacenter(),
            ))
        })
        .collect()
}

/// `levels`, less those left out by BENCH_LEVEL (raid5, say: that one only).
pub fn chosen(levels: &[Level]) -> impl Iterator<Item = Level> + '_ {
    let only = std::env::var("BENCH_LEVEL").ok();
    levels
        .iter()
        .copied()
        .filter(move |l| only.as_ref().is_none_or(|o| *o == l.to_string()))
}
