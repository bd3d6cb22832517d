//! Finding pending ports: `C != S` for port i (each word normalised: non-zero counts as 1).

use crate::port::normalize;
use crate::sync::{AtomicU32, Ordering};

/// The first port at or after `from` whose client word differs from the server's.
///
/// Relaxed loads: the result is a hint that the opener re-checks under the port's lock.
pub fn next_pending(primary: &[AtomicU32], secondary: &[AtomicU32], from: u32) -> Option<u32> {
    let from = from as usize;
    let (primary, secondary) = (primary.get(from..)?, secondary.get(from..)?);
    primary
        .iter()
        .zip(secondary)
        .position(|(s, c)| {
            normalize(s.load(Ordering::Relaxed)) != normalize(c.load(Ordering::Relaxed))
        })
        .map(|k| (from + k) as u32)
}
