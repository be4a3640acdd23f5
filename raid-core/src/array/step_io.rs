//! A scrub's and a resync's reads and repair writes: a step of the array
//! read into a run's buffers, its parity recomputed in one batched call,
//! and what disagrees written back. Their errors, and the reasons they
//! fail a member, name the job that ran (`StepJob`).

use super::*;
use crate::buf::AlignedBuf;

/// The jobs that read a step of the array and repair what disagrees: their
/// errors and the reasons they fail a member name the job that ran.
#[derive(Clone, Copy)]
pub(super) enum StepJob {
    Scrub,
    /// The resync after an unclean stop.
    Resync,
}

impl StepJob {
    fn name(self) -> &'static str {
        match self {
            StepJob::Scrub => "scrub",
            StepJob::Resync => "resync",
        }
    }

    /// What the operator does next, after the error's text (`failed`: a
    /// member failed).
    fn again(self, failed: bool) -> &'static str {
        match (self, failed) {
            (StepJob::Scrub, false) => "; scrub again once the array is optimal",
            (StepJob::Scrub, true) => "; rebuild, then scrub again",
            // The regions stay marked: the resync runs again when the
            // array is next optimal (after the rebuild) or started.
            (StepJob::Resync, _) => "; the regions stay marked for the next resync",
        }
    }
}

impl Array {
    /// Reads `places` (slot, member offset) into the caller's buffers (one
    /// per place, a chunk each) for `job`; a read error fails the member
    /// and ends the job with an error (the array is no longer optimal).
    pub(super) fn scrub_read_into(
        &self,
        job: StepJob,
        places: &[(usize, u64)],
        bufs: &mut [AlignedBuf],
    ) -> Result<()> {
        let what = job.name();
        self.read_places_into(places, bufs)
            .map_err(|failure| match failure {
                ReadFailure::Changed => ArrayError::Invalid(format!(
                    "{what} stopped: the members of '{}' changed while it ran{}",
                    self.name,
                    job.again(false)
                )),
                ReadFailure::Failed(mut failed) => {
                    let (slot, m, e) = failed.remove(0);
                    self.fail_slot_if(slot, &m, &format!("read error during {what}: {e}"));
                    ArrayError::Invalid(format!(
                        "{what} stopped: a member failed ({e}){}",
                        job.again(true)
                    ))
                }
            })
    }

    /// Writes `data` at `offset` of `slot` for `job` (a repair); a write
    /// error fails the member, but a full filesystem only stops the array's
    /// writes, as a client write's does (`member_write_failed`).
    pub(super) fn scrub_write(
        &self,
        job: StepJob,
        slot: usize,
        offset: u64,
        data: &[u8],
    ) -> Result<()> {
        let handles = self.member_handles();
        self.reserve_writes(&handles, [(slot, offset, data.len() as u64)])?;
        crate::member::write_counted(handles[slot].as_ref(), data, offset).map_err(|e| {
            if crate::member::is_full(&e) {
                self.member_write_failed(slot, &handles[slot], &e);
                return self.no_space_error().expect("just recorded");
            }
            self.fail_slot(
                slot,
                &format!("write error during {} repair: {e}", job.name()),
            );
            ArrayError::Member {
                member: handles[slot].identity().into(),
                source: e,
            }
        })
    }

    /// The places (slot, member offset) of the stripes of `rows`, stripe
    /// by stripe, each in its map's order (data, P, Q): what a scrub or a
    /// resync reads of a step.
    pub(super) fn stripe_places(&self, rows: std::ops::Range<u64>) -> Vec<(usize, u64)> {
        rows.flat_map(|s| {
            let off = self.row_offset_of(s);
            self.geo
                .stripe_map(s)
                .members
                .into_iter()
                .map(move |m| (m, off))
        })
        .collect()
    }

    /// Reads the stripes of `rows` (`stripe_places`' order) into buffers
    /// from `pool`, runs `checked` (a scrub's look at the membership), and
    /// recomputes their parity in one batched engine call; then hands
    /// `work` the places, the chunks and the fresh parity (the level's
    /// parity chunks for each stripe). The buffers go back to `pool`
    /// whatever happens. A scrub's and a resync's step.
    pub(super) fn with_stripe_step<T>(
        &self,
        job: StepJob,
        rows: std::ops::Range<u64>,
        pool: &mut crate::buf::BufPool,
        checked: impl FnOnce() -> Result<()>,
        work: impl FnOnce(&[(usize, u64)], &mut [AlignedBuf], &mut [AlignedBuf]) -> Result<T>,
    ) -> Result<T> {
        let nd = self.geo.data_chunks();
        let np = self.geo.level.parity_chunks();
        let places = self.stripe_places(rows);
        // Every byte of a buffer taken from `pool` is read into, or
        // written by the parity engine, before it is looked at.
        let mut chunks = pool.take(places.len());
        let mut parity = pool.take(places.len() / (nd + np) * np);
        let r = self
            .scrub_read_into(job, &places, &mut chunks)
            .and_then(|()| checked())
            .and_then(|()| {
                let mut jobs: Vec<crate::parity::GenJob> = parity
                    .chunks_mut(np)
                    .zip(chunks.chunks(nd + np))
                    .map(|(par, st)| crate::parity::GenJob {
                        data: st[..nd].iter().map(|c| &c[..]).collect(),
                        parity: par.iter_mut().map(|b| &mut b[..]).collect(),
                    })
                    .collect();
                Ok(self.engine.gen_batch(self.kind(), &mut jobs)?)
            })
            .and_then(|()| work(&places, &mut chunks, &mut parity));
        pool.put(chunks.into_iter().chain(parity));
        r
    }
}
