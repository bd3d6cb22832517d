//! NOOP and the test opcodes (PROTOCOL section 6).

use std::vec::Vec;

use crate::registry::Request;
use crate::Result;

/// NOOP: C send(any). S recv.
pub(crate) fn noop(req: &mut Request<'_, '_>) -> Result<()> {
    req.recv(|_, _| {})
}

/// TEST_INCREMENT: C send buf[0] = x; S send buf[0] = x + 1.
pub(crate) fn increment(req: &mut Request<'_, '_>) -> Result<()> {
    req.recv_and_send(|_, p| p.set_word(0, p.word(0).wrapping_add(1)))
}

/// TEST_STREAM: C send_n(data); S recv_n then send_n the same bytes back. A lane above the
/// stream bound is drained and refused, and gets 0 bytes back.
pub(crate) fn stream(req: &mut Request<'_, '_>) -> Result<()> {
    let data = super::recv_streams(req)?;
    let bound = super::context(req).config.stream_bound;
    let mut refusals = super::Refusals::default();
    for lane in super::active(req) {
        if let Err(len) = data[lane as usize] {
            refusals.too_long(lane, len, bound);
        }
    }
    let slices: Vec<&[u8]> = data
        .iter()
        .map(|d| d.as_deref().unwrap_or_default())
        .collect();
    req.send_n(&slices)?;
    refusals.finish()
}

/// TEST_INTERFACE: C send buf[0] = end_with_recv; C send buf[0] = cnt; then S: send(cnt+1),
/// recv, send(cnt+1), recv, recv, send(cnt+1), send(cnt+1), then recv if the flag was set, else
/// send(cnt+1). Exercises every send/recv adjacency.
pub(crate) fn interface(req: &mut Request<'_, '_>) -> Result<()> {
    let mut end_with_recv = [false; 64];
    let mut cnt = [0u64; 64];
    req.recv(|l, p| end_with_recv[l as usize] = p.word(0) != 0)?;
    req.recv(|l, p| cnt[l as usize] = p.word(0))?;
    let send = |req: &mut Request<'_, '_>, cnt: &mut [u64; 64]| {
        req.send(|l, p| {
            cnt[l as usize] = cnt[l as usize].wrapping_add(1);
            p.set_word(0, cnt[l as usize]);
        })
    };
    let recv = |req: &mut Request<'_, '_>, cnt: &mut [u64; 64]| {
        req.recv(|l, p| cnt[l as usize] = p.word(0))
    };
    send(req, &mut cnt)?;
    recv(req, &mut cnt)?;
    send(req, &mut cnt)?;
    recv(req, &mut cnt)?;
    recv(req, &mut cnt)?;
    send(req, &mut cnt)?;
    send(req, &mut cnt)?;
    // The flag is per lane, but the script is per warp: the first active lane decides.
    if end_with_recv[req.first_lane() as usize] {
        recv(req, &mut cnt)
    } else {
        send(req, &mut cnt)
    }
}
