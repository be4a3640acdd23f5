//! What a device already holds: `create` refuses to overwrite a filesystem,
//! a partition table or another array's metadata unless `--force`.

use raid_core::metadata::{Superblock, MAGIC, SB_OFFSETS, SB_SIZE};
use std::io::Read;
use std::path::Path;

#[derive(Debug, PartialEq)]
pub enum Content {
    /// Nothing we recognise (zeros, or unknown data).
    Nothing,
    Filesystem(&'static str),
    PartitionTable(&'static str),
    /// Our own metadata: array name and uuid.
    Array {
        name: String,
        uuid: String,
    },
    /// Our metadata's magic, but no copy this version reads (damaged, or
    /// of a later format: an array whose data starts further in, say):
    /// why. Still a device of some array, never taken as free.
    UnreadableArray(String),
}

/// Reads the first 128 KiB of `path` and names what it holds.
pub fn probe(path: &Path) -> std::io::Result<Content> {
    if crate::remote::is_remote(path) {
        let m = crate::remote::open_member(path)?;
        let mut head = vec![0u8; (m.size() as usize).min(128 * 1024) & !4095];
        m.read_at(&mut head, 0)?;
        return Ok(classify(&head));
    }
    let mut f = std::fs::File::open(path)?;
    let mut head = vec![0u8; 128 * 1024];
    let mut got = 0;
    while got < head.len() {
        match f.read(&mut head[got..])? {
            0 => break,
            n => got += n,
        }
    }
    head.truncate(got);
    Ok(classify(&head))
}

pub fn classify(b: &[u8]) -> Content {
    for off in SB_OFFSETS {
        let o = off as usize;
        if b.len() >= o + SB_SIZE {
            if let Ok(sb) = Superblock::decode(&b[o..o + SB_SIZE]) {
                return Content::Array {
                    name: sb.name,
                    uuid: sb.array_uuid.to_string(),
                };
            }
        }
    }
    let at = |o: usize, sig: &[u8]| b.len() >= o + sig.len() && &b[o..o + sig.len()] == sig;
    for off in SB_OFFSETS {
        let o = off as usize;
        if at(o, &MAGIC) {
            // Whole copies that decode were taken above.
            let why = match b.get(o..o + SB_SIZE).map(Superblock::decode) {
                Some(Err(e)) => e.to_string(),
                _ => "cut short".into(),
            };
            return Content::UnreadableArray(why);
        }
    }
    if at(1080, &[0x53, 0xEF]) {
        return Content::Filesystem("ext2/3/4");
    }
    if at(0, b"XFSB") {
        return Content::Filesystem("xfs");
    }
    if at(65600, b"_BHRfS_M") {
        return Content::Filesystem("btrfs");
    }
    if at(4086, b"SWAPSPACE2") || at(4086, b"SWAP-SPACE") {
        return Content::Filesystem("swap");
    }
    if at(3, b"NTFS    ") {
        return Content::Filesystem("ntfs");
    }
    if at(82, b"FAT32   ") || at(54, b"FAT16   ") || at(54, b"FAT12   ") {
        return Content::Filesystem("vfat");
    }
    if at(512, b"EFI PART") {
        return Content::PartitionTable("gpt");
    }
    // Our own metadata also sits at 0; an MBR is a signature plus at least
    // one non-empty partition entry.
    if at(510, &[0x55, 0xAA]) && (0..4).any(|i| b[446 + i * 16 + 4] != 0) {
        return Content::PartitionTable("dos (MBR)");
    }
    Content::Nothing
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_signatures() {
        let mut b = vec![0u8; 128 * 1024];
        assert_eq!(classify(&b), Content::Nothing);
        b[1080] = 0x53;
        b[1081] = 0xEF;
        assert_eq!(classify(&b), Content::Filesystem("ext2/3/4"));
        let mut b = vec![0u8; 128 * 1024];
        b[512..520].copy_from_slice(b"EFI PART");
        assert_eq!(classify(&b), Content::PartitionTable("gpt"));
        let mut b = vec![0u8; 128 * 1024];
        b[510] = 0x55;
        b[511] = 0xAA;
        assert_eq!(
            classify(&b),
            Content::Nothing,
            "a boot signature alone is not a table"
        );
        b[446 + 4] = 0x83;
        assert_eq!(classify(&b), Content::PartitionTable("dos (MBR)"));
    }

    /// Our magic with no copy that reads (damaged, or a later format) is
    /// a device of some array, never free: create refuses it without
    /// --force, where it took it for one holding nothing.
    #[test]
    fn metadata_this_version_cannot_read_is_an_array_not_nothing() {
        for off in SB_OFFSETS {
            let mut b = vec![0u8; 128 * 1024];
            let o = off as usize;
            b[o..o + MAGIC.len()].copy_from_slice(&MAGIC);
            assert!(
                matches!(classify(&b), Content::UnreadableArray(_)),
                "magic at {off}: {:?}",
                classify(&b)
            );
        }
    }
}
