//! Creating an array: the checks made before anything is written, the
//! devices' earlier metadata erased, the data areas zeroed (side by side,
//! with progress), then the first metadata and journal header.

use super::*;

impl Array {
    /// Every check `create` makes before it writes anything, and the
    /// shape they give: a caller that prepares the devices first (the
    /// CLI allocates member files) runs it before, so that input refused
    /// here leaves every device as it was.
    pub fn check_create(
        members: &[MemberRef],
        spares: &[MemberRef],
        opts: &CreateOptions,
    ) -> Result<CreatePlan> {
        let mut seen = std::collections::HashMap::new();
        for m in members.iter().chain(spares) {
            if let Some(first) = seen.insert(m.device_key(), m.identity().to_string()) {
                return Err(ArrayError::Refused {
                    rule: Rule::AlreadyMember,
                    detail: if first == m.identity() {
                        format!("member {first} is listed twice: list each device once")
                    } else {
                        format!(
                            "{} and {first} are the same device ({}): list each device once",
                            m.identity(),
                            m.device_key()
                        )
                    },
                });
            }
        }
        if opts.name.is_empty() || opts.name.len() > metadata::NAME_LEN {
            return Err(ArrayError::Invalid(format!(
                "array name must be 1 to {} bytes",
                metadata::NAME_LEN
            )));
        }
        if spares.len() > metadata::MAX_SPARES {
            return Err(ArrayError::Invalid(format!(
                "at most {} spares",
                metadata::MAX_SPARES
            )));
        }
        if opts.level == Level::Raid0 && !spares.is_empty() {
            return Err(membership::refuse(
                Rule::NoRedundancy,
                membership::RAID0_SPARE.into(),
            ));
        }
        let smallest = members.iter().map(|m| m.size()).min().unwrap_or(0);
        let data_offset = match opts.data_offset {
            None => metadata::data_offset_for(opts.level, smallest),
            Some(o) if metadata::data_offset_is_valid(o) => o,
            Some(o) => {
                return Err(ArrayError::Invalid(format!(
                    "data offset {o}: it must be a whole number of MiB from {} to {}",
                    metadata::MIN_DATA_OFFSET,
                    metadata::MAX_DATA_OFFSET
                )))
            }
        };
        let usable = smallest.saturating_sub(data_offset);
        let geo = Geometry::new(opts.level, members.len(), opts.chunk, usable)?;
        for s in spares {
            if s.size() < data_offset + geo.member_size {
                return Err(ArrayError::Geometry(GeometryError::SpareTooSmall {
                    spare: s.identity().into(),
                    size: s.size(),
                    need: data_offset + geo.member_size,
                }));
            }
        }
        Ok(CreatePlan { geo, data_offset })
    }

    /// Refuses two names of one device among `devices` (by content, where
    /// device keys cannot tell: `find_aliases`). It writes each device's
    /// first block and puts it back: a caller that prepares the devices
    /// (allocates files) runs it, after `check_create`, before that.
    /// `create` runs it too.
    pub fn check_distinct_devices(devices: &[MemberRef]) -> Result<()> {
        refuse_aliases(devices)
    }

    /// Writes fresh metadata on `members` (slot order = list order) and
    /// `spares`, and returns the running array. The data areas of redundant
    /// levels are zeroed (hole-punched where possible), which makes every
    /// stripe's parity and every mirror consistent from the start without a
    /// resync.
    pub fn create(
        members: Vec<MemberRef>,
        spares: Vec<MemberRef>,
        opts: CreateOptions,
    ) -> Result<Array> {
        Array::create_with_progress(members, spares, opts, &|_, _| {})
    }

    /// `create`, calling `progress(bytes zeroed, bytes to zero)` as the
    /// data areas are zeroed: where a device cannot zero by itself (no
    /// hole punch, no write-zeroes), that is every byte written, minutes
    /// on large drives.
    pub fn create_with_progress(
        members: Vec<MemberRef>,
        spares: Vec<MemberRef>,
        opts: CreateOptions,
        progress: &(dyn Fn(u64, u64) + Sync),
    ) -> Result<Array> {
        let plan = Array::check_create(&members, &spares, &opts)?;
        let all: Vec<MemberRef> = members.iter().chain(&spares).cloned().collect();
        refuse_aliases(&all)?;
        let geo = plan.geo;
        // What the devices held goes first, durably: a create cut short
        // while it zeroes (Ctrl-C, a failing member) must not leave an
        // earlier array's metadata over data no longer its own, which
        // would start as that array and serve zeros for its data.
        for m in members.iter().chain(&spares) {
            let none = crate::buf::AlignedBuf::new(2 * metadata::SB_SIZE);
            m.write_at(&none, 0)
                .and_then(|()| m.flush())
                .map_err(|e| ArrayError::Member {
                    member: m.identity().into(),
                    source: e,
                })?;
        }
        if opts.level != Level::Raid0 {
            zero_data_areas(&members, plan.data_offset, geo.member_size, progress)?;
        }
        let slots: Vec<Slot> = members
            .into_iter()
            .map(|m| Slot::new(Some(m), Uuid::random(), SlotState::Active, 0))
            .collect();
        let array = Array::from_parts(Parts {
            geo,
            data_offset: plan.data_offset,
            name: opts.name,
            uuid: Uuid::random(),
            ctime: now_secs(),
            slots,
            meta: Meta {
                events: 0,
                settled: 0,
                clean: true,
                spares: spares.into_iter().map(|s| (Uuid::random(), s)).collect(),
                log: Vec::new(),
                last_standing: None,
            },
            bitmap: (opts.level != Level::Raid0).then(|| {
                bitmap::Bitmap::new(bitmap::region_rows_for(geo.rows()), geo.rows(), Vec::new())
            }),
        });
        array.write_metadata_strict()?;
        // Records an earlier array left on these members must never chain
        // on from this array's first header (see journal.rs).
        array.journal_init()?;
        tracing::info!(array = %array.name, level = %geo.level, members = geo.members, chunk = geo.chunk,
            capacity = geo.capacity(), "array created");
        Ok(array)
    }
}

/// Bytes a member's data area is zeroed in at a time, so that progress is
/// seen and a failure stops the others soon.
const ZERO_STEP: u64 = 256 << 20;

/// Zeroes the first `len` bytes of every member's data area, the members
/// side by side (one thread each: each drive zeroes its own, and where
/// zeros are written, they go to all drives at once), reporting the bytes
/// done over all of them after each step.
fn zero_data_areas(
    members: &[MemberRef],
    data_offset: u64,
    len: u64,
    progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<()> {
    let total = len * members.len() as u64;
    let done = AtomicU64::new(0);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let results: Vec<Result<()>> = std::thread::scope(|sc| {
        let threads: Vec<_> = members
            .iter()
            .map(|m| {
                let (done, stop) = (&done, &stop);
                let zero = move || -> Result<()> {
                    let mut at = 0;
                    while at < len && !stop.load(Ordering::Acquire) {
                        let n = (len - at).min(ZERO_STEP);
                        if let Err(e) = m.write_zeroes(data_offset + at, n) {
                            stop.store(true, Ordering::Release);
                            return Err(ArrayError::Member {
                                member: m.identity().into(),
                                source: e,
                            });
                        }
                        at += n;
                        progress(done.fetch_add(n, Ordering::AcqRel) + n, total);
                    }
                    Ok(())
                };
                std::thread::Builder::new()
                    .name("create-zeroes".into())
                    .spawn_scoped(sc, zero)
                    .map_err(|e| ArrayError::Member {
                        member: m.identity().into(),
                        source: e,
                    })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.and_then(|t| t.join().unwrap_or_else(|p| std::panic::resume_unwind(p))))
            .collect()
    });
    results.into_iter().collect()
}

/// Refuses two names of one device among `devices`, which device keys
/// cannot tell for every kind of device (one NBD export by two URIs: by
/// host name and by address, by TCP and by socket): the array would put
/// two members on one disk, each write over the other.
pub(super) fn refuse_aliases(devices: &[MemberRef]) -> Result<()> {
    match find_aliases(devices)? {
        None => Ok(()),
        Some((i, j)) => Err(ArrayError::Refused {
            rule: Rule::AlreadyMember,
            detail: format!(
                "{} and {} are the same device (what is written through one reads back through the other: one export by two URIs?): list each device once",
                devices[i].identity(),
                devices[j].identity()
            ),
        }),
    }
}

/// Two of `devices` that are one device, if any: each device's first
/// block gets a token naming it, then each is read back; a device that
/// reads another's token is that device. What the blocks held before is
/// put back (all were read before any token was written, so two names of
/// one device put back the same bytes); a block that cannot be put back
/// is an error that says so. A server that keeps its connections apart
/// (no NBD multi-conn) might hide an alias from this; it never makes one
/// up.
pub(super) fn find_aliases(devices: &[MemberRef]) -> Result<Option<(usize, usize)>> {
    const TOKEN: &[u8; 8] = b"NVRAIDPR";
    if devices.len() < 2 {
        return Ok(None);
    }
    let err = |m: &MemberRef, source: io::Error| ArrayError::Member {
        member: m.identity().into(),
        source,
    };
    let mut saved = Vec::with_capacity(devices.len());
    for m in devices {
        let mut b = crate::buf::AlignedBuf::new(metadata::SB_SIZE);
        m.read_at(&mut b, 0).map_err(|e| err(m, e))?;
        saved.push(b);
    }
    let nonce = Uuid::random();
    let mut found = Ok(None);
    let mut wrote = 0;
    for (i, m) in devices.iter().enumerate() {
        let mut b = crate::buf::AlignedBuf::new(metadata::SB_SIZE);
        b[..8].copy_from_slice(TOKEN);
        b[8..24].copy_from_slice(&nonce.0);
        b[24..32].copy_from_slice(&(i as u64).to_le_bytes());
        wrote = i + 1;
        if let Err(e) = m.write_at(&b, 0).and_then(|()| m.flush()) {
            found = Err(err(m, e));
            break;
        }
    }
    if found.is_ok() {
        for (i, m) in devices.iter().enumerate() {
            let mut b = crate::buf::AlignedBuf::new(metadata::SB_SIZE);
            if let Err(e) = m.read_at(&mut b, 0) {
                found = Err(err(m, e));
                break;
            }
            if &b[..8] != TOKEN || b[8..24] != nonce.0 {
                continue;
            }
            let j = u64::from_le_bytes(b[24..32].try_into().unwrap()) as usize;
            if j != i && j < devices.len() {
                found = Ok(Some((i, j)));
                break;
            }
        }
    }
    // Every device is put back, whatever fails on another.
    let mut lost = Vec::new();
    for (m, b) in devices[..wrote].iter().zip(&saved) {
        if let Err(e) = m.write_at(b, 0).and_then(|()| m.flush()) {
            lost.push(format!("{} ({e})", m.identity()));
        }
    }
    if !lost.is_empty() {
        return Err(ArrayError::Invalid(format!(
            "{} cannot be written back after the check for two names of one device: the first 4 KiB of each now hold a token of that check, not what they held",
            lost.join(", ")
        )));
    }
    found
}
