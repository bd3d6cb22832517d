//! NOOP and the test opcodes (PROTOCOL section 6).

use std::vec::Vec;

use crate::protocol::port::Packet;
use crate::server::error::ServerError;
use crate::server::request::Request;

/// NOOP: C send(any). S recv.
pub(crate) async fn noop(mut req: Request) -> Result<(), ServerError> {
    req.recv(|_, _| {}).await
}

/// TEST_INCREMENT: C send buf[0] = x; S send buf[0] = x + 1.
pub(crate) fn increment(_lane: u32, p: Packet<'_>) {
    p.set_word(0, p.word(0).wrapping_add(1))
}

/// TEST_STREAM: C send_n(data); S recv_n then send_n the same bytes back.
pub(crate) async fn stream(mut req: Request) -> Result<(), ServerError> {
    let data = req.recv_n().await?;
    let slices: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    req.send_n(&slices).await
}

/// TEST_INTERFACE: C send buf[0] = end_with_recv; C send buf[0] = cnt; then S: send(cnt+1),
/// recv, send(cnt+1), recv, recv, send(cnt+1), send(cnt+1), then recv if the flag was set, else
/// send(cnt+1). Exercises every send/recv adjacency.
pub(crate) async fn interface(mut req: Request) -> Result<(), ServerError> {
    let mut end_with_recv = [false; 64];
    let mut cnt = super::per_lane(&req, 0u64);
    req.recv(|l, p| end_with_recv[l as usize] = p.word(0) != 0)
        .await?;
    req.recv(|l, p| cnt[l as usize] = p.word(0)).await?;
    // The flag is per lane, but the script is per warp: the first active lane decides.
    let last_is_recv = end_with_recv[req.first_lane() as usize];
    let script = [true, false, true, false, false, true, true, !last_is_recv];
    for send in script {
        if send {
            req.send(|l, p| {
                cnt[l as usize] = cnt[l as usize].wrapping_add(1);
                p.set_word(0, cnt[l as usize]);
            })
            .await?;
        } else {
            req.recv(|l, p| cnt[l as usize] = p.word(0)).await?;
        }
    }
    Ok(())
}
