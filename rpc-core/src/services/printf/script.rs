//! The printf exchange (PROTOCOL section 7, the steps in [`super`]), every lane on its own.
//!
//! Short lines to stdout or stderr are *staged* (see `output::Output`): the exchange stages
//! its lanes' lines, yields (`Request::yield_unless_alone`: not when no other exchange is in
//! flight) so that the pass serves the other ports, and when polled again commits every line
//! staged meanwhile, its own and other exchanges', in one write, unless one of those did
//! already; then it replies. So the lines of a pass go out in one write (a group commit: one
//! syscall for a pass's lines, not one per request), in the order they were formatted, each
//! printf still returns only once its line was written, and a printf to stdout is written
//! before a later one of the same thread to stderr. Lanes of one request that print to stdout
//! and stderr (PRINTF_TO_STREAM) are written stream by stream, not interleaved in lane order
//! (C orders no two streams either).
//!
//! A lane gets -1 and no output for a bad handle, an argument buffer shorter than the format
//! needs, or `%s` strings above `Limits::printf_string_bytes` (the request's lanes together);
//! the script completes in those cases. A format, an argument buffer or a string above the
//! stream limits ends the exchange at once (see `services`).
//!
//! Output that may be long (above [`CHUNK`], by [`Format::output_bound`]) or goes to a file is
//! formatted and written on an I/O thread, so that the server thread never spends long on one
//! request.

use std::format;

use super::cache::Kept;
use super::format::{Format, CHUNK};
use super::lanes::{at, write_on_io, write_staged, Fetched, Lane, Sent};
use crate::protocol::opcode::Opcode;
use crate::server::error::{Outcome, ServerError};
use crate::server::limits::quoted;
use crate::server::recycle::{PooledVec, Streams};
use crate::server::registry::Request;
use crate::services::streams::Target;
use crate::services::{
    active, c_result, mailbox_state, recv_words, until_nul, Refusals, Touches, OVER_BUDGET,
};

/// Room for the rounds of `%s` strings of a format of up to 4 `%s`, kept without growing.
const ROUNDS: usize = 4;

/// Serves every PRINTF_TO_* opcode. A request's vectors are few whatever its lanes (printf is
/// the busiest opcode there is), each sized once and taken from the thread's pool
/// (`PooledVec`), not the allocator: the active lanes' states (a warp's single printing thread
/// costs one, not 32), the formats compiled (one per call site, each its own few vectors, or
/// copies of a kept one: `cache.rs`), and with `%s` the pointers of all the lanes, the rounds
/// that fetched them and [`Fetched`]. The work per lane is what differs between lanes: what a
/// format implies (its argument size, its pointers' offsets, its plan if plain) is found once
/// per format.
pub(crate) async fn printf(mut req: Request) -> Result<Outcome, ServerError> {
    let opcode = req.opcode();
    let packed = matches!(
        opcode,
        Opcode::PRINTF_TO_STDOUT_PACKED
            | Opcode::PRINTF_TO_STDERR_PACKED
            | Opcode::PRINTF_TO_STREAM_PACKED
    );
    // The server's state is borrowed from `req` where it is used, not held as a clone of its
    // `Arc`: a reference count is a locked instruction, and each one waits for the stores
    // before it (see `protocol::deferred`).
    let string_limit = req.context().config.limits.printf_string_bytes;
    let dialect = req.printf_dialect();
    let mut refusals = Refusals::default();

    // 1. The stream of each lane.
    let stream = matches!(
        opcode,
        Opcode::PRINTF_TO_STREAM | Opcode::PRINTF_TO_STREAM_PACKED
    );
    // With the mailbox's streams, taken only here (a reference count).
    let handles = if stream {
        Some((recv_words(&mut req).await?, mailbox_state(&req)))
    } else {
        None
    };

    // 2, 3. The formats, and the argument sizes they need.
    let texts = req.recv_n().await?;
    let services = req.context().services();
    let target = |lane: u32| -> Option<Target> {
        match (&handles, opcode) {
            (Some((words, mailbox)), _) => services.raw(mailbox, words[lane as usize][0]),
            (None, Opcode::PRINTF_TO_STDERR | Opcode::PRINTF_TO_STDERR_PACKED) => {
                Some(Target::Stderr)
            }
            (None, _) => Some(Target::Stdout),
        }
    };
    // Capacities in powers of two: few sizes of block for the thread's pool to keep.
    let active_lanes = req.mask().count_ones() as usize;
    let mut lanes: PooledVec<Lane> = PooledVec::with_capacity(active_lanes.next_power_of_two());
    // Each state a copy of one made once, then given its lane: built one by one (`Lane::new`
    // per lane), each was written on the stack field by field and then copied into the
    // vector in wider moves, which waited for those writes (a failed store forwarding) twice
    // a lane: some 300 ns a warp.
    lanes.resize(active_lanes, Lane::new(0));
    for (state, lane) in lanes.iter_mut().zip(active(&req)) {
        state.lane = lane;
    }
    // Each format with the first lane that sent it. Most requests print one: room for one,
    // grown for more.
    let mut formats: PooledVec<(usize, Format)> = PooledVec::with_capacity(1);
    for state in &mut lanes {
        let (lane, i) = (state.lane, state.lane as usize);
        if texts.refused() {
            refusals.lane(lane, OVER_BUDGET);
            continue;
        }
        let Some(target) = target(lane) else {
            let handle = handles.as_ref().map_or(0, |(w, _)| w[i][0]);
            refusals.lane(lane, format!("{handle:#x} is not a live stream handle"));
            continue;
        };
        // A lane mostly sends the format of the lane before it.
        if !matches!(formats.last(), Some(&(first, _)) if texts[first] == texts[i]) {
            formats.push((i, Kept::format(dialect, &texts[i], packed)));
        }
        state.format = Some((formats.len() - 1, target));
    }
    req.send(|lane, p| {
        let size = at(&lanes, lane)
            .and_then(|state| state.format.as_ref())
            .map_or(0, |&(format, _)| formats[format].1.args_size());
        p.set_word(0, size as u64)
    })
    .await?;

    // 4. The arguments, and the strings they point to.
    let args = req.recv_n().await?;
    // Room for every lane's `%s` pointers: one block of the pool, never grown.
    let most: usize = lanes
        .iter()
        .filter_map(|state| Some(formats[state.format.as_ref()?.0].1.string_count()))
        .sum();
    let mut pointers = PooledVec::with_capacity(most.next_power_of_two());
    for state in &mut lanes {
        let (lane, i) = (state.lane, state.lane as usize);
        let Some((format, _)) = state.format else {
            continue;
        };
        if args.refused() {
            refusals.lane(lane, OVER_BUDGET);
            state.refuse();
            continue;
        }
        let first = pointers.len();
        if let Err(why) = formats[format].1.string_pointers(&args[i], &mut pointers) {
            let text = quoted(until_nul(&texts[i]));
            refusals.lane(lane, format!("{why} for {text}"));
            state.refuse();
            continue;
        }
        state.pending = first..pointers.len();
    }

    // 5. Fetch the strings, last-first, each pointer once per lane, within the request's
    // budget. Each round's strings stay in the buffers it was received in (reused by later
    // requests once dropped); `fetched` finds a lane's string by its pointer: the round that
    // brought it. (It was a B-tree map: at L=32 its 32 inserts and their nodes showed in the
    // profile; one sorted vector is built at once.)
    let mut rounds: PooledVec<Streams> = PooledVec::with_capacity(ROUNDS);
    let mut fetched = Fetched::with_capacity(pointers.len());
    for state in &mut lanes {
        state.strings = fetched.add(pointers[state.pending.clone()].iter().copied());
    }
    let mut budget = string_limit;
    loop {
        let mut asking = false;
        for state in &mut lanes {
            state.asked = 0;
            while let Some(k) = state.pending.next_back() {
                if fetched.round(&state.strings, pointers[k]).is_none() {
                    state.asked = pointers[k];
                    asking = true;
                    break;
                }
            }
        }
        if !asking {
            break;
        }
        req.send(|lane, p| {
            p.set_word(0, 0);
            p.set_word(1, at(&lanes, lane).map_or(0, |state| state.asked));
        })
        .await?;
        let strings = req.recv_n().await?;
        for state in &mut lanes {
            let (lane, i) = (state.lane, state.lane as usize);
            if state.asked == 0 || state.format.is_none() {
                continue;
            }
            let len = strings[i].len();
            if strings.refused() {
                refusals.lane(lane, OVER_BUDGET);
                state.refuse();
                continue;
            }
            if len as u64 > budget {
                refusals.lane(
                    lane,
                    format!("its %s strings go above the request's limit of {string_limit} bytes"),
                );
                state.refuse();
                continue;
            }
            budget -= len as u64;
            state.fetched += len;
            fetched.set(&state.strings, state.asked, rounds.len());
        }
        rounds.push(strings);
    }

    // 6. Format and print in pieces, here or (if any lane prints to a file or may print
    // much) on an I/O thread; reply.
    let mut long = false;
    for state in &lanes {
        if let Some((format, _)) = state.format {
            long |= formats[format]
                .1
                .output_bound()
                .saturating_add(state.fetched)
                > CHUNK;
        }
    }
    let mut touches =
        Touches::streams(lanes.iter().filter_map(|s| s.format.as_ref().map(|p| &p.1)));
    touches.blocks |= long;
    let sent = Sent {
        args,
        fetched,
        rounds,
    };
    if touches.inline() {
        write_staged(&req, &mut lanes, &formats, &sent, &mut refusals).await;
    } else {
        // The compiled formats borrow `texts`, which the call takes: compiled again there.
        drop(formats);
        let how = (dialect, packed);
        write_on_io(&req, touches, &mut lanes, texts, sent, how, &mut refusals).await?;
    }
    req.send(|lane, p| {
        p.set_word(
            0,
            at(&lanes, lane).map_or(c_result(-1), |state| state.result),
        );
        p.set_word(1, 0);
    })
    .await?;
    refusals.finish()
}
